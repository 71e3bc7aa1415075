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
from txstream.schedulers.team.placement import row_pools
from txstream.state._numba import inline, jit
from txstream.state.chunk import ChunkDims
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
    """One executor's private view of which cells it links, and its scratch."""

    part: np.ndarray
    """Executor linking each cell: the owner of its row."""
    row: np.ndarray
    """Row of each cell."""
    last: np.ndarray
    """Per cell: last operation linked so far in the chunk (-1)."""
    last_row: np.ndarray
    """Per row: last operation linked so far in the chunk (-1)."""
    batch_len: np.ndarray
    """Per cell: operations on it so far in the batch (valid once one is)."""
    touched: np.ndarray
    """Cells this executor linked in the chunk (to reset `last`)."""
    mine: np.ndarray
    """The operations this executor linked in the chunk, in ts order."""
    counts: np.ndarray
    """[0] cells in `touched`, [1] operations in `mine`."""
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


def partition(row_of_cell: np.ndarray, rows: int, parties: int) -> Partition:
    """A fresh partition of cells by row over ``parties`` executors."""
    cells = len(row_of_cell)
    return Partition(
        part=row_pools(rows, parties)[row_of_cell] if cells else np.zeros(0, np.int64),
        row=row_of_cell,
        last=np.full(cells, -1, np.int64),
        last_row=np.full(rows, -1, np.int64),
        batch_len=np.zeros(cells, np.int64),
        touched=np.zeros(cells, np.int64),
        mine=np.zeros(0, np.int64),
        counts=np.zeros(2, np.int64),
        cursor=np.zeros(parties, np.int64),
        stop=np.zeros(parties, np.int64),
        dealing=np.zeros(parties, np.int64),
    )


def with_room(part: Partition, operations: int) -> Partition:
    """``part``, with room to list a chunk of ``operations`` operations (before a chunk)."""
    if len(part.mine) >= operations:
        return part
    return part._replace(mine=np.zeros(int(operations * 1.5) + 1, np.int64))


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
        ptr[part.part[ops.cell[o]] + 1] += 1
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            ptr[part.part[ops.dep_cell[k]] + 1] += 1
    ptr[0] = first_item
    at = part.dealing
    for e in range(parties):
        ptr[e + 1] += ptr[e]
        at[e] = ptr[e]
    for o in range(first, end):
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            e = part.part[ops.dep_cell[k]]
            links.read_op[k] = o
            dealt[at[e]] = -1 - k
            at[e] += 1
        e = part.part[ops.cell[o]]
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
    n_touched = part.counts[0]
    n_mine = part.counts[1]
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
                n_touched, n_mine = _link_operation(
                    me, x, first, ops, part, links, stats, n_touched, n_mine
                )
            i += 1
        part.cursor[e] = i
    part.counts[0] = n_touched
    part.counts[1] = n_mine


@inline
def _link_read(k, o, first, ops, part, links, values, stats):
    """Read ``k`` of operation ``o``: its writer in the chunk so far (PD, listed among the
    writer's successors when in the batch), or the cell's value."""
    d = ops.dep_cell[k]
    q = part.last[d]
    links.dep_prev[k] = q
    links.pd_next[k] = -1
    if q < 0:
        links.dep_initial[k] = values[d]
    elif q >= first:
        links.pd_next[k] = links.pd_head[q]
        links.pd_head[q] = k
        stats[PD] += 1
        if part.row[d] != part.row[ops.cell[o]]:
            stats[CROSS] += 1


@inline
def _link_operation(me, o, first, ops, part, links, stats, n_touched, n_mine):
    """Operation ``o``: its previous operation on the cell (TD) and its row's unit. The
    counts of `Partition.touched` and `Partition.mine` after it."""
    c = ops.cell[o]
    r = part.row[c]
    part.mine[n_mine] = o
    p = part.last[c]
    links.chain_prev[o] = p
    links.chain_next[o] = -1
    links.owner[o] = me
    links.pd_head[o] = -1
    links.row_next[o] = -1
    if p < 0:
        part.touched[n_touched] = c
        n_touched += 1
    else:
        links.chain_next[p] = o
    if p >= first:
        stats[TD] += 1
        part.batch_len[c] += 1
    else:
        part.batch_len[c] = 1
    stats[HOT] = max(stats[HOT], part.batch_len[c])
    part.last[c] = o
    rp = part.last_row[r]
    if rp >= first:
        links.row_next[rp] = o
        links.head[o] = links.head[rp]
    else:
        links.head[o] = o
        stats[HEADS] += 1
    part.last_row[r] = o
    return n_touched, n_mine + 1


@jit
def forget_chunk(part):
    """After a chunk: the cells linked are free again (``last`` all -1), none listed."""
    for i in range(part.counts[0]):
        c = part.touched[i]
        part.last[c] = -1
        part.last_row[part.row[c]] = -1
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
