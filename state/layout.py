"""Where every table's columns live in the flat state array, and which cells form a row.

A layout holds either every key of every table or one node's share of them in a run over
several nodes (`NodeShare`): the node's own keys, then a few rows for other nodes' keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.state._numba import inline
from txstream.state.keys import node_of

FOREIGN_ROWS = 1 << 17
"""Rows per table a node keeps for other nodes' keys (fewer if the table has fewer): what
one step's transactions across nodes may touch of them (`txstream.nodes.sequencer` cuts a
unit of input finer where a step would need more)."""


class TableSpec(Protocol):
    """What the state reads of a table (a topology's `Table`): the state knows nothing of
    topologies, only of named tables of int64 value columns."""

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

    A table of natural keys (``placed``: the node of every row given so far) has dense rows
    given in the order the stream first names its keys, each row on the node of
    ``node_of(natural key)``; its rows grow (`place`), so the node keeps room for all of
    them (any key may hash to it).

    The team of the node runs in the node's process and sees `hold`'s changes, which are
    made only while it is idle (between steps)."""

    def __init__(
        self,
        node: int,
        nodes: int,
        sizes: dict[str, int],
        placed: dict[str, np.ndarray] | None = None,
    ):
        self.node, self.nodes, self.sizes = node, nodes, dict(sizes)
        self.room = FOREIGN_ROWS
        """Set where the run is planned (the driver): its nodes get it with their share."""
        self._foreign: dict[str, np.ndarray] = {}
        """Per table, the other nodes' keys held this step, sorted: key i is in row own + i."""
        self._dense: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """Per table of dense keys, `owners` once computed: a step asks for them per column."""
        self._own: dict[str, tuple[int, np.ndarray]] = {}
        """Per table, `own_keys` of the rows given when last asked, and how many those were."""
        self._placed: dict[str, _Placed] = {}
        for table, owner in (placed or {}).items():
            self._placed[table] = _Placed(self.sizes[table], nodes)
            self._placed[table].place(owner)

    def place(self, table: str, owner: np.ndarray) -> None:
        """The nodes of the next rows of ``table``, a table of natural keys."""
        self._placed[table].place(owner)

    def placed(self, table: str) -> int:
        """Rows of ``table`` given so far (all of a table of dense keys)."""
        placed = self._placed.get(table)
        return self.sizes[table] if placed is None else placed.count

    def owners(self, table: str) -> tuple[np.ndarray, np.ndarray]:
        """The node of every row of ``table`` given so far, and its row on that node."""
        placed = self._placed.get(table)
        if placed is not None:
            return placed.owner[: placed.count], placed.row[: placed.count]
        dense = self._dense.get(table)
        if dense is None:
            dense = self._dense[table] = owners(self.sizes[table], self.nodes)
        return dense

    def own(self, table: str) -> int:
        """How many keys of ``table`` the node owns."""
        placed = self._placed.get(table)
        return len(self.own_keys(table)) if placed is None else int(placed.per_node[self.node])

    def own_keys(self, table: str) -> np.ndarray:
        """The keys of ``table`` the node owns, in row order: only the rows given since
        the last call are looked at."""
        owner, _ = self.owners(table)
        seen, known = self._own.get(table, (0, np.zeros(0, np.int64)))
        if len(owner) > seen or table not in self._own:
            known = np.concatenate([known, np.flatnonzero(owner[seen:] == self.node) + seen])
            self._own[table] = (len(owner), known)
        return known

    def __getstate__(self) -> dict:
        # what is worked out again from the placements stays behind
        return {**self.__dict__, "_dense": {}, "_own": {}}

    def own_rows(self, table: str) -> int:
        """Rows of ``table`` for the node's own keys: all its keys may be here if its keys
        are natural ones, still to come."""
        return self.sizes[table] if table in self._placed else self.own(table)

    def foreign_rows(self, table: str) -> int:
        """Rows of ``table`` for other nodes' keys."""
        if table in self._placed:
            return min(self.sizes[table], self.room)
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

    def others(self, table: str, keys: np.ndarray) -> np.ndarray:
        """Which of ``keys`` of ``table`` other nodes own."""
        owner, _ = self.owners(table)
        return owner[keys] != self.node

    def rows(self, table: str, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys`` of ``table``: owned ones, or held for this step."""
        owner, row = self.owners(table)
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
            rows[other] = self.own_rows(table) + at
        return rows


class _Placed:
    """The rows of a table of natural keys given so far: the node of each and its row
    there (its rank among that node's rows), in arrays of the table's room that never
    move (another thread reads them while rows are added)."""

    def __init__(self, size: int, nodes: int):
        self.owner = np.zeros(size, np.int64)
        self.row = np.zeros(size, np.int64)
        self.count = 0
        self.per_node = np.zeros(nodes, np.int64)
        """Rows given so far on each node."""

    def __setstate__(self, state: dict) -> None:
        # arrays unpickled from Ray's object store are read-only views of it
        self.__dict__.update(
            {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}
        )

    def place(self, owner: np.ndarray) -> None:
        end = self.count + len(owner)
        if end > len(self.owner):
            raise RuntimeFailure(f"{end} rows placed in a table of {len(self.owner)}")
        self.owner[self.count : end] = owner
        for node in np.unique(owner).tolist():
            at = np.flatnonzero(owner == node)
            self.row[self.count + at] = self.per_node[node] + np.arange(len(at))
            self.per_node[node] += len(at)
        self.count = end


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
            else share.own_rows(t.name) + share.foreign_rows(t.name)
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

    def spans(self) -> np.ndarray:
        """Per (table, column), in base order: its first cell, its cells, its first row
        (`row_of`)."""
        first_row: dict[str, int] = {}
        spans = [
            (
                base,
                self.stored[table],
                first_row.setdefault(table, sum(self.stored[t] for t in first_row)),
            )
            for (table, _), base in self.bases.items()
        ]
        return np.array(spans, np.int64).reshape(-1, 3)

    def row_of_cell(self) -> np.ndarray:
        """Row of every cell: rows are numbered table by table, key by key."""
        return cell_rows(self.spans(), self.cells)


def cell_rows(spans: np.ndarray, cells: int) -> np.ndarray:
    """The row of each of the first ``cells`` cells (``spans``: `Layout.spans`)."""
    row = np.empty(cells, np.int64)
    for base, size, start in spans:
        row[base : base + size] = np.arange(start, start + size)
    return row


@inline
def row_of(cell, spans):
    """The row of ``cell`` (``spans``: `Layout.spans`): that of its column's span, the
    last one starting at or before it (an empty span holds no cell)."""
    for i in range(len(spans) - 1, -1, -1):
        if spans[i, 0] <= cell:
            return cell - spans[i, 0] + spans[i, 2]
    return -1
