"""MorphStream's explorations of a TPG (SIGMOD'23 §4.1), over fine or coarse units.

- BFS: the strata in order; each executor runs the operations it listed for a stratum
  (`_tpg.work_strata`: its pool's units, shared by hash among the pool's executors;
  alone in its pool, the operations it linked), then those the executors of its socket
  listed and have not started yet, then the team meets at a barrier. An operation
  waits for its predecessors in the stratum (a coarse unit's earlier operations, when
  another executor took them); every other dependency is in an earlier stratum.
- DFS: the same operations, no barrier: before one, its executor waits until the
  operations it depends on in other units are done (their `done` words).
- NS: any executor of a pool takes any ready unit of the pool from a shared queue;
  a finished unit counts its dependents down (atomics) and queues those that reach 0.

Units run speculatively (`explore_op`). With eager aborts a failure of a transaction
that already wrote something raises the team's *repair* flag; executors leave the
kernel at their next safe point (between units, or while waiting) with REPAIR, resolve
the failure with the Coordinator, and call the kernel again: it resumes from its
``cursor``. BFS checks for failures at its
barriers instead. An executor done with its work waits in `_finish` until all are
(or a repair is asked for). Kernels return ALL_DONE, REPAIR, a `txstream.state.sync`
error code or SET_FULL.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from txstream.schedulers._tpg import pool_of, unit_next, unit_start
from txstream.schedulers.team._versions import FAILED, explore_op, wrote
from txstream.state._kernels import SET_FULL
from txstream.state._numba import (
    compare_exchange,
    fetch_add,
    inline,
    jit,
    load_acquire,
    monotonic_ns,
    store_release,
)
from txstream.state.sync import (
    INTERRUPTED,
    OK,
    PAUSE,
    STRIDE,
    barrier_wait,
    wait_at_least,
)

ALL_DONE, REPAIR = 10, INTERRUPTED
"""What the kernels return besides sync error codes: REPAIR means the team's PAUSE word
asks for a repair."""
FINISHED, FRESH, BY_STRATUM = 0, 1, 2
"""Words (index / STRIDE) of the team's exploration words: how many executors finished
the batch, failures so far in the batch, and (BFS) failures that asked for a repair
(eager) in even and odd strata: a stratum's count is read after its barrier and not
written again before the next one, so every executor reads the same."""
QUEUE = 4
"""Then per pool: its ready queue's head (units taken), tail (units queued), total."""


def word_count(pools: int) -> int:
    """How many words (each on its own cache line) the exploration words take."""
    return STRIDE * (QUEUE + 3 * pools)


def total_word(pool: int) -> int:
    """Index of the word counting the units of ``pool``'s queue."""
    return STRIDE * (QUEUE + 3 * pool + 2)


class Exploration(NamedTuple):
    """One batch's exploration: its operations and the choices made for it."""

    first: int
    end: int
    fine: bool
    eager: bool


class Tpg(NamedTuple):
    """The graph and what executing it records (`_links`, `_versions`, `_tpg`)."""

    ops: object
    links: object
    versions: object
    fates: object
    units: object


class PoolSeat(NamedTuple):
    """This executor in its pool, and the team's words."""

    rank: int
    pool: int
    index: int
    """Its rank among the pool's executors."""
    size: int
    """Executors in the pool."""
    parties: int
    pools: int
    spans: np.ndarray
    """The layout's spans (`Layout.spans`): the row of each cell."""
    words: np.ndarray
    ready: np.ndarray
    """Per pool, a region of ``capacity`` entries holding queued units + 1."""
    capacity: int
    listed: np.ndarray
    """Per executor, a region of ``capacity`` entries: the operations it listed for the
    batch's strata (`Strata.listed` is this executor's)."""
    claims: np.ndarray
    """Per executor (stride `STRIDE`): how many entries of its region were taken, and
    where its current stratum's entries end (`claim_word`, `stop_word`)."""
    neighbours: np.ndarray
    """Ranks on this executor's socket, itself first (`Seat.socket_ranks`)."""
    sync: np.ndarray
    timeout_ns: int


class Strata(NamedTuple):
    """This executor's operations by stratum of their unit (`_tpg.work_strata`)."""

    count: int
    level_ptr: np.ndarray
    listed: np.ndarray


@inline
def _ran(o, status, b, g, seat):
    """After operation ``o`` ran with ``status``: a failure is counted, and, when aborts
    are eager and the failed transaction already wrote something others may have read,
    the team is asked to pause for a repair (a failure that changed nothing yet needs
    none now: its later statements are skipped; the batch's last repair resolves it).
    Whether a repair was asked for."""
    if status != FAILED:
        return False
    fetch_add(seat.words, STRIDE * FRESH, 1)
    if b.eager and wrote(g.ops.txn[o], g.ops, g.versions):
        store_release(seat.sync, STRIDE * PAUSE, 1)
        return True
    return False


