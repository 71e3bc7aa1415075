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
from txstream._numba import inline, jit, monotonic_ns, store_release
from txstream.state._kernels import SET_FULL, UndoLog, apply_operation, undo_log, undo_write
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
def _wait_resolved(t, ops, links, progress, sync, deadline, s):
    """Wait until every conditional operation of transaction `t` was redone (by
    whichever executors own them): then ``failed[t]`` is final."""
    for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
        if ops.cond[o] > 0:
            why = wait_at_least(progress, STRIDE * links.owner[o], o + 1, sync, deadline, s.waited)
            if why != OK:
                return why
    return OK


@jit
def redo(me, first, end, ops, links, v, fates, state, udf, progress, sync, timeout_ns, s):
    """Redo this executor's marked operations among first..end-1 (rolled back before),
    exactly, in ts order; `progress[STRIDE * me]` tells how far it is. Returns OK, a
    `txstream.state.sync` error code, or SET_FULL."""
    deadline = monotonic_ns() + timeout_ns
    for o in range(first, end):
        if links.owner[o] != me or not v.redo[o]:
            continue
        store_release(progress, STRIDE * me, o)
        t = ops.txn[o]
        c = ops.cell[o]
        p = links.chain_prev[o]
        if p >= 0 and ops.txn[p] != t:
            tp = ops.txn[p]
            if p >= first and fates.affected[tp] and fates.last_cond[tp] >= 0:
                why = _wait_resolved(tp, ops, links, progress, sync, deadline, s)
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
                why = wait_at_least(progress, STRIDE * owner, q + 1, sync, deadline, s.waited)
                if why != OK:
                    return why
            if q >= first and ops.txn[q] != t:
                tq = ops.txn[q]
                if fates.affected[tq] and fates.last_cond[tq] >= 0:
                    why = _wait_resolved(tq, ops, links, progress, sync, deadline, s)
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
    store_release(progress, STRIDE * me, end)
    return OK


@jit
def roll_back_marked(me, first, end, ops, links, v, state):
    """Before a redo: undo this executor's marked operations among first..end-1, newest
    first (each cell ends as its first marked operation found it)."""
    for o in range(end - 1, first - 1, -1):
        if links.owner[o] == me and v.redo[o]:
            undo_write(state, ops.cell[o], v.before[o], v.slot[o])


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
def _reads_dirty(o, ops, dirty):
    if dirty[ops.cell[o]]:
        return True
    for k in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
        if dirty[ops.dep_cell[k]]:
            return True
    return False


@jit
def find_affected(begin, end, ops, v, fates, dirty):
    """The Coordinator's pass over transactions begin..end-1 in ts order, considering
    the operations executed so far (`done`). A fresh failure that changed a cell makes
    it *dirty* for the rest of the batch, unless its own outcome may change. An
    executed operation that reads a dirty cell (its own or a parametric read) is marked
    for redo and leaves its cell dirty; if it is conditional, its transaction's outcome
    may change: the transaction is `affected` (its failure forgotten), all its executed
    operations are marked and all its cells dirty. Fresh failures are resolved
    afterwards. ``dirty`` (per cell, all 0) is scratch, left all 0. Returns how many
    operations are marked."""
    first = end
    for t in range(begin, end):
        fates.affected[t] = 0
        if first == end and fates.fresh[t]:
            for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
                if v.done[o] and _changed(o, v):
                    first = t
                    break
    for o in range(ops.txn_ptr[begin], ops.txn_ptr[end]):
        v.redo[o] = 0
    marked = 0
    for t in range(first, end):
        fate_dirty = False
        for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
            if v.done[o] and _reads_dirty(o, ops, dirty):
                v.redo[o] = 1
                dirty[ops.cell[o]] = 1
                if ops.cond[o] > 0:
                    fate_dirty = True
        if fate_dirty:
            fates.affected[t] = 1
            fates.failed[t] = 0
        for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
            if not v.done[o]:
                continue
            if fate_dirty:
                v.redo[o] = 1
                dirty[ops.cell[o]] = 1
            elif fates.fresh[t] and fates.failed[t] and _changed(o, v):
                dirty[ops.cell[o]] = 1
            marked += v.redo[o]
    for t in range(begin, end):
        fates.fresh[t] = 0
    for o in range(ops.txn_ptr[first], ops.txn_ptr[end]):
        dirty[ops.cell[o]] = 0
    return marked
