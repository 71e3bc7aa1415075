"""Scheduler kernels: arrays in, arrays out, no Ray, Arrow or exceptions inside."""

from __future__ import annotations

from txstream._numba import jit
from txstream.state._kernels import SET_FULL, apply_operation, read_current, roll_back
from txstream.state.operations import ABORTED, COMMITTED, REJECTED


@jit
def run_transactions(begin, end, ops, state, udf, reads, log, results):
    """Run transactions begin..end-1 one by one in ts order, all-or-nothing each.

    Returns 0, or SET_FULL if a distinct set ran out of slots.
    """
    status, status_reason, out_values, out_set = results
    for t in range(begin, end):
        if status[t] == REJECTED:
            continue
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
            slot = ops.out[o]
            if slot >= 0:
                out_values[t, slot] += result
                out_set[t, slot] = True
        if failed:
            roll_back(state, log, n_log)
            status[t] = ABORTED
            status_reason[t] = failed
            for s in range(out_set.shape[1]):
                out_set[t, s] = False
                out_values[t, s] = 0
        else:
            status[t] = COMMITTED
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
