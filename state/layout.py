"""Where every table's columns live in the flat state array, and which cells form a row.

A layout holds either every key of every table or one node's share of them in a run over
several nodes (`NodeShare`): the node's own keys, then a few rows for other nodes' keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Protocol

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.state.keys import node_of
from txstream.state.values import ValueType

FOREIGN_ROWS = 1 << 17
"""Rows per table a node keeps for other nodes' keys (fewer if the table has fewer): what
one step's transactions across nodes may touch of them (`txstream.nodes.sequencer` cuts a
unit of input finer where a step would need more)."""


class TableSpec(Protocol):
    """What the state reads of a table (a topology's `Table`): the state knows nothing of
    topologies, only of named tables of value columns, held as int64."""

    name: str
    columns: tuple[str, ...]
    """Its value columns."""
    state_columns: tuple[str, ...]
    """The columns the state holds: the value columns, and `txstream.state.keys.LIVE` for
    natural keys."""
    key: str
    """Its key type (`txstream.state.keys.KEY_TYPES`)."""
    init_min: int | None
    """The smallest value its init state may hold (None: any)."""
    value_types: dict[str, ValueType]
    """Every value column's type: int64, or a decimal held as integers of its scale."""


class TablesSpec(Protocol):
    """What the state reads of a topology: its tables, and those read from init state."""

    tables: tuple[TableSpec, ...]
    init_tables: tuple[TableSpec, ...]


class NodeShare:
    """The keys node ``node`` of ``nodes`` holds: key ``k`` of a table lives on node
    ``node_of(k, nodes)`` (a stable hash of the key), as the next row of the node's copy of
    that table in key order. After its own rows come `foreign_rows` rows that hold, for one
    step, the other nodes' keys that its transactions across nodes touch (`hold`): values
    sent by their owners before the step.

    The team of the node runs in the node's process and sees `hold`'s changes, which are
    made only while it is idle (between steps)."""

    def __init__(self, node: int, nodes: int, sizes: dict[str, int]):
        self.node, self.nodes, self.sizes = node, nodes, dict(sizes)
        self.room = FOREIGN_ROWS
        """Set where the run is planned (the driver): its nodes get it with their share."""
        self._foreign: dict[str, np.ndarray] = {}
        """Per table, the other nodes' keys held this step, sorted: key i is in row own + i."""

    def own(self, table: str) -> int:
        """How many keys of ``table`` the node owns."""
        return len(self.own_keys(table))

    def own_keys(self, table: str) -> np.ndarray:
        """The keys of ``table`` the node owns, in row order."""
        owner, _ = owners(self.sizes[table], self.nodes)
        return np.flatnonzero(owner == self.node)

    def foreign_rows(self, table: str) -> int:
        """Rows of ``table`` for other nodes' keys."""
        return min(self.sizes[table] - self.own(table), self.room)

    def hold(self, table: str, keys: np.ndarray) -> None:
        """Give the other nodes' ``keys`` of ``table`` (sorted, distinct) a row each, for
        the next step; the keys held before are let go."""
        if len(keys) > self.foreign_rows(table):
            raise RuntimeFailure(
                f"node {self.node}: a step needs {len(keys)} other nodes' keys of {table!r}, "
                f"room for {self.foreign_rows(table)}"
            )
        self._foreign[table] = keys

    def others(self, keys: np.ndarray) -> np.ndarray:
        """Which of ``keys`` other nodes own."""
        return node_of(keys, self.nodes) != self.node

    def rows(self, table: str, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys`` of ``table``: owned ones, or held for this step."""
        owner, row = owners(self.sizes[table], self.nodes)
        rows = row[keys]
        other = np.flatnonzero(owner[keys] != self.node)
        if len(other):
            held = self._foreign.get(table, np.zeros(0, np.int64))
            wanted = keys[other]
            at = np.searchsorted(held, wanted)
            if (at >= len(held)).any() or (held[np.minimum(at, len(held) - 1)] != wanted).any():
                raise RuntimeFailure(
                    f"node {self.node}: a key of {table!r} that is neither its own nor held"
                )
            rows[other] = self.own(table) + at
        return rows


@cache
def owners(size: int, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """For keys ``0..size-1`` of a table over ``nodes`` nodes: the node of every key
    (`node_of`) and its row on that node (its rank among the node's keys)."""
    owner = node_of(np.arange(size, dtype=np.int64), nodes)
    order = np.argsort(owner, kind="stable")
    first = np.searchsorted(owner[order], np.arange(nodes))
    row = np.empty(size, np.int64)
    row[order] = np.arange(size) - first[owner[order]]
    return owner, row


@dataclass(frozen=True)
class Layout:
    """Where each (table, column) lives in the flat state array, given the table sizes.

    Cell ``bases[(table, column)] + row`` holds ``column`` of the key in ``row``: the key
    itself, unless the layout is a node's ``share``. A *row* is one key of one table (all
    its columns): the unit schedulers place on executors and group operations by.
    """

    sizes: dict[str, int]
    """Keys of each table (of the whole state, also for a node's share)."""
    bases: dict[tuple[str, str], int]
    cells: int
    stored: dict[str, int]
    """Rows of each table this layout holds."""
    share: NodeShare | None = field(default=None, compare=False)

    @staticmethod
    def of(
        tables: Sequence[TableSpec], sizes: dict[str, int], share: NodeShare | None = None
    ) -> Layout:
        """Lay out every column of every table one after the other: every key, or the
        rows of a node's ``share``."""
        stored = {
            t.name: sizes[t.name]
            if share is None
            else share.own(t.name) + share.foreign_rows(t.name)
            for t in tables
        }
        bases: dict[tuple[str, str], int] = {}
        cells = 0
        for table in tables:
            for column in table.state_columns:
                bases[(table.name, column)] = cells
                cells += stored[table.name]
        return Layout(sizes=dict(sizes), bases=bases, cells=cells, stored=stored, share=share)

    def cells_of(self, table: str, column: str, keys: np.ndarray) -> np.ndarray:
        """The cells of ``column`` of ``table`` for ``keys``."""
        base = self.bases[(table, column)]
        return keys + base if self.share is None else self.share.rows(table, keys) + base

    def keys(self, table: str) -> np.ndarray:
        """The keys whose values this layout holds for good (all, or a node's own), in
        row order."""
        if self.share is None:
            return np.arange(self.sizes[table], dtype=np.int64)
        return self.share.own_keys(table)

    def locate(self, cells: np.ndarray) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray]:
        """For cells of a layout of every key: the (table, column) pairs in base order,
        and each cell's index into them and key."""
        columns = list(self.bases)
        starts = np.fromiter(self.bases.values(), np.int64, len(columns))
        where = np.searchsorted(starts, cells, side="right") - 1
        return columns, where, cells - starts[where]

    @property
    def rows(self) -> int:
        """Number of rows of all tables together."""
        return sum(self.stored[table] for table in dict.fromkeys(t for t, _ in self.bases))

    def row_of_cell(self) -> np.ndarray:
        """Row of every cell: rows are numbered table by table, key by key."""
        row = np.empty(self.cells, np.int64)
        first_row: dict[str, int] = {}
        for (table, _), base in self.bases.items():
            size = self.stored[table]
            start = first_row.setdefault(table, sum(self.stored[t] for t in first_row))
            row[base : base + size] = np.arange(start, start + size)
        return row
