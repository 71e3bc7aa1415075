"""Multi-versioned execution and exact abort handling, shared by the schedulers that
execute operations out of ts order (tstream, morphstream).

Every operation records the value it saw (`before`) and left (`after`): the versions
of its cell. A batch is first *explored*: operations run speculatively, each as soon
as its dependencies did, reading the latest version of every cell that does not
belong to a transaction known to have failed (an operation of a failed transaction
is rolled back by the next one on its chain: `undo_run`). Failures are recorded as
*fresh*.

Fresh failures are resolved by the Coordinator (`find_affected`, with the team
paused: at the end of exploration, or as soon as one happens): it marks, in ts
order, the executed operations that read a version a fresh failure (or a redo) may
change, and the transactions whose outcome may change (a conditional operation read
such a version). The team rolls the marked operations back (newest first) and *redoes*
them exactly (`redo`): before an operation, it waits until the transactions it reads
from are resolved and skips those that aborted. So no transaction ever sees an
aborted one's writes, and none aborts because of one: every result equals serial
execution's. An aborted run left at the end of a chain is rolled back at the end of
the chunk (`undo_aborted_tails`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from txstream.state._kernels import SET_FULL, UndoLog, apply_operation, undo_log, undo_write
from txstream.state._numba import inline, jit, monotonic_ns, store_release
from txstream.state.sync import OK, STRIDE, wait_at_least

SKIPPED, PASSED, FAILED = 0, 1, 2
"""What `explore_op` did."""


class Versions(NamedTuple):
    """What executing a chunk's operations recorded, per operation."""

    before: np.ndarray
    after: np.ndarray
    result: np.ndarray
    slot: np.ndarray
    """Distinct-set slot an operation filled (-1: none)."""
    ok: np.ndarray
    """int8: 0 where the operation's condition failed."""
    done: np.ndarray
    """int64: 1 once executed (exploration) - a word others wait on."""
    redo: np.ndarray
    """int8: marked by the Coordinator for the current redo."""
    marked: np.ndarray
    """The operations marked for the current redo, in ts order (the Coordinator's answer
    says how many)."""


class Fates(NamedTuple):
    """What is known of each transaction of a chunk."""

    failed: np.ndarray
    """int8: a statement failed (so far, or for good)."""
    fresh: np.ndarray
    """int8: failed in exploration, not yet resolved by the Coordinator."""
    affected: np.ndarray
    """int8: its outcome may change: redone whole (current redo)."""
    last_cond: np.ndarray
    """int64: its last conditional operation (-1: it cannot abort)."""


VERSION_ARRAYS = {
    "before": ("int64", "operations"),
    "after": ("int64", "operations"),
    "result": ("int64", "operations"),
    "slot": ("int64", "operations"),
    "ok": ("int8", "operations"),
    "done": ("int64", "operations"),
    "redo": ("int8", "operations"),
    "marked": ("int64", "operations"),
    "failed": ("int8", "transactions"),
    "fresh": ("int8", "transactions"),
    "affected": ("int8", "transactions"),
    "last_cond": ("int64", "transactions"),
}
"""Every `Versions` and `Fates` array: dtype, and the chunk dimension it is sized by."""


class Scratch(NamedTuple):
    """Per-executor scratch of the execution kernels."""

    reads: np.ndarray
    log: UndoLog
    waited: np.ndarray
    """[0] ns spent waiting for peers, [1] ns rolling back, [2] operations that failed."""


def scratch(max_reads: int, max_txn_ops: int) -> Scratch:
    """Scratch for operations reading at most ``max_reads`` cells, in transactions of
    at most ``max_txn_ops`` operations."""
    return Scratch(
        np.empty(max(1, max_reads), np.int64), undo_log(max_txn_ops), np.zeros(3, np.int64)
    )


@inline
def undo_run(o, ops, links, v, state):
    """Roll back the run of one transaction's operations on a chain that ends at `o`:
    newest first, removing members they added to a distinct set."""
    t = ops.txn[o]
    c = ops.cell[o]
    while o >= 0 and ops.txn[o] == t:
        undo_write(state, c, v.before[o], v.slot[o])
        o = links.chain_prev[o]


