"""Scheduler kernels: arrays in, arrays out, no Ray, Arrow or exceptions inside."""

from __future__ import annotations

from txstream._numba import jit
from txstream.state._kernels import SET_FULL, apply_operation, read_current, roll_back

COMMITTED, ABORTED, REJECTED = 0, 1, 2
"""Event status codes, in the order of `STATUS_NAMES`."""
STATUS_NAMES = ("committed", "aborted", "rejected")


@jit
def run_transactions(
    begin,
    end,
    txn_ptr,
    values,
    set_cells,
    set_members,
    kind,
    cell,
    fun,
    cond,
    reason,
    out,
    args,
    dep_ptr,
    dep_cell,
    fun_addr,
    cond_addr,
    spin_ns,
    reads,
    undo_cell,
    undo_value,
    undo_slot,
    status,
    status_reason,
    out_values,
    out_set,
):
    """Run transactions begin..end-1 one by one in ts order, all-or-nothing each.

    Returns 0, or SET_FULL if a distinct set ran out of slots.
    """
    for t in range(begin, end):
        if status[t] == REJECTED:
            continue
        n_undo = 0
        failed = 0
        for o in range(txn_ptr[t], txn_ptr[t + 1]):
            n_reads = read_current(o, values, dep_ptr, dep_cell, reads)
            ok, result, n_undo = apply_operation(
                o,
                values,
                set_cells,
                set_members,
                kind,
                cell,
                fun,
                cond,
                args,
                n_reads,
                fun_addr,
                cond_addr,
                reads,
                spin_ns,
                undo_cell,
                undo_value,
                undo_slot,
                n_undo,
            )
            if not ok:
                if result == SET_FULL:
                    return SET_FULL
                failed = reason[o]
                break
            slot = out[o]
            if slot >= 0:
                out_values[t, slot] += result
                out_set[t, slot] = True
        if failed:
            roll_back(values, set_cells, undo_cell, undo_value, undo_slot, n_undo)
            status[t] = ABORTED
            status_reason[t] = failed
            for s in range(out_set.shape[1]):
                out_set[t, s] = False
                out_values[t, s] = 0
        else:
            status[t] = COMMITTED
    return 0


@jit
def collect_results(first, end, txn_ptr, ok, failed, reason, out, result, status, status_reason,
                    out_values, out_set):  # fmt: skip
    """Each transaction's status, abort reason (its first failed operation, as serial
    execution stops there) and outputs, from what its operations recorded."""
    for t in range(first, end):
        if status[t] == REJECTED:
            continue
        if failed[t]:
            status[t] = ABORTED
            for o in range(txn_ptr[t], txn_ptr[t + 1]):
                if ok[o] == 0:
                    status_reason[t] = reason[o]
                    break
            continue
        status[t] = COMMITTED
        for o in range(txn_ptr[t], txn_ptr[t + 1]):
            slot = out[o]
            if slot >= 0:
                out_values[t, slot] += result[o]
                out_set[t, slot] = True
