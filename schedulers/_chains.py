"""TStream kernels: work pools of rows, and the ts-order evaluation of operation chains.

An *operation chain* is the operations of one state cell in ts order (`Links`). The
chains of one row go to one executor, which evaluates its operations in ts order,
so it only ever waits for operations *before* its own: the executor furthest behind
never waits; the team cannot deadlock.
"""

from __future__ import annotations

from txstream.schedulers.team._versions import explore_op
from txstream.schedulers.team.placement import pool_of_row
from txstream.state._kernels import SET_FULL
from txstream.state._numba import fetch_add, inline, jit, monotonic_ns, store_release
from txstream.state.layout import row_of
from txstream.state.sync import OK, STRIDE, wait_at_least


@jit
def pool_rows(first, end, ops, spans, pools, row_ops, fill, claims, claim_ops, pool_ptr):
    """Work pools: the rows operations first..end-1 touch (``spans``: `Layout.spans`),
    grouped by pool, busiest first, with their operation counts. ``row_ops`` (per row,
    all 0) and ``fill`` (per pool) are scratch; ``row_ops`` is left all 0. Returns the
    number of rows."""
    n_rows = 0
    for o in range(first, end):
        r = row_of(ops.cell[o], spans)
        if row_ops[r] == 0:
            claims[n_rows] = r
            n_rows += 1
        row_ops[r] += 1
    # counting sort by pool, then insertion into each pool by descending operations
    pool_ptr[:] = 0
    for i in range(n_rows):
        pool_ptr[pool_of_row(claims[i], pools) + 1] += 1
    for p in range(pools):
        pool_ptr[p + 1] += pool_ptr[p]
    for p in range(pools):
        fill[p] = pool_ptr[p]
    for i in range(n_rows):
        r = claims[i]
        p = pool_of_row(r, pools)
        j = fill[p]
        fill[p] = j + 1
        claim_ops[j] = r  # rows in pool order, for now
    for i in range(n_rows):
        claims[i] = claim_ops[i]
        claim_ops[i] = row_ops[claims[i]]
    for p in range(pools):
        _sort_descending(claims, claim_ops, pool_ptr[p], pool_ptr[p + 1])
    for i in range(n_rows):
        row_ops[claims[i]] = 0
    return n_rows


@inline
def _sort_descending(keys, ops, begin, end):
    """Shell sort of keys[begin:end] by descending ops (numba has no argsort-in-place)."""
    gap = (end - begin) // 2
    while gap > 0:
        for i in range(begin + gap, end):
            k, w = keys[i], ops[i]
            j = i
            while j - gap >= begin and ops[j - gap] < w:
                keys[j], ops[j] = keys[j - gap], ops[j - gap]
                j -= gap
            keys[j], ops[j] = k, w
        gap //= 2


@jit
def claim_rows(me, begin, end, claims, claim_ops, row_owner, words, counter, quota):
    """Work stealing from a pool: take the next unclaimed row (busiest first) with all
    its chains until ``quota`` operations are taken or the pool is empty (``words
    [counter]`` counts the rows claimed)."""
    taken = 0
    while taken < quota:
        i = begin + fetch_add(words, counter, 1)
        if i >= end:
            break
        row_owner[claims[i]] = me
        taken += claim_ops[i]
    return taken


@jit
def fill_owners(first, end, ops, spans, row_owner, owner):
    """The owner of operations first..end-1: the owner of their row (read once here,
    then in ts order by the kernels)."""
    for o in range(first, end):
        owner[o] = row_owner[row_of(ops.cell[o], spans)]


@jit
def explore_chains(me, first, end, ops, links, v, fates, state, udf, position, sync, timeout_ns, s):
    """Explore this executor's operations among first..end-1 in ts order, waiting only
    for the operations its parametric reads read (owned by others). Returns OK, a
    `txstream.state.sync` error code, or SET_FULL; ns waiting go to ``s.waited[0]``."""
    deadline = monotonic_ns() + timeout_ns
    for o in range(first, end):
        if links.owner[o] != me:
            continue
        store_release(position, STRIDE * me, o)
        for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            q = links.dep_prev[k]
            if q >= first:
                why = wait_at_least(
                    position, STRIDE * links.owner[q], q + 1, sync, deadline, s.waited, False
                )
                if why != OK:
                    return why
        if explore_op(o, ops, links, v, fates, state, udf, s) == SET_FULL:
            return SET_FULL
    store_release(position, STRIDE * me, end)
    return OK