@inline
def run_unit(u, b, g, state, udf, s, seat):
    """Run unit ``u`` (its operations in ts order): OK or SET_FULL."""
    x, i = (u, -1) if b.fine else unit_start(u, g.units)
    while x >= 0:
        status = explore_op(x, g.ops, g.links, g.versions, g.fates, state, udf, s)
        if status == SET_FULL:
            return SET_FULL
        _ran(x, status, b, g, seat)
        x, i = (-1, -1) if b.fine else unit_next(u, x, i, g.links, g.units)
    return OK


def claim_words(parties: int) -> int:
    """How many words `PoolSeat.claims` takes."""
    return 2 * STRIDE * parties


@inline
def claim_word(e):
    """Index of the word counting the entries of executor ``e``'s region taken."""
    return 2 * STRIDE * e


@inline
def stop_word(e):
    """Index of the word where executor ``e``'s current stratum's entries end."""
    return 2 * STRIDE * e + STRIDE


@inline
def _take(e, seat):
    """Take the next entry of executor ``e``'s current stratum: its index, or -1 when
    none is left. Entries are taken in order, each by one executor; the count never
    passes the stratum's end, so it starts the next stratum at its first entry."""
    stop = load_acquire(seat.claims, stop_word(e))
    while True:
        i = load_acquire(seat.claims, claim_word(e))
        if i >= stop:
            return -1
        if compare_exchange(seat.claims, claim_word(e), i, i + 1) == i:
            return i


@inline
def _wait_predecessors(o, b, g, seat, deadline, s):
    """BFS: wait until the operations before ``o`` on its cell and those it reads in the
    batch are done (not interruptible: every executor finishes its stratum)."""
    p = g.links.chain_prev[o]
    if p >= b.first:
        why = wait_at_least(g.versions.done, p, 1, seat.sync, deadline, s.waited, False)
        if why != OK:
            return why
    for k in range(g.ops.dep_ptr[o], g.ops.dep_ptr[o + 1]):
        q = g.links.dep_prev[k]
        if q >= b.first:
            why = wait_at_least(g.versions.done, q, 1, seat.sync, deadline, s.waited, False)
            if why != OK:
                return why
    return OK


@jit
def explore_bfs(b, g, state, udf, s, seat, strata, cursor):
    """BFS from stratum ``cursor[0]``: this executor takes the entries it listed for the
    stratum (ts order), then those of its neighbours not taken yet (an executor's list
    ends unevenly: its rows' share of the stratum, and the cores' other work, vary),
    each after its predecessors (`_wait_predecessors`); then the barrier. Eager: REPAIR
    after a stratum in which a failure asked for one (``cursor[4 + parity]``: such
    failures of that parity seen)."""
    deadline = monotonic_ns() + seat.timeout_ns
    for level in range(cursor[0], strata.count):
        parity = STRIDE * (BY_STRATUM + level % 2)
        store_release(seat.claims, stop_word(seat.rank), strata.level_ptr[level + 1])
        for e in seat.neighbours:
            i = _take(e, seat)
            while i >= 0:
                o = seat.listed[e * seat.capacity + i]
                why = _wait_predecessors(o, b, g, seat, deadline, s)
                if why != OK:
                    return why
                status = explore_op(o, g.ops, g.links, g.versions, g.fates, state, udf, s)
                if status == SET_FULL:
                    return SET_FULL
                if _ran(o, status, b, g, seat):
                    fetch_add(seat.words, parity, 1)
                i = _take(e, seat)
        start = monotonic_ns()
        why = barrier_wait(seat.sync, seat.parties, seat.timeout_ns)
        s.waited[0] += monotonic_ns() - start
        if why != OK:
            return why
        cursor[0] = level + 1
        failures = load_acquire(seat.words, parity)
        if failures > cursor[4 + level % 2]:
            cursor[4 + level % 2] = failures
            return REPAIR
    return ALL_DONE


@inline
def _repair_asked(seat):
    """Whether a peer asked the team to pause for a repair (eager aborts)."""
    return load_acquire(seat.sync, STRIDE * PAUSE) != 0


@inline
def _wait_done(q, g, seat, deadline, s):
    """Wait until operation ``q`` is done: OK, REPAIR or a sync error code."""
    return wait_at_least(g.versions.done, q, 1, seat.sync, deadline, s.waited, True)


