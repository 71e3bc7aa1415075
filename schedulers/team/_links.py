"""Dependency building, shared by every scheduler that orders operations: linking each
operation to the previous one on its cell (temporal dependencies, TD), each
parametric read to the last operation on the cell it reads (parametric dependencies
found through proxy reads, MorphStream §5.2, PD), and each operation to the first
operation of its row in the batch (the coarse scheduling unit).

The team links in parallel: executor ``me`` links the cells of the rows it owns
(`Partition`), scanning the operations in ts order, so it alone writes their links
and no atomics are needed. Logical dependencies (LD) are the transaction itself
(`txn_ptr`); `txn_fates` marks which transactions can abort.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from txstream.schedulers.team.placement import row_pools
from txstream.state._numba import jit


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
def link_batch(me, first, end, ops, part, links, values, stats):
    """Link operations first..end-1 (one batch, after every earlier batch of the chunk)
    whose cells executor ``me`` owns, and list them (`Partition.mine`); add their
    statistics to ``stats`` (`TD` ...)."""
    n_touched = part.counts[0]
    n_mine = part.counts[1]
    for o in range(first, end):
        c = ops.cell[o]
        mine = part.part[c] == me
        r = part.row[c]
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            d = ops.dep_cell[k]
            if part.part[d] != me:
                continue
            q = part.last[d]
            links.dep_prev[k] = q
            links.read_op[k] = o
            links.pd_next[k] = -1
            if q < 0:
                links.dep_initial[k] = values[d]
            elif q >= first:
                links.pd_next[k] = links.pd_head[q]
                links.pd_head[q] = k
                stats[PD] += 1
                if part.row[d] != r:
                    stats[CROSS] += 1
        if not mine:
            continue
        part.mine[n_mine] = o
        n_mine += 1
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
    part.counts[0] = n_touched
    part.counts[1] = n_mine


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
