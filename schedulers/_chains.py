"""TStream kernels: operation chains, their parallel evaluation, lazy aborts.

An *operation chain* is the operations of one state cell in ts order. Chains are
linked lists (`chain_prev`), built by one pass over the chunk's operations. The
chains of one key (all its columns, in every table) go to one executor, which
evaluates their operations in ts order, so it only ever waits for operations
*before* its own: the executor furthest behind never waits; the team cannot
deadlock.

Versions: every operation records the value it saw (`before`) and left (`after`).
A parametric read "as of" an operation takes the `after` of the last operation
before it on the cell read, skipping aborted transactions - a multi-versioned read.

Lazy aborts, driven by the Coordinator (`txstream.actors.coordinator`). A batch is
first *explored*: every operation is applied at once on the versions before it,
whatever their transactions' fate, and failures are recorded (`failed[t]`). Only an
operation whose transaction is known to have failed is skipped, so that it taints
nothing: one without condition once any operation of its transaction failed, one with
a condition once an earlier statement failed on this executor (the abort reason is
the first failed statement's, so that one must be evaluated). At the
punctuation the Coordinator collects the batch's failed transactions and marks the
transactions whose inputs an aborted write may have touched, transitively
(`find_affected`). A failed transaction that is not affected failed on exact inputs:
it is aborted for good. The executors roll the affected operations back (newest
first) and *redo* them exactly: before an operation, a chain waits until the previous
affected transaction is resolved - all its conditional operations evaluated - and
rolls its run back if it aborted; parametric reads skip aborted versions. An aborted
run left at the end of a chain is rolled back by the chain's next operation (next
batch) or at the end of the chunk. So no transaction sees an aborted transaction's
writes, and none fails because of one. A transaction without conditions cannot
abort: nobody waits for its resolution.
"""

from __future__ import annotations

from txstream._numba import fetch_add, inline, jit, monotonic_ns, store_release
from txstream.state._kernels import SET_FULL, apply_operation
from txstream.state.sync import OK, progress_slot, wait_progress
from txstream.state.tables import TOMBSTONE


@inline
def mix(key):
    """Well-spread hash of a key, for owner and pool choice."""
    h = key * -7046029254386353131
    return (h ^ (h >> 31)) & 0x7FFFFFFFFFFFFFFF


@jit
def hash_owners(parties, key_owner):
    """shared-nothing: every key belongs to the executor its hash points to."""
    for k in range(len(key_owner)):
        key_owner[k] = mix(k) % parties


@jit
def build_chains(txn, cell, cond, dep_ptr, dep_cell, values, last, chain_prev, dep_prev,
                 dep_initial, last_cond, tails):  # fmt: skip
    """Link every operation to the previous one on its cell and every parametric read
    to the last operation on its cell before the reader; snapshot the values reads see
    when no (committed) operation precedes them; note each transaction's last
    conditional operation (-1: it cannot abort). Returns the number of chains, whose
    last operations go to ``tails``. ``last`` (per cell, all -1) is scratch, left all -1.
    """
    last_cond[:] = -1
    n = len(cell)
    for o in range(n):
        for k in range(dep_ptr[o], dep_ptr[o + 1]):
            dep_prev[k] = last[dep_cell[k]]
            dep_initial[k] = values[dep_cell[k]]
        c = cell[o]
        chain_prev[o] = last[c]
        last[c] = o
        if cond[o] > 0:
            last_cond[txn[o]] = o
    n_chains = 0
    for o in range(n):
        if last[cell[o]] == o:
            tails[n_chains] = o
            n_chains += 1
    for i in range(n_chains):
        last[cell[tails[i]]] = -1
    return n_chains


