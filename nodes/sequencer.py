"""The sequencer of a run over several nodes: which node does what, in which step.

The state is partitioned by key: key ``k`` of every table lives on node ``node_of(k, N)``
(of a table of natural keys, row ``k`` on the node of its natural key's ``node_of``).
The input has one total order (ts), fixed before anything runs, so the nodes need no commit protocol
(Calvin, SIGMOD 2012): a transaction whose cells all live on one node (*local*) runs there
as on one host; one that spans nodes (*cross*) runs on every node it touches, each having
been sent the values of the other nodes' cells it reads, so all reach the same decision;
each keeps only the writes to its own cells.

Every unit of input (a pushed table) is cut into *levels*, executed as steps: in step L each
node runs, in ts order, its transactions of level L. A cross transaction's level is one more
than the highest level of an earlier transaction on any of its cells; a local one's is that
highest level. So on every cell, the transactions before a cross one are in earlier levels
and none of its level precedes it: the values it needs are those at the end of the previous
step, which their owners send right after it (one exchange per level, not per transaction).
Transactions without a cell (rejected events) run on node 0, where their outputs come
from. Everything here is per unit and vectorised; the level assignment is one pass of a
kernel over the unit's (transaction, cell) pairs.

Chains of cross transactions on hot keys make one level each. A unit can instead be
*gathered* (`Sequencer.gather`): the cells it touches on other nodes are sent to one node,
which runs the whole unit as one host would, and sent back to their owners: three levels
whatever its chains. Which of the two a unit runs as is the cost model's choice
(`txstream.nodes.cost`). Gathering moves cells for one unit; their owners stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np
import pyarrow as pa
from txstream.errors import TopologyError
from txstream.schedulers.statements import Statements
from txstream.state.keys import node_of
from txstream.state.layout import Layout, NodeShare
from txstream.topologies.api import EventShare, Topology


@dataclass
class Step:
    """What one node does in one level: run ``events`` (positions in the unit, ts order)
    after installing the cells it was sent (``receive``: from which node, which cells), then
    send what others need in the next level (``send``: to which node, which cells)."""

    events: np.ndarray
    receive: list[tuple[int, np.ndarray]] = field(default_factory=list)
    send: list[tuple[int, np.ndarray]] = field(default_factory=list)


@dataclass
class UnitPlan:
    """A unit of input as steps: ``steps[level][node]`` (None: the node has nothing to do),
    and the node whose outputs count for each event (``home``)."""

    steps: list[list[Step | None]]
    home: np.ndarray
    cross: int
    """Transactions of the unit that span nodes."""
    exchanged: int
    """Cell values sent between nodes for the unit."""
    gathered: bool = False
    """Whether the unit runs whole on one node (`Sequencer.gather`)."""


class Partition:
    """Key ``k`` of every table on node ``node_of(k)`` (`txstream.state.layout.NodeShare`):
    the owner of every cell of the flat state of every key (``layout``), which cells hold
    distinct sets, and how many other nodes' keys of each table a node has room for.

    A table of natural keys (``placed``: the node of each of its rows so far, from
    ``node_of`` of its natural key) grows: the rows given since are placed (`place`) before
    a unit that names them is sequenced."""

    def __init__(
        self,
        layout: Layout,
        topology: Topology,
        nodes: int,
        placed: dict[str, np.ndarray] | None = None,
    ):
        self.nodes = nodes
        self.layout = layout
        self.shares = [NodeShare(node, nodes, layout.sizes, placed) for node in range(nodes)]
        tables = list(layout.sizes)
        self.owner = np.zeros(layout.cells, np.int64)
        self.is_set = np.zeros(layout.cells, np.bool_)
        self.row = layout.row_of_cell()
        """The (table, key) of every cell, as one number."""
        self.table_of_row = np.empty(layout.rows, np.int64)
        self.room = np.array([[s.foreign_rows(t) for t in tables] for s in self.shares])
        """``room[node, table]``: rows for other nodes' keys."""
        distinct = {t.name for t in topology.tables if t.distinct}
        for (table, _), base in layout.bases.items():
            size = layout.sizes[table]
            owner, _ = self.shares[0].owners(table)
            self.owner[base : base + len(owner)] = owner
            self.is_set[base : base + size] = table in distinct
            self.table_of_row[self.row[base : base + size]] = tables.index(table)

    def place(self, table: str, owner: np.ndarray) -> None:
        """The nodes of the next rows of ``table``, a table of natural keys."""
        first = self.shares[0].placed(table)
        for share in self.shares:
            share.place(table, owner)
        for (name, _), base in self.layout.bases.items():
            if name == table:
                self.owner[base + first : base + first + len(owner)] = owner

    def owner_of(self, table: str, keys: np.ndarray) -> np.ndarray:
        """The node of each of ``keys`` (rows given so far) of ``table``."""
        owner, _ = self.shares[0].owners(table)
        return owner[keys]


