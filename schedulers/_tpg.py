"""MorphStream's task precedence graph (TPG) beyond the links: scheduling units, their
dependencies, strata (MorphStream, SIGMOD'23 §4.1-4.2).

The vertices are the batch's operations; temporal and parametric dependencies are the
`Links` (`chain_prev`, `dep_prev`, and their successors `chain_next`, `pd_head`/
`pd_next`); logical dependencies are the transaction. A *unit* is what one executor
runs at once:

- fine: one operation; its dependencies are its TD and PD predecessors.
- coarse: the operations of one row in ts order (`Links.head` is the row's first
  operation in the batch, the unit's id); only PD edges cross units. Groups whose PD
  edges form a cycle are merged into one unit (`merge_cycles`, Tarjan's algorithm
  over the row graph), whose operations run in ts order: the team never deadlocks.

Strata (for structured exploration) are longest-path levels: a unit's level is one
more than its predecessors'. Units are indexed by operation index (a unit's first
operation); per-unit arrays are per-operation arrays read at unit ids.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from txstream.schedulers.team._links import link_batch, txn_fates
from txstream.schedulers.team.placement import pool_of_row
from txstream.state._kernels import hash64
from txstream.state._numba import inline, jit, monotonic_ns, store_release
from txstream.state.layout import row_of
from txstream.state.sync import OK, STRIDE, wait_at_least


class Units(NamedTuple):
    """The scheduling units of a batch (per-operation arrays, read at unit ids)."""

    rep: np.ndarray
    """Coarse: the unit of a row head (itself, or the merged unit's first head)."""
    level: np.ndarray
    """Stratum of a unit."""
    pending: np.ndarray
    """int64: predecessors of a unit not executed yet (non-structured exploration)."""
    merged: np.ndarray
    """Coarse: index of a merged unit's operation list (-1: a single row)."""
    merged_ptr: np.ndarray
    """Merged unit ``i``'s operations are ``merged_ops[merged_ptr[i]:merged_ptr[i+1]]``."""
    merged_ops: np.ndarray


UNIT_ARRAYS = ("rep", "level", "pending", "merged", "merged_ptr", "merged_ops")
"""Every `Units` array, each sized by the chunk's operations (+1 for `merged_ptr`)."""


@inline
def unit_of(o, fine, links, units):
    """The unit operation `o` belongs to."""
    if fine:
        return o
    return units.rep[links.head[o]]


@inline
def is_unit(o, fine, links, units):
    """Whether `o` is the id of a unit."""
    return fine or (links.head[o] == o and units.rep[o] == o)


@jit
def reset_units(first, end, units):
    """Before coarse units are built: every row head is its own unit, no merged list."""
    for o in range(first, end):
        units.rep[o] = o
        units.merged[o] = -1
        units.level[o] = 0


@jit
def construct_batch(
    me, first, end, t0, t1, ops, part, links, dealt, values, fates, done, units, stats
):
    """This executor's part of a batch's construction in one call (every kernel call
    from Python types its arguments and takes the GIL, which the team's threads
    share): link operations first..end-1 dealt to it (`link_batch`, statistics added
    to ``stats``), fate its share t0..t1-1 of the transactions, and reset that share's
    `done` words and units. Returns the share's operations after the first of their
    transaction (LD)."""
    link_batch(me, first, end, ops, part, links, dealt, values, stats)
    txn_fates(t0, t1, ops, fates)
    o0, o1 = ops.txn_ptr[t0], ops.txn_ptr[t1]
    ld = o1 - o0
    for t in range(t0, t1):
        if ops.txn_ptr[t + 1] > ops.txn_ptr[t]:
            ld -= 1
    done[o0:o1] = 0
    reset_units(o0, o1, units)
    return ld


class CycleScratch(NamedTuple):
    """Executor 0's private scratch for `merge_cycles` (sized by the batch)."""

    node: np.ndarray
    """Per operation: node index of a row head with cross edges (-1)."""
    heads: np.ndarray
    """Per node: its row head."""
    edge_ptr: np.ndarray
    edges: np.ndarray
    index: np.ndarray
    low: np.ndarray
    on_stack: np.ndarray
    stack: np.ndarray
    calls: np.ndarray
    """Tarjan's explicit call stack: node, next edge."""
    call_edge: np.ndarray
    scc_ptr: np.ndarray
    scc_nodes: np.ndarray
    cursor: np.ndarray


def cycle_scratch(operations: int, reads: int) -> CycleScratch:
    """Scratch for batches of up to ``operations`` operations and ``reads`` reads."""
    n, e = max(1, operations), max(1, reads)
    return CycleScratch(
        node=np.full(n, -1, np.int64),
        heads=np.empty(n, np.int64),
        edge_ptr=np.zeros(n + 1, np.int64),
        edges=np.empty(e, np.int64),
        index=np.empty(n, np.int64),
        low=np.empty(n, np.int64),
        on_stack=np.zeros(n, np.int8),
        stack=np.empty(n, np.int64),
        calls=np.empty(n, np.int64),
        call_edge=np.empty(n, np.int64),
        scc_ptr=np.zeros(n + 1, np.int64),
        scc_nodes=np.empty(n, np.int64),
        cursor=np.zeros(n + 1, np.int64),
    )


@inline
def _cross_edge(k, o, first, links):
    """The row head read ``k`` of operation ``o`` depends on across rows, or -1."""
    q = links.dep_prev[k]
    if q < first:
        return -1
    hq = links.head[q]
    if hq == links.head[o]:
        return -1
    return hq


@jit
def merge_cycles(first, end, ops, links, units, g):
    """Coarse units of operations first..end-1 with cross-row PD edges: merge every
    strongly connected group of rows into one unit (`rep` = its first head, operations
    listed in ts order), and give every unit its stratum. Returns (units merged into
    another, cyclic groups, strata)."""
    # nodes: heads with a cross edge; edges head(q) -> head(o)
    n_nodes = 0
    n_edges = 0
    for o in range(first, end):
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            hq = _cross_edge(k, o, first, links)
            if hq < 0:
                continue
            n_edges += 1
            for h in (hq, links.head[o]):
                if g.node[h - first] < 0:
                    g.node[h - first] = n_nodes
                    g.heads[n_nodes] = h
                    n_nodes += 1
    g.edge_ptr[: n_nodes + 1] = 0
    for o in range(first, end):
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            hq = _cross_edge(k, o, first, links)
            if hq >= 0:
                g.edge_ptr[g.node[hq - first] + 1] += 1
    for i in range(n_nodes):
        g.edge_ptr[i + 1] += g.edge_ptr[i]
        g.cursor[i] = g.edge_ptr[i]
    for o in range(first, end):
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            hq = _cross_edge(k, o, first, links)
            if hq >= 0:
                i = g.node[hq - first]
                g.edges[g.cursor[i]] = g.node[links.head[o] - first]
                g.cursor[i] += 1
    n_sccs = _tarjan(n_nodes, g)
    # Tarjan emits SCCs in reverse topological order: walk them backwards for strata.
    merged_units = 0
    cyclic = 0
    strata = 1
    n_lists = 0
    for s in range(n_sccs - 1, -1, -1):
        a, b = g.scc_ptr[s], g.scc_ptr[s + 1]
        rep = g.heads[g.scc_nodes[a]]
        for j in range(a, b):
            rep = min(rep, g.heads[g.scc_nodes[j]])
        level = 0
        for j in range(a, b):
            level = max(level, units.level[g.heads[g.scc_nodes[j]]])
        for j in range(a, b):
            h = g.heads[g.scc_nodes[j]]
            units.rep[h] = rep
            units.level[h] = level
        if b - a > 1:
            cyclic += 1
            merged_units += b - a - 1
            units.merged[rep] = n_lists
            n_lists += 1
        strata = max(strata, level + 1)
        for j in range(a, b):
            i = g.scc_nodes[j]
            for e in range(g.edge_ptr[i], g.edge_ptr[i + 1]):
                h2 = g.heads[g.edges[e]]
                if units.rep[h2] != rep:  # an edge out of the group
                    units.level[h2] = max(units.level[h2], level + 1)
    _list_merged(first, end, links, units, n_lists)
    for i in range(n_nodes):
        g.node[g.heads[i] - first] = -1
    return merged_units, cyclic, strata


@inline
def _list_merged(first, end, links, units, n_lists):
    """The operations of every merged unit, in ts order."""
    units.merged_ptr[: n_lists + 1] = 0
    for o in range(first, end):
        m = units.merged[units.rep[links.head[o]]]
        if m >= 0:
            units.merged_ptr[m + 1] += 1
    for i in range(n_lists):
        units.merged_ptr[i + 1] += units.merged_ptr[i]
    for o in range(first, end):
        m = units.merged[units.rep[links.head[o]]]
        if m >= 0:
            units.merged_ops[units.merged_ptr[m]] = o
            units.merged_ptr[m] += 1
    for i in range(n_lists, 0, -1):
        units.merged_ptr[i] = units.merged_ptr[i - 1]
    units.merged_ptr[0] = 0


@inline
def _enter(g, v, counter, n_stack, depth):
    """Tarjan: visit node ``v`` (index it, push it, call it); the new counters."""
    g.index[v] = counter
    g.low[v] = counter
    g.stack[n_stack] = v
    g.on_stack[v] = 1
    g.calls[depth] = v
    g.call_edge[depth] = g.edge_ptr[v]
    return counter + 1, n_stack + 1, depth + 1


@inline
def _tarjan(n, g):
    """Strongly connected components of nodes 0..n-1 (edges `edge_ptr`/`edges`),
    iteratively; SCC ``s`` is ``scc_nodes[scc_ptr[s]:scc_ptr[s+1]]``, emitted in reverse
    topological order. Returns their count."""
    for i in range(n):
        g.index[i] = -1
    counter = 0
    depth = 0
    n_stack = 0
    n_sccs = 0
    filled = 0
    g.scc_ptr[0] = 0
    for root in range(n):
        if g.index[root] >= 0:
            continue
        counter, n_stack, depth = _enter(g, root, counter, n_stack, 0)
        while depth > 0:
            v = g.calls[depth - 1]
            e = g.call_edge[depth - 1]
            if e < g.edge_ptr[v + 1]:
                g.call_edge[depth - 1] = e + 1
                w = g.edges[e]
                if g.index[w] < 0:
                    counter, n_stack, depth = _enter(g, w, counter, n_stack, depth)
                elif g.on_stack[w]:
                    g.low[v] = min(g.low[v], g.index[w])
                continue
            depth -= 1
            if depth > 0:
                parent = g.calls[depth - 1]
                g.low[parent] = min(g.low[parent], g.low[v])
            if g.low[v] == g.index[v]:
                while True:
                    n_stack -= 1
                    w = g.stack[n_stack]
                    g.on_stack[w] = 0
                    g.scc_nodes[filled] = w
                    filled += 1
                    if w == v:
                        break
                n_sccs += 1
                g.scc_ptr[n_sccs] = filled
    return n_sccs


@jit
def fine_levels(me, first, end, own, ops, links, units, position, sync, timeout_ns, waited):
    """Strata of this executor's operations among first..end-1 (fine units: ``own``, the
    operations it linked, in ts order): one more than the TD and PD predecessors in the
    batch. A predecessor owned by another executor is waited for (its position word).
    Returns (OK or a sync error code, the highest stratum + 1)."""
    deadline = monotonic_ns() + timeout_ns
    strata = 1
    for o in own:
        store_release(position, STRIDE * me, o)
        level = 0
        p = links.chain_prev[o]
        if p >= first:
            level = units.level[p] + 1
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            q = links.dep_prev[k]
            if q >= first:
                why = wait_at_least(
                    position, STRIDE * links.owner[q], q + 1, sync, deadline, waited, False
                )
                if why != OK:
                    return why, strata
                level = max(level, units.level[q] + 1)
        units.level[o] = level
        strata = max(strata, level + 1)
    store_release(position, STRIDE * me, end)
    return OK, strata


@inline
def unit_start(u, units):
    """First operation of coarse unit ``u`` and the cursor to go on from."""
    m = units.merged[u]
    if m < 0:
        return u, -1
    i = units.merged_ptr[m]
    return units.merged_ops[i], i


@inline
def unit_next(u, x, i, links, units):
    """The operation after ``x`` (cursor ``i``) in coarse unit ``u``: (-1, _) at the end."""
    if i < 0:
        return links.row_next[x], -1
    i += 1
    if i < units.merged_ptr[units.merged[u] + 1]:
        return units.merged_ops[i], i
    return -1, i


@inline
def unit_owner(u, fine, links, units):
    """The executor that counts a unit's dependencies: its row's owner; executor 0 for a
    merged unit (it merged it)."""
    if not fine and units.merged[u] >= 0:
        return 0
    return links.owner[u]


@jit
def count_pending(me, first, end, fine, ops, links, units, spans, pools, pool_units):
    """Dependencies of the units executor ``me`` owns among operations first..end-1 (TD
    and PD in the batch for an operation; PD from other units for a coarse unit), and
    how many of its units are in each pool (added to ``pool_units``)."""
    for u in range(first, end):
        if not is_unit(u, fine, links, units) or unit_owner(u, fine, links, units) != me:
            continue
        pool_units[pool_of_row(row_of(ops.cell[u], spans), pools)] += 1
        n = 0
        if fine:
            if links.chain_prev[u] >= first:
                n += 1
            for k in range(ops.dep_ptr[u], ops.dep_ptr[u + 1]):
                if links.dep_prev[k] >= first:
                    n += 1
        else:
            x, i = unit_start(u, units)
            while x >= 0:
                for k in range(ops.dep_ptr[x], ops.dep_ptr[x + 1]):
                    q = links.dep_prev[k]
                    if q >= first and units.rep[links.head[q]] != u:
                        n += 1
                x, i = unit_next(u, x, i, links, units)
        store_release(units.pending, u, n)


@inline
def _unit(o, fine, links, units):
    return o if fine else units.rep[links.head[o]]


@jit
def work_strata(
    first, end, fine, own, alone, seat, strata, ops, links, units, n_merged, level_ptr, listed
):
    """This executor's operations of a batch for structured exploration, by stratum of
    their unit, in ts order within a stratum (`level_ptr` over `listed`; units of a
    stratum are independent, so their operations may interleave). ``alone`` (every pool
    has one executor): the operations it linked (``own``), with merged units (there are
    ``n_merged``) taken whole by their pool's executor; otherwise its pool's units that
    hash to it (``seat``: pool, index in pool, pool size). Returns how many."""
    level_ptr[: strata + 1] = 0
    for phase in range(2):
        for i in range(len(own) if alone else end - first):
            o = own[i] if alone else first + i
            u = _unit(o, fine, links, units)
            if alone and not fine and units.merged[u] >= 0:
                continue
            if not alone and not _assigned(u, ops, seat):
                continue
            _count_or_place(phase, units.level[u], o, level_ptr, listed)
        if alone and not fine:
            for m in range(n_merged):
                u = units.merged_ops[units.merged_ptr[m]]  # its first operation: its id
                if pool_of(u, ops, seat) != seat.pool:
                    continue
                for i in range(units.merged_ptr[m], units.merged_ptr[m + 1]):
                    _count_or_place(phase, units.level[u], units.merged_ops[i], level_ptr, listed)
        if phase == 0:
            for s in range(strata):
                level_ptr[s + 1] += level_ptr[s]
    for s in range(strata, 0, -1):
        level_ptr[s] = level_ptr[s - 1]
    level_ptr[0] = 0
    return level_ptr[strata]


@inline
def _count_or_place(phase, level, o, level_ptr, listed):
    """Counting sort by stratum: count (phase 0), then place (phase 1: ``level_ptr``
    holds each stratum's next free place)."""
    if phase == 0:
        level_ptr[level + 1] += 1
    else:
        listed[level_ptr[level]] = o
        level_ptr[level] += 1


@inline
def pool_of(o, ops, seat):
    """The pool of operation ``o``'s row (``seat``: `_explore.PoolSeat`)."""
    return pool_of_row(row_of(ops.cell[o], seat.spans), seat.pools)


@inline
def _assigned(u, ops, seat):
    """Whether unit ``u`` is this executor's: its pool, and its share by hash."""
    return pool_of(u, ops, seat) == seat.pool and hash64(u) % seat.size == seat.index