@jit
def pool_keys(cell, key_of_cell, pools, key_ops, fill, claims, claim_ops, pool_ptr):
    """Work pools: the keys the chunk touches, grouped by pool (by key hash), busiest
    first, with their operation counts. ``key_ops`` (per key, all 0) and ``fill`` (per
    pool) are scratch; ``key_ops`` is left all 0. Returns the number of keys."""
    n_keys = 0
    for o in range(len(cell)):
        k = key_of_cell[cell[o]]
        if key_ops[k] == 0:
            claims[n_keys] = k
            n_keys += 1
        key_ops[k] += 1
    # counting sort by pool, then insertion into each pool by descending operations
    pool_ptr[:] = 0
    for i in range(n_keys):
        pool_ptr[mix(claims[i]) % pools + 1] += 1
    for p in range(pools):
        pool_ptr[p + 1] += pool_ptr[p]
    for p in range(pools):
        fill[p] = pool_ptr[p]
    for i in range(n_keys):
        k = claims[i]
        j = fill[mix(k) % pools]
        fill[mix(k) % pools] = j + 1
        claim_ops[j] = k  # keys in pool order, for now
    for i in range(n_keys):
        claims[i] = claim_ops[i]
        claim_ops[i] = key_ops[claims[i]]
    for p in range(pools):
        _sort_descending(claims, claim_ops, pool_ptr[p], pool_ptr[p + 1])
    for i in range(n_keys):
        key_ops[claims[i]] = 0
    return n_keys


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
def fill_owners(first, end, cell, key_of_cell, key_owner, owner):
    """The owner of operations first..end-1: the owner of their cell's key (read once
    here, then in ts order by the kernels below)."""
    for o in range(first, end):
        owner[o] = key_owner[key_of_cell[cell[o]]]


@jit
def claim_keys(me, begin, end, claims, claim_ops, key_owner, sync, counter, quota):
    """Work stealing from a pool: take the next unclaimed key (busiest first) with all
    its chains until ``quota`` operations are taken or the pool is empty."""
    taken = 0
    while taken < quota:
        i = begin + fetch_add(sync, counter, 1)
        if i >= end:
            break
        key_owner[claims[i]] = me
        taken += claim_ops[i]
    return taken


@inline
def _undo_run(o, txn, cell, values, set_cells, chain_prev, before, slot):
    """Roll back the run of one transaction's operations on a chain that ends at `o`:
    newest first, removing members they added to a distinct set."""
    t = txn[o]
    c = cell[o]
    while o >= 0 and txn[o] == t:
        values[c] = before[o]
        if slot[o] >= 0:
            set_cells[slot[o]] = TOMBSTONE
        o = chain_prev[o]


@inline
def _wait_resolved(t, txn_ptr, cond, owner, sync, deadline, stats):
    """Wait until every conditional operation of transaction `t` was evaluated (by
    whichever executors own them): then ``failed[t]`` is final."""
    for o in range(txn_ptr[t], txn_ptr[t + 1]):
        if cond[o] > 0:
            why = wait_progress(sync, owner[o], o + 1, deadline, stats)
            if why != OK:
                return why
    return OK


@jit
def run_chains(me, redo, first_op, end, owner, txn, txn_ptr, values, set_cells,
               set_members, kind, cell, fun, cond, args, dep_ptr, fun_addr, cond_addr, spin_ns,
               chain_prev, dep_prev, dep_initial, last_cond, before, after, result, slot,
               ok, failed, affected, reads, undo_cell, undo_value, undo_slot, sync, timeout_ns,
               stats):  # fmt: skip
    """Explore (``redo`` 0) or redo (1: only affected transactions) this executor's
    operations of the batch first_op..end-1, in ts order.

    Returns OK, a `txstream.state.sync` error code, or SET_FULL. Adds the ns spent
    waiting for other executors to ``stats[0]``, rolling back to ``stats[1]``, and the
    operations that failed to ``stats[2]``.
    """
    deadline = monotonic_ns() + timeout_ns
    failed_here = -1  # the last transaction one of this executor's operations failed
    for o in range(first_op, end):
        if owner[o] != me:
            continue
        t = txn[o]
        if redo and not affected[t]:
            continue
        c = cell[o]
        store_release(sync, progress_slot(me), o)
        p = chain_prev[o]
        if p >= 0 and txn[p] != t and last_cond[txn[p]] >= 0:
            tp = txn[p]
            undo = False
            if p < first_op:  # an earlier batch: resolved; explore rolls it back
                undo = not redo and failed[tp] != 0
            elif redo:
                if affected[tp]:
                    why = _wait_resolved(tp, txn_ptr, cond, owner, sync, deadline, stats)
                    if why != OK:
                        return why
                undo = failed[tp] != 0
            if undo:
                start = monotonic_ns()
                _undo_run(p, txn, cell, values, set_cells, chain_prev, before, slot)
                stats[1] += monotonic_ns() - start
        first_read = dep_ptr[o]
        n_reads = dep_ptr[o + 1] - first_read
        for k in range(first_read, first_read + n_reads):
            q = dep_prev[k]
            while q >= 0:
                tq = txn[q]
                pending = q >= first_op and (not redo or affected[tq])
                if pending:
                    why = wait_progress(sync, owner[q], q + 1, deadline, stats)
                    if why != OK:
                        return why
                if tq == t or last_cond[tq] < 0:
                    break
                if pending:
                    if not redo:
                        break  # explore reads the version as it is
                    why = _wait_resolved(tq, txn_ptr, cond, owner, sync, deadline, stats)
                    if why != OK:
                        return why
                if failed[tq] == 0:
                    break
                while q >= 0 and txn[q] == tq:
                    q = chain_prev[q]
            reads[k - first_read] = after[q] if q >= 0 else dep_initial[k]
        before[o] = values[c]
        if not redo and (failed_here == t or (cond[o] == 0 and failed[t])):
            after[o] = before[o]  # its transaction failed already: no write to taint
            slot[o] = -1
            ok[o] = 1
            continue
        passed, value, n_undo = apply_operation(
            o, values, set_cells, set_members, kind, cell, fun, cond, args, n_reads, fun_addr,
            cond_addr, reads, spin_ns, undo_cell, undo_value, undo_slot, 0,
        )  # fmt: skip
        if not passed and value == SET_FULL:
            return SET_FULL
        after[o] = values[c]
        result[o] = value
        slot[o] = undo_slot[0] if n_undo > 0 else -1
        ok[o] = passed
        if not passed:
            failed[t] = 1
            failed_here = t
            stats[2] += 1
    store_release(sync, progress_slot(me), end)
    return OK


