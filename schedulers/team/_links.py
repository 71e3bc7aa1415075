"""Dependency building, shared by every scheduler that orders operations: linking each
operation to the previous one on its cell (temporal dependencies, TD), each
parametric read to the last operation on the cell it reads (parametric dependencies
found through proxy reads, MorphStream §5.2, PD), and each operation to the first
operation of its row in the batch (the coarse scheduling unit).

The team links in parallel: executor ``me`` links the cells of the rows it owns
(`Partition`), in ts order, so it alone writes their links and no atomics are needed.
It does not scan the whole chunk for them: once per chunk, each executor deals the
operations and reads of its own share to their owners (`deal_share`: a shuffle, each
executor's share bucketed by owner in ts order), and after a barrier each links only
what was dealt to it (`link_batch`). Logical dependencies (LD) are the transaction
itself (`txn_ptr`); `txn_fates` marks which transactions can abort.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from txstream.schedulers.team.placement import pool_of_row, row_pools
from txstream.state._kernels import hash64
from txstream.state._numba import inline, jit
from txstream.state.chunk import ChunkDims
from txstream.state.layout import cell_rows, row_of
from txstream.state.segments import ArraySpec


class Links(NamedTuple):
    """The dependency links of a chunk's operations (per operation or per read)."""

    chain_prev: np.ndarray
    """Previous operation on the same cell in the chunk (-1: none)."""
    chain_next: np.ndarray
    """Next operation on the same cell (-1: none so far)."""
    dep_prev: np.ndarray
    """Per read: last operation on the read cell before the reader (-1: none)."""
    dep_initial: np.ndarray
    """Per read without such an operation: the cell's value when it was linked."""
    owner: np.ndarray
    """Executor that linked the operation (the owner of its row)."""
    head: np.ndarray
    """First operation of the same row in the same batch (its coarse unit)."""
    row_next: np.ndarray
    """Next operation on the same row in the same batch (-1: none)."""
    pd_head: np.ndarray
    """First read whose `dep_prev` is this operation, in the batch (-1: none)."""
    pd_next: np.ndarray
    """Per read: next read with the same `dep_prev` (-1: none)."""
    read_op: np.ndarray
    """Per read: the operation it belongs to."""


LINK_ARRAYS = {
    "chain_prev": "operations",
    "chain_next": "operations",
    "dep_prev": "reads",
    "dep_initial": "reads",
    "owner": "operations",
    "head": "operations",
    "row_next": "operations",
    "pd_head": "operations",
    "pd_next": "reads",
    "read_op": "reads",
}
"""Every `Links` array and the chunk dimension it is sized by."""


class Partition(NamedTuple):
    """One executor's private view of which cells it links, and its scratch. What it
    holds of the cells and rows of a chunk is in hash tables sized to the chunk, so that
    its cost follows the chunk, not the state (a state no larger than a table is its own
    hash: ``direct``)."""

    spans: np.ndarray
    """The layout's spans (`Layout.spans`): the row of each cell (`row_of`)."""
    direct: bool
    """Every cell is below the tables' size: a cell, or a row, is its own slot, and
    `row_of_cell` and `owner_of_cell` hold every cell's."""
    row_of_cell: np.ndarray
    """``direct``: the row of every cell (else empty)."""
    owner_of_cell: np.ndarray
    """``direct``: the executor linking every cell (else empty)."""
    cells: np.ndarray
    """Per slot: a cell linked in the chunk (-1: free), its last operation linked so
    far, its operations so far in the batch (valid once one is)."""
    rows: np.ndarray
    """Per slot: a row linked in the chunk (-1: free), its last operation linked so far."""
    touched: np.ndarray
    """Slots of `cells` taken in the chunk (to free them)."""
    touched_rows: np.ndarray
    """Slots of `rows` taken in the chunk."""
    mine: np.ndarray
    """The operations this executor linked in the chunk, in ts order."""
    counts: np.ndarray
    """[0] slots in `touched`, [1] operations in `mine`, [2] slots in `touched_rows`."""
    cursor: np.ndarray
    """Per executor that dealt items to this one: its next item to link (`take_dealt`)."""
    stop: np.ndarray
    """Per executor that dealt items to this one: where they end."""
    dealing: np.ndarray
    """Per executor, the next free slot of the items this one deals to it (`deal_share`)."""