def touched_cells(
    topology: Topology, layout: Layout, events: pa.Table
) -> tuple[np.ndarray, np.ndarray]:
    """``(txn, cell)``: the cells of the transactions of ``events`` (conformed to the
    topology's schema; cells of ``layout``, of every key), grouped by transaction."""
    if not events.num_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    batch = events.combine_chunks().to_batches()
    share = EventShare(batch[0], topology, layout.sizes)
    topology.pre_process(share)
    transactions = Statements(share, layout)
    topology.state_access(share, transactions)
    return transactions.touched()


def participants(
    layout: Layout, nodes: int, n: int, txn: np.ndarray, cells: np.ndarray
) -> np.ndarray:
    """A bit per node that takes part in each of ``n`` transactions (`touched_cells`) of
    tables of dense keys: the owners of its cells, node 0 for a transaction without any."""
    mask = np.zeros(n, np.int64)
    if len(txn):
        _, _, keys = layout.locate(cells)
        first = np.flatnonzero(np.diff(txn, prepend=-1))
        mask[txn[first]] = np.bitwise_or.reduceat(np.left_shift(1, node_of(keys, nodes)), first)
    mask[mask == 0] = 1
    return mask


def cut(txn: np.ndarray, cells: np.ndarray, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """The `touched_cells` of events ``first..end-1`` of those ``txn`` numbers."""
    lo, hi = np.searchsorted(txn, [first, end])
    return txn[lo:hi] - first, cells[lo:hi]


class Sequencer:
    """Plans units of input for a run over ``partition.nodes`` nodes (module docstring)."""

    def __init__(self, topology: Topology, layout: Layout, partition: Partition):
        self.topology = topology
        self.layout = layout
        self.partition = partition
        self._last = np.zeros(layout.cells, np.int64)

    def plan(
        self, n: int, txn: np.ndarray, cells: np.ndarray, levels_max: int | None = None
    ) -> UnitPlan | None:
        """The steps of a unit of ``n`` events given the cells of its transactions
        (`touched_cells`), which comes right after the previous unit's; None if a step
        would touch more of other nodes' keys than the node has room for
        (`Partition.room`), or if it takes more than ``levels_max`` levels (left unbuilt:
        hot keys make thousands): the unit must be cut smaller or gathered."""
        nodes, owner = self.partition.nodes, self.partition.owner
        ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(txn, minlength=n), out=ptr[1:])
        level, mask, home = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        self._last[:] = 0
        _levels(ptr, cells, owner, nodes, self._last, level, mask, home)
        cross = (mask & (mask - 1)) != 0
        crossing = cross[txn]
        if self.partition.is_set[cells[crossing]].any():
            raise TopologyError(
                f"{self.topology.name}: a transaction across nodes adds to a distinct set; "
                "key its set table like the tables it updates with it, or run on one node"
            )
        top = int(level.max(initial=0)) + 1
        if levels_max is not None and top > levels_max:
            return None
        steps: list[list[Step | None]] = [[None] * nodes for _ in range(top)]
        for node in range(nodes):
            mine = np.flatnonzero((mask >> node) & 1)
            by_level = mine[np.argsort(level[mine], kind="stable")]
            bounds = np.searchsorted(level[by_level], np.arange(top + 1))
            for lv in range(top):
                if bounds[lv + 1] > bounds[lv]:
                    steps[lv][node] = Step(by_level[bounds[lv] : bounds[lv + 1]])
        exchanged = self._exchanges(steps, txn[crossing], cells[crossing], level, mask)
        if exchanged is None:
            return None
        return UnitPlan(steps, home, int(cross.sum()), exchanged)

    def gather(self, n: int, txn: np.ndarray, cells: np.ndarray) -> UnitPlan | None:
        """The unit of `plan` run whole on the node that owns most of its cells: in the
        first level the other nodes send it their cells the unit touches, in the second it
        runs every event (each one's home), in the third the owners take their cells back.
        None if a cell to move holds a distinct set or the node lacks room for them."""
        p, nodes = self.partition, self.partition.nodes
        used = _distinct(cells)
        owners = p.owner[used]
        to = int(np.argmax(np.bincount(owners, minlength=nodes)))
        moved, senders = used[owners != to], owners[owners != to]
        if p.is_set[moved].any() or self._too_wide((nodes + senders) * nodes + to, moved):
            return None
        run = Step(np.arange(n, dtype=np.int64))
        steps: list[list[Step | None]] = [[None] * nodes for _ in range(3)]
        steps[1][to] = run
        for source in np.unique(senders).tolist():
            mine = moved[senders == source]
            steps[0][source] = Step(np.zeros(0, np.int64), send=[(to, mine)])
            run.receive.append((source, mine))
            run.send.append((source, mine))
            steps[2][source] = Step(np.zeros(0, np.int64), receive=[(to, mine)])
        if not len(moved):
            steps = [steps[1]]
        cross = 0
        if len(txn):
            first = np.flatnonzero(np.diff(txn, prepend=-1))
            bits = np.bitwise_or.reduceat(np.left_shift(1, p.owner[cells]), first)
            cross = int(((bits & (bits - 1)) != 0).sum())
        return UnitPlan(steps, np.full(n, to, np.int64), cross, 2 * len(moved), gathered=True)

    def _exchanges(self, steps, txn, cells, level, mask) -> int | None:
        """Add to ``steps`` what every node sends and receives: for each cell of a cross
        transaction, its owner sends it after the step before the transaction's level to
        every other participant. The number of values sent (None: too many keys for a
        node's room, see `plan`)."""
        nodes, owner = self.partition.nodes, self.partition.owner
        sender, size = owner[cells], len(owner)
        parts = []
        for to in range(nodes):
            wanted = ((mask[txn] >> to) & 1).astype(bool) & (sender != to)
            group = (level[txn[wanted]] * nodes + sender[wanted]) * nodes + to
            parts.append(group * size + cells[wanted])  # one int64 per (group, cell)
        entries = _distinct(np.concatenate(parts))  # each cell once per group
        if not len(entries):
            return 0
        group, got = np.divmod(entries, size)
        if self._too_wide(group, got):
            return None
        starts = np.flatnonzero(np.diff(group, prepend=-1))
        for first, end in zip(starts, [*starts[1:], len(entries)], strict=True):
            rest, to = divmod(int(group[first]), nodes)
            lv, source = divmod(rest, nodes)
            cells_sent = got[first:end]
            before = steps[lv - 1][source]
            if before is None:
                before = steps[lv - 1][source] = Step(np.zeros(0, np.int64))
            before.send.append((to, cells_sent))
            steps[lv][to].receive.append((source, cells_sent))  # a participant: it has a step
        return len(entries)

    def _too_wide(self, group: np.ndarray, cells: np.ndarray) -> bool:
        """Whether, in some step, a node receives more distinct keys of a table than it
        has rows for (``group``: (level, sender, receiver) of each cell received)."""
        p, nodes = self.partition, self.partition.nodes
        level_to = (group // (nodes * nodes)) * nodes + group % nodes
        rows = len(p.table_of_row)
        held = _distinct(level_to * rows + p.row[cells])
        table = p.table_of_row[held % rows]
        tables = p.room.shape[1]
        counts = np.bincount((held // rows) * tables + table)
        at = np.flatnonzero(counts)
        return bool((counts[at] > p.room[(at // tables) % nodes, at % tables]).any())


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of non-negative ``values``, sorted (numpy 2's `np.unique`
    hashes, many times slower than a sort on int64 arrays of a unit's size)."""
    ordered = np.sort(values)
    return ordered[np.diff(ordered, prepend=-1) != 0]


@numba.njit(cache=True, nogil=True)
def _levels(ptr, cells, owner, nodes, last, level, mask, home):  # pragma: no cover - numba
    """Level, participants (a bit per node) and home node of every transaction, in ts
    order; ``last[c]``: the highest level of a transaction so far on cell ``c``."""
    for t in range(len(ptr) - 1):
        first, end = ptr[t], ptr[t + 1]
        if first == end:
            home[t], mask[t], level[t] = 0, 1, 0
            continue
        bits, top = 0, 0
        for i in range(first, end):
            c = cells[i]
            bits |= 1 << owner[c]
            top = max(top, last[c])
        lv = top + 1 if bits & (bits - 1) else top
        for i in range(first, end):
            last[cells[i]] = lv
        level[t], mask[t], home[t] = lv, bits, owner[cells[first]]
