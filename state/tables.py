"""The state of a run: every table's columns in one flat int64 array, plus distinct sets.

Cell ``layout.bases[(table, column)] + row`` holds ``column`` of the key in that row (the
key itself, or a node's share: `txstream.state.layout`). Distinct tables keep their
members in an open-addressing hash set of (cell, member) pairs; the cell holds the size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from txstream.state import dirty
from txstream.state.keys import LIVE, KeyIndex
from txstream.state.layout import Layout, TablesSpec
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.values import ValueType, typed_table

EMPTY = -1
"""Marks a free slot of a distinct set; a removed member becomes TOMBSTONE."""
TOMBSTONE = -2


class StateArrays(NamedTuple):
    """The state as kernels see it (one argument)."""

    values: np.ndarray
    set_cells: np.ndarray
    set_members: np.ndarray
    dirty: np.ndarray
    """Groups of ``values`` written since last taken (`txstream.state.dirty`)."""


@dataclass(frozen=True)
class StateHandle:
    """Picklable description of a run's state, for actors to attach to."""

    layout: Layout
    values: ArrayHandle
    set_cells: ArrayHandle
    set_members: ArrayHandle
    dirty: ArrayHandle


class SharedState:
    """The run's tables in shared memory (see module docstring)."""

    def __init__(self, layout: Layout, arrays: tuple[SharedArray, ...]):
        self.layout = layout
        self._arrays = arrays
        self.values, self.set_cells, self.set_members, self.dirty = (a.array for a in arrays)

    @classmethod
    def create(cls, run_id: str, layout: Layout, set_capacity: int) -> SharedState:
        """Allocate the state (driver side); ``set_capacity`` is rounded up to a power of 2."""
        capacity = 1 << max(4, int(set_capacity - 1).bit_length())
        arrays = (
            SharedArray.create(run_id, "values", (layout.cells,), "int64"),
            SharedArray.create(run_id, "set_cells", (capacity,), "int64"),
            SharedArray.create(run_id, "set_members", (capacity,), "int64"),
            SharedArray.create(run_id, "dirty", (dirty.groups_of(layout.cells),), "uint8"),
        )
        arrays[1].array.fill(EMPTY)
        return cls(layout, arrays)

    @classmethod
    def attach(cls, handle: StateHandle) -> SharedState:
        """Attach to the driver's state (actor side)."""
        arrays = tuple(
            SharedArray.attach(h)
            for h in (handle.values, handle.set_cells, handle.set_members, handle.dirty)
        )
        return cls(handle.layout, arrays)

    @property
    def arrays(self) -> StateArrays:
        """The arrays as one kernel argument."""
        return StateArrays(self.values, self.set_cells, self.set_members, self.dirty)

    @property
    def handle(self) -> StateHandle:
        """What to send to actors."""
        return StateHandle(self.layout, *(a.handle for a in self._arrays))

    def close(self) -> None:
        """Detach (and unlink, on the driver)."""
        self.values = self.set_cells = self.set_members = np.empty(0, np.int64)
        self.dirty = np.empty(0, np.uint8)
        for array in self._arrays:
            array.close()

    def unmap_pages(self) -> None:
        """Let go of this mapping's pages of values (`SharedArray.unmap_pages`): the
        driver's, while a team runs."""
        self._arrays[0].unmap_pages()

    def __enter__(self) -> SharedState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self, topology: TablesSpec, init: dict[str, pa.Table]) -> None:
        """Copy validated init tables (of the keys the layout holds) into the state (tables
        without init start at 0); a natural key of the init state is in the row its
        index gave it, the init file's position (`txstream.state.init.key_indexes`)."""
        for table in topology.init_tables:
            for column in table.columns:
                row = self.layout.bases[(table.name, column)]
                for chunk in init[table.name].column(column).chunks:  # no copy of it whole
                    data = chunk.to_numpy()
                    self.values[row : row + len(data)] = data
                    row += len(data)
            if LIVE in table.state_columns:
                base = self.layout.bases[(table.name, LIVE)]
                self.values[base : base + init[table.name].num_rows] = 1

    def rows(self) -> dict[str, int]:
        """Rows of every table as the state stands: of a table of natural keys, the keys
        that exist (its `LIVE` cells at 1: a row the index has not given, or whose key was
        deleted, holds 0); of a table of dense keys, all of them."""
        layout = self.layout
        out = {}
        for table, size in layout.sizes.items():
            base = layout.bases.get((table, LIVE))
            if base is None:
                out[table] = size
            else:
                live = self.values[base : base + layout.stored[table]]
                out[table] = int(np.count_nonzero(live == 1))
        return out

    def write(self, cells: np.ndarray, values: np.ndarray) -> None:
        """Overwrite ``cells`` outside a kernel (no team running), marked as written."""
        self.values[cells] = values
        dirty.mark_cells(self.dirty, cells)

    def set_existing(self, cells: np.ndarray) -> None:
        """Set existence cells (`LIVE`) to 1 outside a kernel (no team running): most of a
        chunk's created keys existed already, and those are neither written nor marked."""
        dirty.set_changed(self.values, self.dirty, cells, 1)

    def columns(self, topology: TablesSpec) -> dict[str, dict[str, np.ndarray]]:
        """Every table's columns in the state (`TableSpec.state_columns`), of the keys the
        layout holds for good (copies, safe after close)."""
        layout, out = self.layout, {}
        for table in topology.tables:
            size = layout.share.own(table.name) if layout.share else layout.sizes[table.name]
            out[table.name] = {
                column: self.values[layout.bases[(table.name, column)] :][:size].copy()
                for column in table.state_columns
            }
        return out

    def tables(
        self, topology: TablesSpec, indexes: dict[str, KeyIndex] | None = None
    ) -> dict[str, pa.Table]:
        """Every table as ``key`` + value columns (of their types), of the keys the layout
        holds for good (a copy, safe after close); a table of natural keys (its index in
        ``indexes``) holds the keys that exist, sorted by key."""
        types = {t.name: t.value_types for t in topology.tables}
        return with_keys(self.layout, self.columns(topology), indexes, types)


def with_keys(
    layout: Layout,
    columns: dict[str, dict[str, np.ndarray]],
    indexes: dict[str, KeyIndex] | None = None,
    types: dict[str, dict[str, ValueType]] | None = None,
) -> dict[str, pa.Table]:
    """Tables of ``columns`` (by table, by column: `SharedState.columns`) with their ``key``
    column first, their values of their ``types`` (by table, by column); of a table of
    natural keys (a `LIVE` column, its index in ``indexes``), the rows of the keys that
    exist, sorted by key."""
    out = {}
    for name, values in columns.items():
        live = values.pop(LIVE, None)
        if live is None:
            keys, rows = pa.array(layout.keys(name)), slice(None)
        else:
            index = (indexes or {})[name]
            rows = np.flatnonzero(live[: len(index)] == 1)
            rows = rows[np.asarray(pc.array_sort_indices(index.keys(rows)))]
            keys = index.keys(rows)
        table = pa.table({"key": keys, **{c: pa.array(v[rows]) for c, v in values.items()}})
        out[name] = typed_table(table, (types or {}).get(name, {}))
    return out