@inline
def version_read(k, t, ops, links, v, fates):
    """The value read ``k`` of an operation of transaction ``t`` sees: the version left
    by the last operation before it on the cell, or, if that one's transaction failed,
    the version before that transaction's run."""
    q = links.dep_prev[k]
    if q < 0:
        return links.dep_initial[k]
    tq = ops.txn[q]
    if tq == t or fates.failed[tq] == 0:
        return v.after[q]
    while links.chain_prev[q] >= 0 and ops.txn[links.chain_prev[q]] == tq:
        q = links.chain_prev[q]
    return v.before[q]


@inline
def _earlier_failed(o, t, ops, v):
    """Whether a statement of `t` before `o` was executed and failed."""
    for e in range(ops.txn_ptr[t], o):
        if v.done[e] and v.ok[e] == 0:
            return True
    return False


@inline
def _apply(o, n_reads, ops, v, fates, state, udf, s):
    """Apply operation `o` on ``s.reads[:n_reads]`` and record its version: PASSED,
    FAILED (its transaction is marked failed) or SET_FULL."""
    passed, value, n_log = apply_operation(o, ops, state, udf, s.reads, n_reads, s.log, 0)
    if not passed and value == SET_FULL:
        return SET_FULL
    v.after[o] = state.values[ops.cell[o]]
    v.result[o] = value
    v.slot[o] = s.log.slot[0] if n_log > 0 else -1
    v.ok[o] = passed
    if passed:
        return PASSED
    fates.failed[ops.txn[o]] = 1
    return FAILED


@inline
def explore_op(o, ops, links, v, fates, state, udf, s):
    """Execute operation `o` speculatively (its dependencies are done): SKIPPED,
    PASSED, FAILED, or SET_FULL. Skipped: a statement without condition of a
    transaction known to have failed, or any statement after one that failed."""
    t = ops.txn[o]
    c = ops.cell[o]
    p = links.chain_prev[o]
    if p >= 0 and ops.txn[p] != t and fates.failed[ops.txn[p]]:
        undo_run(p, ops, links, v, state)
    first_read = ops.dep_ptr[o]
    n_reads = ops.dep_ptr[o + 1] - first_read
    for k in range(first_read, first_read + n_reads):
        s.reads[k - first_read] = version_read(k, t, ops, links, v, fates)
    v.before[o] = state.values[c]
    status = PASSED
    if fates.failed[t] and (ops.cond[o] == 0 or _earlier_failed(o, t, ops, v)):
        v.after[o] = v.before[o]
        v.slot[o] = -1
        v.ok[o] = 1
        status = SKIPPED
    else:
        status = _apply(o, n_reads, ops, v, fates, state, udf, s)
        if status == SET_FULL:
            return SET_FULL
        if status == FAILED:
            fates.fresh[t] = 1
            s.waited[2] += 1
    store_release(v.done, o, 1)
    return status


@inline
def _wait_resolved(t, ops, links, position, sync, deadline, s):
    """Wait until every conditional operation of transaction `t` was redone (by
    whichever executors own them): then ``failed[t]`` is final."""
    for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
        if ops.cond[o] > 0:
            why = wait_at_least(
                position, STRIDE * links.owner[o], o + 1, sync, deadline, s.waited, False
            )
            if why != OK:
                return why
    return OK


