"""Reading and validating init state: dense keys, int64 values, nothing else (contract §2)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from txstream.errors import SchemaError

if TYPE_CHECKING:
    from txstream.state.layout import NodeShare, TableSpec, TablesSpec

InitState = str | Path | dict[str, pa.Table]


def read_init_state(
    topology: TablesSpec, init: InitState, share: NodeShare | None = None
) -> dict[str, pa.Table]:
    """Init tables by name, validated and cast to int64; raises SchemaError otherwise.
    With a node's ``share``, the tables hold the node's own keys only."""
    tables = {}
    for table in topology.init_tables:
        if isinstance(init, dict):
            if table.name not in init:
                raise SchemaError(f"init state: missing table {table.name!r}")
            data, label = init[table.name], f"init state {table.name!r}"
        else:
            path = Path(init) / f"{table.name}.parquet"
            label = f"init state {path}"
            if not path.is_file():
                raise SchemaError(f"{label}: file not found")
            try:
                data = pq.ParquetFile(path).read()  # read_table's first call costs ~0.3 s more
            except Exception as exc:
                raise SchemaError(f"{label}: unreadable ({exc})") from exc
        keys = share.own_keys(table.name) if share is not None else None
        tables[table.name] = validate_init_table(table, data, label, keys)
    return tables


def validate_init_table(
    table: TableSpec, data: pa.Table, label: str, keys: np.ndarray | None = None
) -> pa.Table:
    """Check ``key`` = 0..K-1 (or the given ``keys``) plus exactly the table's value
    columns, integer, no nulls."""
    expected = {"key", *table.columns}
    if set(data.column_names) != expected:
        raise SchemaError(
            f"{label}: columns {sorted(data.column_names)}, expected {sorted(expected)}"
        )
    columns = {}
    for name in ("key", *table.columns):
        col = data.column(name)
        if not pa.types.is_integer(col.type):
            raise SchemaError(f"{label}: column {name!r} has type {col.type}, expected int64")
        if col.null_count:
            raise SchemaError(f"{label}: column {name!r} has nulls")
        columns[name] = pc.cast(col, pa.int64())  # chunk by chunk: no copy of a whole column
    if not _dense(columns["key"], keys):
        raise SchemaError(f"{label}: keys are not 0..K-1 in order (init state must be dense)")
    if table.init_min is not None:
        for name in table.columns:
            if len(data) and pc.min(columns[name]).as_py() < table.init_min:
                raise SchemaError(f"{label}: column {name!r} has values below {table.init_min}")
    return pa.table(columns)


def _dense(keys: pa.ChunkedArray, expected: np.ndarray | None) -> bool:
    """Whether ``keys`` are 0..K-1 (or ``expected``), compared a chunk at a time."""
    if expected is not None and len(keys) != len(expected):
        return False
    offset = 0
    for chunk in keys.chunks:
        got = chunk.to_numpy()
        end = offset + len(got)
        want = np.arange(offset, end) if expected is None else expected[offset:end]
        if not np.array_equal(got, want):
            return False
        offset = end
    return True