@inline
def _changed(o, before, after, slot):
    """Whether operation ``o`` changed its cell or added a set member."""
    return after[o] != before[o] or slot[o] >= 0


@inline
def _changed_any(t, txn_ptr, before, after, slot):
    for o in range(txn_ptr[t], txn_ptr[t + 1]):
        if _changed(o, before, after, slot):
            return True
    return False


@jit
def find_affected(begin, end, txn_ptr, cell, dep_ptr, dep_cell, before, after, slot, failed,
                  dirty, affected):  # fmt: skip
    """The Coordinator's pass over explored transactions begin..end-1, in ts order:
    mark ``affected`` every transaction that read or updated a version an aborted write
    may have touched, and forget its failure (it is redone). A failed transaction that
    is not affected aborts for good; the cells it changed are dirty for the rest of the
    batch, as are all cells an affected transaction touches. ``dirty`` (per cell, all
    0) is scratch, left all 0. Returns the number of affected transactions."""
    first = end  # nothing is dirty before the first failed transaction that changed something
    for t in range(begin, end):
        if failed[t] and _changed_any(t, txn_ptr, before, after, slot):
            first = t
            break
    count = 0
    for t in range(first, end):
        hit = False
        for o in range(txn_ptr[t], txn_ptr[t + 1]):
            if dirty[cell[o]]:
                hit = True
            for k in range(dep_ptr[o], dep_ptr[o + 1]):
                if dirty[dep_cell[k]]:
                    hit = True
        if hit:
            affected[t] = 1
            failed[t] = 0
            count += 1
        for o in range(txn_ptr[t], txn_ptr[t + 1]):
            if hit or (failed[t] and _changed(o, before, after, slot)):
                dirty[cell[o]] = 1
    for o in range(txn_ptr[first], txn_ptr[end]):
        dirty[cell[o]] = 0
    return count


@jit
def roll_back_affected(me, begin, end, owner, txn, cell, values, set_cells, before, slot,
                       affected):  # fmt: skip
    """Before the redo: undo this executor's operations of affected transactions among
    begin..end-1, newest first (each cell ends as its first affected operation found it)."""
    for o in range(end - 1, begin - 1, -1):
        if owner[o] == me and affected[txn[o]]:
            values[cell[o]] = before[o]
            if slot[o] >= 0:
                set_cells[slot[o]] = TOMBSTONE


@jit
def undo_aborted_tails(me, tails, n_chains, owner, txn, cell, values, set_cells,
                       chain_prev, before, slot, failed):  # fmt: skip
    """At the end of a chunk: roll back the last run of every owned chain whose
    transaction aborted (earlier runs were rolled back by their successors)."""
    for i in range(n_chains):
        o = tails[i]
        if owner[o] == me and failed[txn[o]]:
            _undo_run(o, txn, cell, values, set_cells, chain_prev, before, slot)