@jit
def redo(me, first, end, n_marked, ops, links, v, fates, state, udf, position, sync, timeout_ns, s):
    """Redo this executor's operations among the ``n_marked`` first of ``v.marked``
    (operations first..end-1 of a batch, rolled back before), exactly, in ts order;
    `position[STRIDE * me]` tells how far it is. Returns OK, a `txstream.state.sync`
    error code, or SET_FULL."""
    deadline = monotonic_ns() + timeout_ns
    for i in range(n_marked):
        o = v.marked[i]
        if links.owner[o] != me:
            continue
        store_release(position, STRIDE * me, o)
        t = ops.txn[o]
        c = ops.cell[o]
        p = links.chain_prev[o]
        if p >= 0 and ops.txn[p] != t:
            tp = ops.txn[p]
            if p >= first and fates.affected[tp] and fates.last_cond[tp] >= 0:
                why = _wait_resolved(tp, ops, links, position, sync, deadline, s)
                if why != OK:
                    return why
            if fates.failed[tp]:
                start = monotonic_ns()
                undo_run(p, ops, links, v, state)
                s.waited[1] += monotonic_ns() - start
        first_read = ops.dep_ptr[o]
        n_reads = ops.dep_ptr[o + 1] - first_read
        for k in range(first_read, first_read + n_reads):
            q = links.dep_prev[k]
            if q >= first and v.redo[q]:
                owner = links.owner[q]
                why = wait_at_least(
                    position, STRIDE * owner, q + 1, sync, deadline, s.waited, False
                )
                if why != OK:
                    return why
            if q >= first and ops.txn[q] != t:
                tq = ops.txn[q]
                if fates.affected[tq] and fates.last_cond[tq] >= 0:
                    why = _wait_resolved(tq, ops, links, position, sync, deadline, s)
                    if why != OK:
                        return why
            s.reads[k - first_read] = version_read(k, t, ops, links, v, fates)
        v.before[o] = state.values[c]
        if fates.failed[t] and not fates.affected[t]:
            v.after[o] = v.before[o]  # aborts for good (it failed on exact inputs)
            v.slot[o] = -1
            continue
        if _apply(o, n_reads, ops, v, fates, state, udf, s) == SET_FULL:
            return SET_FULL
    store_release(position, STRIDE * me, end)
    return OK


@jit
def roll_back_marked(me, first, n_marked, ops, links, v, state):
    """Before a redo: undo this executor's marked operations (the ``n_marked`` first of
    ``v.marked``; on every cell they are the last ones executed): each cell gets back
    what its first marked operation found, members they added leave their sets."""
    for i in range(n_marked):
        o = v.marked[i]
        if links.owner[o] != me:
            continue
        p = links.chain_prev[o]
        c = ops.cell[o]
        first_on_cell = p < first or not v.redo[p]
        undo_write(state, c, v.before[o] if first_on_cell else state.values[c], v.slot[o])


@jit
def clear_marks(me, n_marked, ops, links, v, fates):
    """After a redo (the team past a barrier): forget this executor's marks."""
    for i in range(n_marked):
        o = v.marked[i]
        if links.owner[o] == me:
            v.redo[o] = 0
            fates.affected[ops.txn[o]] = 0


@jit
def undo_aborted_tails(first, end, ops, links, v, fates, state):
    """At the end of a chunk: roll back the last run of every chain among operations
    first..end-1 whose transaction aborted (earlier runs were rolled back by their
    successors)."""
    for o in range(first, end):
        if links.chain_next[o] < 0 and fates.failed[ops.txn[o]]:
            undo_run(o, ops, links, v, state)


@inline
def _changed(o, v):
    """Whether operation ``o`` changed its cell or added a set member."""
    return v.after[o] != v.before[o] or v.slot[o] >= 0


@inline
def wrote(t, ops, v):
    """Whether an executed operation of transaction `t` changed something."""
    for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
        if v.done[o] and _changed(o, v):
            return True
    return False


@inline
def _push_successors(o, skip, first, end, ops, links, v, stack, n):
    """Push the executed operations that read the version `o` left (the next one on its
    cell, its parametric readers) onto ``stack[n:]``, except those of transaction
    ``skip`` (-1: none); the new ``n``."""
    nxt = links.chain_next[o]
    while first <= nxt < end and ops.txn[nxt] == skip:
        nxt = links.chain_next[nxt]
    if first <= nxt < end and v.done[nxt]:
        stack[n] = nxt
        n += 1
    k = links.pd_head[o]
    while k >= 0:
        reader = links.read_op[k]
        if reader < end and v.done[reader] and ops.txn[reader] != skip:
            stack[n] = reader
            n += 1
        k = links.pd_next[k]
    return n


