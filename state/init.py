"""Reading and validating init state: dense or natural keys, int64 values, nothing else
(contract §2)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from txstream.errors import SchemaError
from txstream.state.keys import DENSE, INT64, STRING, KeyIndex

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
        data, label = _read(table, init)
        if data is None:
            tables[table.name] = _empty(table)
            continue
        keys = share.own_keys(table.name) if share is not None else None
        tables[table.name] = validate_init_table(table, data, label, keys)
    return tables


def _read(table: TableSpec, init: InitState) -> tuple[pa.Table | None, str]:
    """The init table of ``table`` and its label; None for a table of natural keys
    without one (it starts empty)."""
    if isinstance(init, dict):
        if table.name not in init:
            if table.key != DENSE:
                return None, ""
            raise SchemaError(f"init state: missing table {table.name!r}")
        return init[table.name], f"init state {table.name!r}"
    path = Path(init) / f"{table.name}.parquet"
    label = f"init state {path}"
    if not path.is_file():
        if table.key != DENSE:
            return None, label
        raise SchemaError(f"{label}: file not found")
    try:
        return pq.ParquetFile(path).read(), label  # read_table's first call: ~0.3 s more
    except Exception as exc:
        raise SchemaError(f"{label}: unreadable ({exc})") from exc


def _empty(table: TableSpec) -> pa.Table:
    key = pa.string() if table.key == STRING else pa.int64()
    return pa.table(
        {"key": pa.array([], key), **{c: pa.array([], pa.int64()) for c in table.columns}}
    )


def key_type_of(init: InitState, table: str) -> str | None:
    """The key type an init table's ``key`` column says (None: no such table): ``string``,
    ``dense`` for the integers 0..K-1 in order, ``int64`` for any other integers. A
    bundled topology takes its tables' key type from it."""
    if isinstance(init, dict):
        data = init.get(table)
        column = None if data is None or "key" not in data.column_names else data.column("key")
    else:
        path = Path(init) / f"{table}.parquet"
        if not path.is_file():
            return None
        try:
            column = pq.ParquetFile(path).read(columns=["key"]).column("key")
        except Exception:
            return None  # read again, and reported, with the whole table
    if column is None:
        return None
    value_type = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return STRING
    if not pa.types.is_integer(value_type) or column.null_count:
        return DENSE  # reported as a schema error of a dense table
    keys = pc.cast(column, pa.int64()).to_numpy()
    return DENSE if np.array_equal(keys, np.arange(len(keys))) else INT64


def key_indexes(
    topology: TablesSpec, init: dict[str, pa.Table], limits: dict[str, int]
) -> dict[str, KeyIndex]:
    """The key index of every table of natural keys, holding its init keys as rows
    ``0..n-1`` in the order of the init file; SchemaError for a key there twice."""
    indexes = {}
    for table in topology.tables:
        if table.key != DENSE:
            index = KeyIndex(table.name, table.key, limits[table.name])
            index.add_init(init[table.name].column("key"), f"init state {table.name!r}")
            indexes[table.name] = index
    return indexes


def validate_init_table(
    table: TableSpec, data: pa.Table, label: str, keys: np.ndarray | None = None
) -> pa.Table:
    """Check ``key`` = 0..K-1 (or the given ``keys``; any keys for a table of natural
    keys) plus exactly the table's value columns, integer, no nulls."""
    expected = {"key", *table.columns}
    if set(data.column_names) != expected:
        raise SchemaError(
            f"{label}: columns {sorted(data.column_names)}, expected {sorted(expected)}"
        )
    columns = {}
    if table.key != DENSE:
        columns["key"] = data.column("key")  # checked as its index is built (`key_indexes`)
    for name in ("key", *table.columns) if table.key == DENSE else table.columns:
        col = data.column(name)
        if not pa.types.is_integer(col.type):
            raise SchemaError(f"{label}: column {name!r} has type {col.type}, expected int64")
        if col.null_count:
            raise SchemaError(f"{label}: column {name!r} has nulls")
        columns[name] = pc.cast(col, pa.int64())  # chunk by chunk: no copy of a whole column
    if table.key == DENSE and not _dense(columns["key"], keys):
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