def deal_arrays(dims: ChunkDims) -> list[ArraySpec]:
    """The chunk arrays of the shuffle (`deal_share`): the items each executor dealt (an
    operation ``o`` as ``o``, a read ``k`` as ``-1 - k``), and per executor where the
    items it dealt to each executor begin (and where its last ones end)."""
    return [
        ArraySpec("dealt", "int64", (dims.operations + dims.reads,)),
        ArraySpec("dealt_ptr", "int64", (dims.parties * (dims.parties + 1),)),
    ]


def partition(spans: np.ndarray, parties: int, operations: int = 0) -> Partition:
    """A partition of the cells of ``spans`` (`Layout.spans`) by row over ``parties``
    executors, with room for a chunk of ``operations`` operations: tables of a power of
    two slots, over 1.5 per operation, or one per cell if there are fewer cells."""
    cells = int((spans[:, 0] + spans[:, 1]).max(initial=0))
    direct = cells <= operations + operations // 2
    slots = 1 << (cells if direct else operations + operations // 2).bit_length()
    row = cell_rows(spans, cells) if direct else np.zeros(0, np.int64)
    return Partition(
        spans=spans,
        direct=direct,
        row_of_cell=row,
        owner_of_cell=row_pools(int(row.max(initial=-1)) + 1, parties)[row],
        cells=np.full((slots, 3), -1, np.int64),
        rows=np.full((slots, 2), -1, np.int64),
        touched=np.zeros(operations, np.int64),
        touched_rows=np.zeros(operations, np.int64),
        mine=np.zeros(operations, np.int64),
        counts=np.zeros(3, np.int64),
        cursor=np.zeros(parties, np.int64),
        stop=np.zeros(parties, np.int64),
        dealing=np.zeros(parties, np.int64),
    )


def with_room(part: Partition, operations: int) -> Partition:
    """``part``, with room to link a chunk of ``operations`` operations (before a chunk)."""
    if len(part.mine) >= operations:
        return part
    return partition(part.spans, len(part.cursor), int(operations * 1.5) + 1)


@inline
def _slot(table, key, direct):
    """The slot of ``key`` in ``table`` (`Partition.cells` or `rows`), or the free slot
    where it goes."""
    mask = len(table) - 1
    h = (key if direct else hash64(key)) & mask
    while table[h, 0] >= 0 and table[h, 0] != key:
        h = (h + 1) & mask
    return h


@inline
def _row(cell, part):
    """The row of ``cell``."""
    return part.row_of_cell[cell] if part.direct else row_of(cell, part.spans)


@inline
def _owner(cell, part):
    """The executor linking ``cell``: the owner of its row."""
    if part.direct:
        return part.owner_of_cell[cell]
    return pool_of_row(row_of(cell, part.spans), len(part.cursor))


TD, PD, CROSS, HEADS, HOT = range(5)
"""`link_batch` statistics: operations with an earlier one on their cell in the batch;
reads with an earlier writer in the batch; such reads whose writer is on another row;
rows touched (coarse units); most operations on one cell."""
LINK_STATS = 5


@jit
def deal_share(first, end, first_item, ops, part, links, dealt, ptr):
    """Deal operations first..end-1 (this executor's share of the chunk) and their reads
    to the executors that link them (the owners of the cells they write, of the cells
    they read), so that none scans the whole chunk: the items for executor ``e`` go to
    ``dealt[ptr[e]:ptr[e+1]]`` (from ``first_item`` on), in ts order, an operation's reads
    before it. Writes `read_op` of the share's reads."""
    parties = len(ptr) - 1
    ptr[:] = 0
    for o in range(first, end):
        ptr[_owner(ops.cell[o], part) + 1] += 1
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            ptr[_owner(ops.dep_cell[k], part) + 1] += 1
    ptr[0] = first_item
    at = part.dealing
    for e in range(parties):
        ptr[e + 1] += ptr[e]
        at[e] = ptr[e]
    for o in range(first, end):
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            e = _owner(ops.dep_cell[k], part)
            links.read_op[k] = o
            dealt[at[e]] = -1 - k
            at[e] += 1
        e = _owner(ops.cell[o], part)
        dealt[at[e]] = o
        at[e] += 1


def take_dealt(me: int, part: Partition, ptr: np.ndarray) -> None:
    """After the barrier that follows `deal_share`: where the items every executor dealt
    to ``me`` begin and end (``ptr``: `deal_arrays`' ``dealt_ptr``)."""
    table = ptr.reshape(len(part.cursor), -1)
    part.cursor[:] = table[:, me]
    part.stop[:] = table[:, me + 1]


@jit
def link_batch(me, first, end, ops, part, links, dealt, values, stats):
    """Link operations first..end-1 (one batch, after every earlier batch of the chunk)
    whose cells executor ``me`` owns, from the items dealt to it (`deal_share`), and list
    them (`Partition.mine`); add their statistics to ``stats`` (`TD` ...)."""
    n_touched, n_mine, n_rows = part.counts[0], part.counts[1], part.counts[2]
    for e in range(len(part.cursor)):  # ranks deal in ts order
        i = part.cursor[e]
        while i < part.stop[e]:
            x = dealt[i]
            if x < 0:
                k = -1 - x
                o = links.read_op[k]
                if o >= end:
                    break
                _link_read(k, o, first, ops, part, links, values, stats)
            else:
                if x >= end:
                    break
                n_touched, n_mine, n_rows = _link_operation(
                    me, x, first, ops, part, links, stats, n_touched, n_mine, n_rows
                )
            i += 1
        part.cursor[e] = i
    part.counts[0], part.counts[1], part.counts[2] = n_touched, n_mine, n_rows


@inline
def _link_read(k, o, first, ops, part, links, values, stats):
    """Read ``k`` of operation ``o``: its writer in the chunk so far (PD, listed among the
    writer's successors when in the batch), or the cell's value."""
    d = ops.dep_cell[k]
    h = _slot(part.cells, d, part.direct)
    q = part.cells[h, 1] if part.cells[h, 0] >= 0 else -1
    links.dep_prev[k] = q
    links.pd_next[k] = -1
    if q < 0:
        links.dep_initial[k] = values[d]
    elif q >= first:
        links.pd_next[k] = links.pd_head[q]
        links.pd_head[q] = k
        stats[PD] += 1
        if _row(d, part) != _row(ops.cell[o], part):
            stats[CROSS] += 1


@inline
def _claimed(table, key, direct, touched, n_touched):
    """``key``'s entry of ``table`` (its slot, `_slot`), claimed with no last operation if
    new and listed in ``touched``; and the count of ``touched`` after it."""
    h = _slot(table, key, direct)
    if table[h, 0] < 0:
        table[h, 0] = key
        table[h, 1] = -1
        touched[n_touched] = h
        n_touched += 1
    return h, n_touched


@inline
def _link_operation(me, o, first, ops, part, links, stats, n_touched, n_mine, n_rows):
    """Operation ``o``: its previous operation on the cell (TD) and its row's unit. The
    counts of `Partition.touched`, `Partition.mine` and `Partition.touched_rows` after
    it."""
    c = ops.cell[o]
    h, n_touched = _claimed(part.cells, c, part.direct, part.touched, n_touched)
    part.mine[n_mine] = o
    p = part.cells[h, 1]
    links.chain_prev[o] = p
    links.chain_next[o] = -1
    links.owner[o] = me
    links.pd_head[o] = -1
    links.row_next[o] = -1
    if p >= 0:
        links.chain_next[p] = o
    if p >= first:
        stats[TD] += 1
        part.cells[h, 2] += 1
    else:
        part.cells[h, 2] = 1
    stats[HOT] = max(stats[HOT], part.cells[h, 2])
    part.cells[h, 1] = o
    r = _row(c, part)
    g, n_rows = _claimed(part.rows, r, part.direct, part.touched_rows, n_rows)
    rp = part.rows[g, 1]
    if rp >= first:
        links.row_next[rp] = o
        links.head[o] = links.head[rp]
    else:
        links.head[o] = o
        stats[HEADS] += 1
    part.rows[g, 1] = o
    return n_touched, n_mine + 1, n_rows


@jit
def forget_chunk(part):
    """After a chunk: the tables are free again, nothing listed."""
    for i in range(part.counts[0]):
        part.cells[part.touched[i], 0] = -1
    for i in range(part.counts[2]):
        part.rows[part.touched_rows[i], 0] = -1
    part.counts[:] = 0


@jit
def txn_fates(first_txn, end_txn, ops, fates):
    """Fresh fates of transactions first_txn..end_txn-1: none failed, and the last
    conditional operation of each (-1: it cannot abort)."""
    for t in range(first_txn, end_txn):
        fates.failed[t] = 0
        fates.fresh[t] = 0
        fates.affected[t] = 0
        fates.last_cond[t] = -1
        for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
            if ops.cond[o] > 0:
                fates.last_cond[t] = o