@inline
def _last_on_cell(o, t, ops, links):
    """Whether ``o`` is transaction ``t``'s last statement on its cell."""
    nxt = links.chain_next[o]
    return nxt < 0 or ops.txn[nxt] != t


@inline
def _cell_changed(o, t, ops, links, v):
    """Whether an executed statement of transaction ``t`` on ``o``'s cell, up to ``o``,
    changed it (a transaction's statements on a cell are adjacent on its chain)."""
    p = o
    while p >= 0 and ops.txn[p] == t:
        if v.done[p] and _changed(p, v):
            return True
        p = links.chain_prev[p]
    return False


@inline
def _left_changed(o, t, ops, links, v):
    """Whether executed statement ``o`` of transaction ``t`` left its cell changed for
    the operations after it (the version others read of it)."""
    return v.done[o] and _last_on_cell(o, t, ops, links) and _cell_changed(o, t, ops, links, v)


@jit
def settle_unchanged(begin, end, ops, links, v, fates):
    """The team's pass before the Coordinator's, over transactions begin..end-1 (each
    executor its share): a fresh failure of a transaction that left no cell changed made
    nothing wrong (what `find_affected` would conclude), so it is no longer fresh.
    Returns (fresh failures left for `find_affected`, failures settled)."""
    left = 0
    settled = 0
    for t in range(begin, end):
        if not fates.fresh[t]:
            continue
        changed = False
        if fates.failed[t]:
            for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
                if _left_changed(o, t, ops, links, v):
                    changed = True
                    break
        if changed:
            left += 1
        else:
            fates.fresh[t] = 0
            settled += 1
    return left, settled


@jit
def find_affected(begin, end, ops, links, v, fates, stack):
    """The Coordinator's pass over transactions begin..end-1 of a batch, considering the
    operations executed so far (`done`): marks (``v.redo``, and listed in ``v.marked``
    in ts order) every executed operation that read, directly or through other marked
    operations, a version a fresh failure wrote; a marked conditional operation makes
    its transaction's outcome uncertain: it is `affected` (its failure forgotten) and
    all its executed operations are marked too. Fresh failures are resolved afterwards.
    Work is proportional to what is marked, not to the batch. ``stack`` is scratch
    (room for twice the operations plus the reads). Returns how many are marked."""
    first, stop = ops.txn_ptr[begin], ops.txn_ptr[end]
    n = 0
    for t in range(begin, end):
        if fates.fresh[t]:
            fates.fresh[t] = 0
            if fates.failed[t]:
                for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
                    # what others read of a cell is the version the transaction's last
                    # statement on it left: wrong if any of its statements there changed it
                    if _left_changed(o, t, ops, links, v):
                        n = _push_successors(o, t, first, stop, ops, links, v, stack, n)
    marked = 0
    while n > 0:
        n -= 1
        o = stack[n]
        if v.redo[o]:
            continue
        v.redo[o] = 1
        v.marked[marked] = o
        marked += 1
        n = _push_successors(o, -1, first, stop, ops, links, v, stack, n)
        t = ops.txn[o]
        if ops.cond[o] > 0 and not fates.affected[t]:
            fates.affected[t] = 1
            fates.failed[t] = 0
            for x in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
                if v.done[x] and not v.redo[x]:
                    stack[n] = x
                    n += 1
    _heap_sort(v.marked, marked)
    return marked


@inline
def _heap_sort(a, n):
    """Sort ``a[:n]`` ascending in place (numba's sort needs its runtime)."""
    for start in range(n // 2 - 1, -1, -1):
        _sift(a, start, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift(a, 0, end)


@inline
def _sift(a, root, n):
    while True:
        child = 2 * root + 1
        if child >= n:
            return
        if child + 1 < n and a[child + 1] > a[child]:
            child += 1
        if a[root] >= a[child]:
            return
        a[root], a[child] = a[child], a[root]
        root = child