@inline
def _wait_dependencies(o, b, g, seat, deadline, s):
    """DFS: wait until the operations ``o`` depends on in other units are done (those of
    its own unit ran before it, on this executor)."""
    ops, links, units = g.ops, g.links, g.units
    if b.fine:
        p = links.chain_prev[o]
        if p >= b.first:
            why = _wait_done(p, g, seat, deadline, s)
            if why != OK:
                return why
    u = o if b.fine else units.rep[links.head[o]]
    for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
        q = links.dep_prev[k]
        if q >= b.first and (b.fine or units.rep[links.head[q]] != u):
            why = _wait_done(q, g, seat, deadline, s)
            if why != OK:
                return why
    return OK


@inline
def _finish(seat, cursor, deadline, s):
    """This executor is done: wait until every one is (ALL_DONE) or a repair is asked
    for (REPAIR); ``cursor[1]`` remembers it was counted."""
    if not cursor[1]:
        cursor[1] = 1
        fetch_add(seat.words, STRIDE * FINISHED, 1)
    why = wait_at_least(
        seat.words, STRIDE * FINISHED, seat.parties, seat.sync, deadline, s.waited, True
    )
    return ALL_DONE if why == OK else why


@jit
def explore_dfs(b, g, state, udf, s, seat, strata, cursor):
    """DFS over this executor's operations by stratum, from the ``cursor[3]``-th: each
    waits for its dependencies, not for the stratum."""
    deadline = monotonic_ns() + seat.timeout_ns
    for i in range(cursor[3], strata.level_ptr[strata.count]):
        o = strata.listed[i]
        why = REPAIR if _repair_asked(seat) else _wait_dependencies(o, b, g, seat, deadline, s)
        if why != OK:
            cursor[3] = i
            return why
        status = explore_op(o, g.ops, g.links, g.versions, g.fates, state, udf, s)
        if status == SET_FULL:
            return SET_FULL
        _ran(o, status, b, g, seat)
    cursor[3] = strata.level_ptr[strata.count]
    return _finish(seat, cursor, deadline, s)


@inline
def _queue(x, g, seat):
    """Put unit ``x`` (all its dependencies done) in its pool's ready queue."""
    pool = pool_of(x, g.ops, seat)
    i = fetch_add(seat.words, STRIDE * (QUEUE + 3 * pool + 1), 1)
    store_release(seat.ready, pool * seat.capacity + i, x + 1)


@inline
def _count_down(x, g, seat):
    if fetch_add(g.units.pending, x, -1) == 1:
        _queue(x, g, seat)


@inline
def _release(u, b, g, seat):
    """NS: unit ``u`` is done; count its dependents down."""
    links, units = g.links, g.units
    if b.fine:
        nxt = links.chain_next[u]
        if b.first <= nxt < b.end:
            _count_down(nxt, g, seat)
        k = links.pd_head[u]
        while k >= 0:
            _count_down(links.read_op[k], g, seat)
            k = links.pd_next[k]
        return
    x, i = unit_start(u, units)
    while x >= 0:
        k = links.pd_head[x]
        while k >= 0:
            target = units.rep[links.head[links.read_op[k]]]
            if target != u:
                _count_down(target, g, seat)
            k = links.pd_next[k]
        x, i = unit_next(u, x, i, links, units)


@jit
def queue_ready(first, end, g, seat, fine, me):
    """NS, before exploring: queue the units without dependencies that ``me`` counted
    (`_tpg.count_pending`)."""
    for u in range(first, end):
        owner = 0 if (not fine and g.units.merged[u] >= 0) else g.links.owner[u]
        if owner != me:
            continue
        if (fine or (g.links.head[u] == u and g.units.rep[u] == u)) and g.units.pending[u] == 0:
            _queue(u, g, seat)


@jit
def explore_ns(b, g, state, udf, s, seat, cursor):
    """NS: take ready units of this executor's pool until every one was taken; then
    `_finish`. ``cursor[0]`` is an entry taken but not yet filled (-1: none)."""
    deadline = monotonic_ns() + seat.timeout_ns
    base = seat.pool * seat.capacity
    head = STRIDE * (QUEUE + 3 * seat.pool)
    total = load_acquire(seat.words, head + 2 * STRIDE)
    while True:
        if cursor[0] < 0:
            if _repair_asked(seat):
                return REPAIR
            cursor[0] = fetch_add(seat.words, head, 1)
        i = cursor[0]
        if i >= total:
            break
        why = wait_at_least(seat.ready, base + i, 1, seat.sync, deadline, s.waited, True)
        if why != OK:
            return why  # REPAIR: this entry stays taken (cursor[0])
        u = seat.ready[base + i] - 1
        seat.ready[base + i] = 0
        cursor[0] = -1
        if run_unit(u, b, g, state, udf, s, seat) == SET_FULL:
            return SET_FULL
        _release(u, b, g, seat)
    return _finish(seat, cursor, deadline, s)
