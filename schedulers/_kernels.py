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
from txstream.topologies._kernels import (
    BASE,
    COND,
    FUN,
    KEY_A,
    KEY_B,
    KEY_KIND,
    KEY_OUTSIDE,
    KIND,
    OUT,
    REASON,
    SIZE,
    emits,
    put_args,
    put_reads,
    source_element,
    source_length,
)

ABORT_NS = 2
"""Slot of a kernel's ``waited`` array where rolling back aborted transactions adds its
nanoseconds (entries 0 and 1: waiting for peers, taking locks)."""


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
    added to ``waited[ABORT_NS]``); its status, and no outputs if aborted."""
    if failed and atomic:
        start = monotonic_ns()
        roll_back(state, log, n_log)
        waited[ABORT_NS] += monotonic_ns() - start
    status, status_reason, out_values, out_set = results
    if failed:
        status[t] = ABORTED
        status_reason[t] = failed
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
"""What `run_statements` works in: an argument row, read cells, read values, an undo
log, the error it reports."""


def statement_scratch(arg_width: int, op_reads: int, txn_ops: int) -> StatementScratch:
    """`run_statements`' scratch for operations of up to ``arg_width`` arguments and
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
def run_statements(begin, end, statements, args, reads, state, udf, scratch, results, waited):
    """`run_transactions` of a lone executor's transactions begin..end-1, each executed
    straight from its topology's statements (``statements``, ``args``, ``reads`` as
    `build_operations` takes them) instead of from operations built into the chunk: the
    operations are the same, in the same order, checked the same way (those after a
    failed one too), but never written out and read back. ``scratch``: see
    `statement_scratch`. Returns 0, SET_FULL if a distinct set ran out of slots, or
    `build_operations`' error code with the scratch's ``error`` filled in."""
    row, cells, seen, log, error = scratch
    no_targets = cells[:0]
    for t in range(begin, end):
        if results.status[t] == REJECTED:
            continue
        n_log = 0
        failed = 0
        for s in range(statements.shape[1]):
            if not emits(statements, s, t):
                continue
            kind, a, b = statements[KEY_KIND, s], statements[KEY_A, s], statements[KEY_B, s]
            for e in range(source_length(kind, a, t)):
                key = source_element(kind, a, b, t, e)
                if key < 0 or key >= statements[SIZE, s]:
                    error[0], error[1] = KEY_OUTSIDE, s
                    return KEY_OUTSIDE
                if not put_args(row, 0, t, e, s, statements, args, error):
                    return error[0]
                n_reads = put_reads(cells, 0, t, s, statements, reads, no_targets, error)
                if n_reads < 0:
                    return error[0]
                if failed:
                    continue
                for d in range(n_reads):
                    seen[d] = state.values[cells[d]]
                op, cell = statements[KIND, s], statements[BASE, s] + key
                fun, cond = statements[FUN, s], statements[COND, s]
                ok, result, n_log = apply_fields(
                    op, cell, fun, cond, row, 0, state, udf, seen, n_reads, log, n_log
                )
                if not ok:
                    if result == SET_FULL:
                        return SET_FULL
                    failed = statements[REASON, s]
                    continue
                slot = statements[OUT, s]
                if slot >= 0:
                    results.out_values[t, slot] += result
                    results.out_set[t, slot] = True
        settle(t, failed, True, state, log, n_log, results, waited)
    return 0


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
