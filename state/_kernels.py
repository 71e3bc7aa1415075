"""Kernels over the flat state: applying one operation, distinct sets, undoing a write.

Every scheduler executes operations through :func:`apply_operation`, so the
semantics of READ / WRITE / READ_MODIFY / SET_ADD live in exactly one place, and
undoes a write through :func:`undo_write`. :func:`hash64` is the engine's one hash.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from txstream.state import dirty
from txstream.state._numba import call_user, compare_exchange, element_pointer, inline, monotonic_ns
from txstream.state.operations import READ, SET_ADD
from txstream.state.tables import EMPTY, TOMBSTONE

SET_FULL = -3
"""`set_insert` result when a distinct set has no free slot left."""
SET_FULL_MESSAGE = "a distinct-set table is full; its capacity is sized per event"


def compile_for(kernel: object, *args: object) -> None:
    """Compile ``kernel`` for the types of ``args`` (or load it from numba's cache), as a
    call with them would, without running it: a run's first call of a kernel otherwise
    loads it then (compiles it, with a cold cache: about a second), while its peers
    wait."""
    kernel.compile(tuple(numba.typeof(a) for a in args))


CALLED, VALUE, VALUE_PLUS_ARG, VALUE_MINUS_ARG, ARG = range(5)
"""What a function computes, for the kernels: called by its address (any user function),
or one of a few well-known computations they do inline (``args[0]`` is the operation's
first argument). An indirect call per operation would be about half of a cheap
topology's serial kernel (docs/performance.md); the library's own functions say which
they are."""
AT_LEAST_ARG = 1
"""A condition the kernels evaluate inline: ``value >= args[0]`` (0: called)."""


class Udf(NamedTuple):
    """The topology's user functions as kernels call them, and the UDF cost."""

    fun_addr: np.ndarray
    """Addresses of the compiled functions, by function id."""
    cond_addr: np.ndarray
    """Addresses of the compiled conditions, by condition id (0: none)."""
    spin_ns: int
    """Busy work added to every operation (``--udf-cost-us``)."""
    fun_inline: np.ndarray
    """Per function id, what it computes (`CALLED`, `VALUE_PLUS_ARG`, ...)."""
    cond_inline: np.ndarray
    """Per condition id, `AT_LEAST_ARG` or 0 (called)."""


class UndoLog(NamedTuple):
    """Scratch where `apply_operation` logs what its writes overwrote (one entry each)."""

    cell: np.ndarray
    value: np.ndarray
    slot: np.ndarray


def undo_log(width: int) -> UndoLog:
    """An undo log for transactions of up to ``width`` operations."""
    return UndoLog(*(np.empty(max(1, width), np.int64) for _ in range(3)))


@inline
def hash64(x):
    """Well-spread hash of an int64 (non-negative): for owners, pools and set slots."""
    h = x * np.int64(-7046029254386353131)
    return (h ^ (h >> np.int64(31))) & np.int64(0x7FFFFFFFFFFFFFFF)


@inline
def set_insert(state, cell, member):
    """Insert (cell, member); the new slot, -1 if already present, SET_FULL if full.

    A free slot is claimed by compare-and-swap: executors insert concurrently, each
    for cells it owns (so a claimed slot of another cell is simply probed past).
    """
    set_cells, set_members = state.set_cells, state.set_members
    mask = len(set_cells) - 1
    slot = hash64(hash64(cell) ^ member) & mask
    for _ in range(len(set_cells)):
        c = set_cells[slot]
        if c == EMPTY:
            c = compare_exchange(set_cells, slot, EMPTY, cell)
            if c == EMPTY:
                set_members[slot] = member
                return slot
        if c == cell and set_members[slot] == member:
            return -1
        slot = (slot + 1) & mask
    return SET_FULL


@inline
def busy_wait(spin_ns):
    """The seeds' UDF complexity: spin for `spin_ns` nanoseconds."""
    if spin_ns > 0:
        end = monotonic_ns() + spin_ns
        while monotonic_ns() < end:
            pass


@inline
def evaluate(o, value, ops, udf, reads, n_reads):
    """Operation `o`'s condition and function on ``value`` (the cell's value as the
    caller decides it is seen; its parametric reads are ``reads[:n_reads]``), with the
    UDF cost: (ok, result). ok is False when the condition failed; result is what a
    READ returns or a WRITE / READ_MODIFY writes (0 for SET_ADD, which calls no function).
    """
    return evaluate_fields(
        ops.kind[o], ops.fun[o], ops.cond[o], ops.args, o, value, udf, reads, n_reads
    )


@inline
def evaluate_fields(kind, fun, cond, args, row, value, udf, reads, n_reads):
    """`evaluate` of an operation given by its fields, its arguments being row ``row``
    of ``args`` (an operation not built in a chunk's arrays has them in a scratch row)."""
    r = element_pointer(reads, 0)
    a = element_pointer(args, row * args.shape[1])
    busy_wait(udf.spin_ns)
    if cond > 0:
        if udf.cond_inline[cond] == AT_LEAST_ARG:
            ok = value >= args[row, 0]
        else:
            ok = call_user(udf.cond_addr[cond], value, a, r, n_reads) != 0
        if not ok:
            return False, 0
    if kind == SET_ADD:
        return True, 0
    computes = udf.fun_inline[fun]
    if computes == VALUE_PLUS_ARG:
        return True, value + args[row, 0]
    if computes == VALUE_MINUS_ARG:
        return True, value - args[row, 0]
    if computes == ARG:
        return True, args[row, 0]
    if computes == VALUE:
        return True, value
    return True, call_user(udf.fun_addr[fun], value, a, r, n_reads)


@inline
def apply_operation(o, ops, state, udf, reads, n_reads, log, n_log):
    """Execute operation `o` on the state, logging what it overwrote at ``log[n_log]``;
    its parametric reads are ``reads[:n_reads]`` (the caller decides which version
    they see).

    Returns (ok, result, n_log): ok is False when the condition failed (nothing
    written) or a distinct set is full (result = SET_FULL).
    """
    kind, cell, fun, cond = ops.kind[o], ops.cell[o], ops.fun[o], ops.cond[o]
    return apply_fields(kind, cell, fun, cond, ops.args, o, state, udf, reads, n_reads, log, n_log)


@inline
def apply_fields(kind, c, fun, cond, args, row, state, udf, reads, n_reads, log, n_log):
    """`apply_operation` of an operation given by its fields (see `evaluate_fields`):
    its kind, cell ``c``, function, condition and arguments."""
    values = state.values
    value = values[c]
    ok, result = evaluate_fields(kind, fun, cond, args, row, value, udf, reads, n_reads)
    if not ok or kind == READ:
        return ok, result, n_log
    if kind == SET_ADD:
        slot = set_insert(state, c, args[row, 0])
        if slot == SET_FULL:
            return False, SET_FULL, n_log
        if slot >= 0:
            log.cell[n_log] = c
            log.value[n_log] = value
            log.slot[n_log] = slot
            values[c] = value + 1
            dirty.mark(state.dirty, c)
            n_log += 1
        return True, values[c], n_log
    log.cell[n_log] = c
    log.value[n_log] = value
    log.slot[n_log] = -1
    values[c] = result
    dirty.mark(state.dirty, c)
    return True, result, n_log + 1


@inline
def read_current(o, ops, values, reads):
    """Fill ``reads`` with the current values of `o`'s parametric reads; their count."""
    first = ops.dep_ptr[o]
    n_reads = ops.dep_ptr[o + 1] - first
    for d in range(n_reads):
        reads[d] = values[ops.dep_cell[first + d]]
    return n_reads


@inline
def undo_write(state, cell, value, slot):
    """Undo one write: the cell gets back ``value``; a set member it added (``slot``
    >= 0) is removed."""
    state.values[cell] = value
    if slot >= 0:
        state.set_cells[slot] = TOMBSTONE


@inline
def roll_back(state, log, n_log):
    """Undo the logged writes, newest first."""
    for u in range(n_log - 1, -1, -1):
        undo_write(state, log.cell[u], log.value[u], log.slot[u])
