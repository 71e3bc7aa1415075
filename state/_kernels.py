"""Kernels over the flat state: applying one operation, distinct sets, rollback.

Every scheduler executes operations through :func:`apply_operation`, so the
semantics of READ / WRITE / READ_MODIFY / SET_ADD live in exactly one place.
"""

from __future__ import annotations

import numpy as np
from txstream._numba import call_user, compare_exchange, element_pointer, inline, monotonic_ns
from txstream.state.tables import EMPTY, TOMBSTONE
from txstream.topologies.api import READ, SET_ADD

SET_FULL = -3
"""`set_insert` result when a distinct set has no free slot left."""


@inline
def _slot(cell, member, mask):
    h = (cell * np.int64(-7046029254386353131)) ^ (member * np.int64(-4658895280553007687))
    h ^= h >> np.int64(29)
    return h & mask


@inline
def set_insert(set_cells, set_members, cell, member):
    """Insert (cell, member); the new slot, -1 if already present, SET_FULL if full.

    A free slot is claimed by compare-and-swap: executors insert concurrently, each
    for cells it owns (so a claimed slot of another cell is simply probed past).
    """
    mask = len(set_cells) - 1
    slot = _slot(cell, member, mask)
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
def apply_operation(
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
):
    """Execute operation `o` on `values`, logging what it overwrote; its parametric
    reads are ``reads[:n_reads]`` (the caller decides which version they see).

    Returns (ok, result, n_undo): ok is False when the condition failed (nothing
    written) or a distinct set is full (result = SET_FULL).
    """
    c = cell[o]
    value = values[c]
    r = element_pointer(reads, 0)
    a = element_pointer(args, o * args.shape[1])
    busy_wait(spin_ns)
    if cond[o] > 0 and call_user(cond_addr[cond[o]], value, a, r, n_reads) == 0:
        return False, 0, n_undo
    k = kind[o]
    if k == READ:
        return True, call_user(fun_addr[fun[o]], value, a, r, n_reads), n_undo
    if k == SET_ADD:
        slot = set_insert(set_cells, set_members, c, args[o, 0])
        if slot == SET_FULL:
            return False, SET_FULL, n_undo
        if slot >= 0:
            undo_cell[n_undo] = c
            undo_value[n_undo] = value
            undo_slot[n_undo] = slot
            values[c] = value + 1
            n_undo += 1
        return True, values[c], n_undo
    new = call_user(fun_addr[fun[o]], value, a, r, n_reads)
    undo_cell[n_undo] = c
    undo_value[n_undo] = value
    undo_slot[n_undo] = -1
    values[c] = new
    return True, new, n_undo + 1


@inline
def read_current(o, values, dep_ptr, dep_cell, reads):
    """Fill ``reads`` with the current values of `o`'s parametric reads; their count."""
    first = dep_ptr[o]
    n_reads = dep_ptr[o + 1] - first
    for d in range(n_reads):
        reads[d] = values[dep_cell[first + d]]
    return n_reads


@inline
def roll_back(values, set_cells, undo_cell, undo_value, undo_slot, n_undo):
    """Undo the logged writes, newest first (and remove inserted set members)."""
    for u in range(n_undo - 1, -1, -1):
        values[undo_cell[u]] = undo_value[u]
        if undo_slot[u] >= 0:
            set_cells[undo_slot[u]] = TOMBSTONE
