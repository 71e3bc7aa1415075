"""Scheduler kernels: arrays in, arrays out, no Ray, Arrow or exceptions inside."""

from __future__ import annotations

import numpy as np
from txstream.state._kernels import (
    SET_FULL,
    UndoLog,
    apply_fields,
    apply_operation,
    read_current,
    roll_back,
    undo_log,
)
from txstream.state._numba import inline, jit, monotonic_ns
from txstream.state.operations import ABORTED, COMMITTED, REJECTED

ABORT_NS = 2
"""Slot of a kernel's ``waited`` array where rolling back aborted transactions adds its
nanoseconds (entries 0 and 1: waiting for peers, taking locks)."""
ABORTS = 3
"""Slot of ``waited`` where `settle` counts the transactions that aborted: a walk's
failures without a pass over the statuses afterwards."""
WAITED_SLOTS = ABORTS + 1


@inline
def record_output(t, o, ops, result, results):
    """Add operation `o`'s result to transaction `t`'s output slot, if it has one."""
    slot = ops.out[o]
    if slot >= 0:
        results.out_values[t, slot] += result
        results.out_set[t, slot] = True


@inline
def settle(t, failed, atomic, state, log, n_log, results, waited):
    """Transaction `t` committed (``failed`` 0) or aborted for reason ``failed``: if
    aborted and ``atomic``, its ``n_log`` logged writes rolled back (the nanoseconds
    added to ``waited[ABORT_NS]``); its status, and no outputs if aborted (counted in
    ``waited[ABORTS]``)."""
    if failed and atomic:
        start = monotonic_ns()
        roll_back(state, log, n_log)
        waited[ABORT_NS] += monotonic_ns() - start
    status, status_reason, out_values, out_set = results
    if failed:
        status[t] = ABORTED
        status_reason[t] = failed
        waited[ABORTS] += 1
        for s in range(out_set.shape[1]):
            out_set[t, s] = False
            out_values[t, s] = 0
    else:
        status[t] = COMMITTED


@inline
def run_transaction(t, ops, state, udf, reads, log, results, atomic, waited):
    """Run transaction `t`'s operations in statement order on the current state; at
    the first failed condition it aborts, its writes rolled back if ``atomic`` (the
    rollback's nanoseconds added to ``waited[ABORT_NS]``). Returns 0, or SET_FULL if a
    distinct set ran out of slots."""
    n_log = 0
    failed = 0
    for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
        n_reads = read_current(o, ops, state.values, reads)
        ok, result, n_log = apply_operation(o, ops, state, udf, reads, n_reads, log, n_log)
        if not ok:
            if result == SET_FULL:
                return SET_FULL
            failed = ops.reason[o]
            break
        record_output(t, o, ops, result, results)
    settle(t, failed, atomic, state, log, n_log, results, waited)
    return 0


@jit
def run_transactions(begin, end, ops, state, udf, reads, log, results, waited):
    """Run transactions begin..end-1 one by one in ts order, all-or-nothing each.

    Returns 0, or SET_FULL if a distinct set ran out of slots.
    """
    for t in range(begin, end):
        if results.status[t] == REJECTED:
            continue
        if run_transaction(t, ops, state, udf, reads, log, results, True, waited):
            return SET_FULL
    return 0


StatementScratch = tuple[np.ndarray, np.ndarray, np.ndarray, UndoLog, np.ndarray]
"""What a statement kernel (`txstream.schedulers._statement_kernels`) works in: an
argument row, read cells, read values, an undo log, the error it reports."""


def statement_scratch(arg_width: int, op_reads: int, txn_ops: int) -> StatementScratch:
    """A statement kernel's scratch for operations of up to ``arg_width`` arguments and
    ``op_reads`` parametric reads, transactions of up to ``txn_ops`` operations."""
    reads = max(1, op_reads)
    return (
        np.empty((1, max(1, arg_width)), np.int64),
        np.empty(reads, np.int64),
        np.empty(reads, np.int64),
        undo_log(txn_ops),
        np.zeros(3, np.int64),
    )


@jit
def apply_once(kind, cell, fun, cond, args, row, state, udf, reads, n_reads, log, n_log):
    """`apply_fields`, called rather than inlined: a statement kernel calls it once per
    statement (`txstream.schedulers._statement_kernels`), and inlined copies (six in SL's)
    would make its compile several times longer, at the same speed."""
    return apply_fields(kind, cell, fun, cond, args, row, state, udf, reads, n_reads, log, n_log)


@jit
def collect_results(first, end, ops, v, fates, results):
    """Each transaction's status, abort reason (its first failed operation, as serial
    execution stops there) and outputs, from what its operations recorded."""
    status, status_reason, out_values, out_set = results
    for t in range(first, end):
        if status[t] == REJECTED:
            continue
        if fates.failed[t]:
            status[t] = ABORTED
            for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
                if v.ok[o] == 0:
                    status_reason[t] = ops.reason[o]
                    break
            continue
        status[t] = COMMITTED
        for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
            slot = ops.out[o]
            if slot >= 0:
                out_values[t, slot] += v.result[o]
                out_set[t, slot] = True
