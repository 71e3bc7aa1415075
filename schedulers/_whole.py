"""Kernels of the baselines that run whole transactions per executor (LOCK, MVLK, PAT,
No-Lock; TStream ICDE'20 §II-C, MorphStream §6): arrays in, arrays out, no exceptions.

Each executor runs the transactions it is given in ts order, each to its end before the
next; what orders conflicting transactions of different executors is the scheme's:

- LOCK: a global order counter admits one transaction at a time to take all of its locks
  (a word per cell: >0 readers, -1 a writer), in ts order; it releases them at commit or
  abort. A waiter holds only the turn or locks taken after every earlier transaction took
  its own: it only ever waits for earlier transactions, so the team cannot deadlock.
- MVLK: the same counter admits transactions in ts order to *register* (no waiting): a
  writer takes the next writer number of each cell it writes (``seq``), a reader notes
  how many writers precede it. A write waits until the cell's earlier writers are done
  (``done``: the low-water mark), a read until those before it are, and reads the
  version as of its ts: writers of a chunk are listed per cell (``head``, ``prev``),
  each with the value it found (``before``) and left at commit or abort (``after``).
- PAT: each partition of the state keeps a counter of its transactions done; a
  transaction waits until every partition it touches reached it (ascending partition
  order), runs, and advances them.
- No-Lock: operations applied as they come, a failed condition stops its transaction
  without undoing what it wrote.

Every wait has the run's deadline and ends when a peer fails (`wait_at_least`,
`pause`). Time goes to ``waited``: peers (sync), locks or registration (lock), rollbacks
(abort).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from txstream.schedulers._kernels import record_output, run_transaction, settle
from txstream.state._kernels import SET_FULL, UndoLog, apply_operation, evaluate
from txstream.state._numba import (
    compare_exchange,
    fetch_add,
    inline,
    jit,
    load_acquire,
    monotonic_ns,
    store_release,
)
from txstream.state.operations import READ, REJECTED
from txstream.state.sync import OK, STRIDE, pause, wait_at_least

SYNC_NS, LOCK_NS = 0, 1
"""Slots of ``waited`` (with `ABORT_NS` of `txstream.schedulers._kernels`): waiting for
peers, taking locks or registering."""


class Peer(NamedTuple):
    """This executor in its team, as the kernels wait."""

    sync: np.ndarray
    timeout_ns: int
    rank: int
    parties: int


class TxnScratch(NamedTuple):
    """Per-executor scratch: a transaction's parametric reads, undo log and access set
    (its distinct cells: written or only read, writer number or writers before it,
    first writing operation, the version it reads), and the nanoseconds per activity."""

    reads: np.ndarray
    log: UndoLog
    cell: np.ndarray
    write: np.ndarray
    seq: np.ndarray
    node: np.ndarray
    value: np.ndarray
    waited: np.ndarray


class LockWords(NamedTuple):
    """LOCK's shared words: the order counter, a lock word per cell."""

    order: np.ndarray
    locks: np.ndarray


class MvWords(NamedTuple):
    """MVLK's shared words: the order counter; per cell, writers registered, writers
    done (the low-water mark) and the chunk's latest writer (-1: none)."""

    order: np.ndarray
    seq: np.ndarray
    done: np.ndarray
    head: np.ndarray


class MvVersions(NamedTuple):
    """MVLK's writers of a chunk, by their first writing operation: the previous writer
    of the cell in the chunk, writer number, value found and left, and whether it has
    the cell (then ``before`` is final)."""

    prev: np.ndarray
    wseq: np.ndarray
    before: np.ndarray
    after: np.ndarray
    taken: np.ndarray


class PartitionPlan(NamedTuple):
    """PAT's plan of a chunk: the partitions of transaction ``t`` are
    ``part[ptr[t]:ptr[t+1]]`` (ascending), its place in each partition's order ``seq``;
    ``mine[t]``: this executor runs it."""

    ptr: np.ndarray
    part: np.ndarray
    seq: np.ndarray
    mine: np.ndarray


@inline
def _add_cell(s, n, c, write, o):
    """Add cell ``c`` to the access set of ``n`` cells (``write``: operation `o` writes
    it); the new size."""
    for i in range(n):
        if s.cell[i] == c:
            if write and not s.write[i]:
                s.write[i] = 1
                s.node[i] = o
            return n
    s.cell[n] = c
    s.write[n] = write
    s.node[n] = o if write else -1
    return n + 1


@inline
def access_set(t, ops, s):
    """Transaction `t`'s distinct cells into ``s`` (parametric reads included); their
    count."""
    n = 0
    for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
        n = _add_cell(s, n, ops.cell[o], ops.kind[o] != READ, o)
        for d in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            n = _add_cell(s, n, ops.dep_cell[d], False, -1)
    return n


@inline
def _find(s, n, c):
    for i in range(n):
        if s.cell[i] == c:
            return i
    return -1


SKIP = -1
"""`_admit`: the transaction is another executor's."""


@inline
def _admit(t, tickets, order, me, deadline, s):
    """SKIP if transaction `t` is another executor's (tickets are dealt round-robin),
    else wait until the order counter admits its ticket (charged to sync): OK, or why
    the wait ended."""
    ticket = tickets[t]
    if ticket < 0 or ticket % me.parties != me.rank:
        return SKIP
    return wait_at_least(order, 0, ticket, me.sync, deadline, s.waited, False)


@inline
def _lock(locks, c, write, me, deadline):
    """Take cell ``c``'s lock, exclusive if ``write``, waiting while it is incompatible."""
    spins = 0
    start = 0
    while True:
        v = load_acquire(locks, c)
        if write:
            if v == 0 and compare_exchange(locks, c, 0, -1) == 0:
                return OK
        elif v >= 0 and compare_exchange(locks, c, v, v + 1) == v:
            return OK
        if spins == 0:
            start = monotonic_ns()
        spins += 1
        why = pause(spins, start, deadline, me.sync)
        if why != OK:
            return why


@jit
def run_locked(begin, end, ops, state, udf, results, tickets, words, me, s):
    """LOCK: this executor's transactions of begin..end-1 (``tickets[t] % parties ==
    rank``); OK, SET_FULL or why a wait ended."""
    deadline = monotonic_ns() + me.timeout_ns
    for t in range(begin, end):
        why = _admit(t, tickets, words.order, me, deadline, s)
        if why == SKIP:
            continue
        if why != OK:
            return why
        start = monotonic_ns()
        n = access_set(t, ops, s)
        for i in range(n):
            why = _lock(words.locks, s.cell[i], s.write[i], me, deadline)
            if why != OK:
                return why
        store_release(words.order, 0, tickets[t] + 1)
        s.waited[LOCK_NS] += monotonic_ns() - start
        if run_transaction(t, ops, state, udf, s.reads, s.log, results, True, s.waited):
            return SET_FULL
        for i in range(n):
            if s.write[i]:
                store_release(words.locks, s.cell[i], 0)
            else:
                fetch_add(words.locks, s.cell[i], -1)
    return OK


@jit
def reset_heads(first, end, ops, head):
    """Operations first..end-1 of a new chunk: no writer of their cells listed yet."""
    for o in range(first, end):
        head[ops.cell[o]] = -1
        for d in range(ops.dep_ptr[o], ops.dep_ptr[o + 1]):
            head[ops.dep_cell[d]] = -1


@inline
def _register(n, w, v, s):
    """MVLK: writer numbers of the cells written, writers before the cells read; each
    writer listed as its cell's latest (in ts order: the caller holds the turn)."""
    for i in range(n):
        c = s.cell[i]
        if s.write[i]:
            node = s.node[i]
            s.seq[i] = fetch_add(w.seq, c, 1)
            v.wseq[node] = s.seq[i]
            v.prev[node] = w.head[c]
            v.taken[node] = 0
            store_release(w.head, c, node)
        else:
            s.seq[i] = load_acquire(w.seq, c)


@inline
def version_read(c, r, w, v, values):
    """Cell ``c`` as its first ``r`` writers (all done) left it, whatever later writers
    did since: the version of writer ``r - 1`` if it is of this chunk, else the value
    before the chunk's first later writer took the cell, else the current value."""
    while True:
        h = load_acquire(w.head, c)
        later = -1
        while h >= 0 and v.wseq[h] >= r:
            later = h
            h = v.prev[h]
        if h >= 0:
            return v.after[h]
        if later >= 0:
            if load_acquire(v.taken, later):
                return v.before[later]
            value = load_acquire(values, c)
            if fetch_add(v.taken, later, 0):
                return v.before[later]
            return value
        value = load_acquire(values, c)
        if fetch_add(w.head, c, 0) == -1:
            return value  # no writer registered meanwhile


@inline
def _run_versioned(t, n, ops, state, udf, results, s):
    """Transaction `t` on the cells it waited for: in place where it writes, the
    versions it read elsewhere. 0 or SET_FULL."""
    values = state.values
    n_log = 0
    failed = 0
    for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
        first = ops.dep_ptr[o]
        n_reads = ops.dep_ptr[o + 1] - first
        for d in range(n_reads):
            i = _find(s, n, ops.dep_cell[first + d])
            s.reads[d] = values[s.cell[i]] if s.write[i] else s.value[i]
        i = _find(s, n, ops.cell[o])
        if s.write[i]:
            ok, result, n_log = apply_operation(o, ops, state, udf, s.reads, n_reads, s.log, n_log)
        else:
            ok, result = evaluate(o, s.value[i], ops, udf, s.reads, n_reads)
        if not ok:
            if result == SET_FULL:
                return SET_FULL
            failed = ops.reason[o]
            break
        record_output(t, o, ops, result, results)
    settle(t, failed, True, state, s.log, n_log, results, s.waited)
    return 0


@jit
def run_multiversioned(begin, end, ops, state, udf, results, tickets, w, v, me, s):
    """MVLK: this executor's transactions of begin..end-1 (as `run_locked`)."""
    deadline = monotonic_ns() + me.timeout_ns
    values = state.values
    for t in range(begin, end):
        why = _admit(t, tickets, w.order, me, deadline, s)
        if why == SKIP:
            continue
        if why != OK:
            return why
        start = monotonic_ns()
        n = access_set(t, ops, s)
        _register(n, w, v, s)
        store_release(w.order, 0, tickets[t] + 1)
        s.waited[LOCK_NS] += monotonic_ns() - start
        for i in range(n):
            c = s.cell[i]
            why = wait_at_least(w.done, c, s.seq[i], me.sync, deadline, s.waited, False)
            if why != OK:
                return why
            if s.write[i]:
                v.before[s.node[i]] = values[c]
                fetch_add(v.taken, s.node[i], 1)  # before the first write (acq_rel)
            else:
                s.value[i] = version_read(c, s.seq[i], w, v, values)
        if _run_versioned(t, n, ops, state, udf, results, s):
            return SET_FULL
        for i in range(n):
            if s.write[i]:
                v.after[s.node[i]] = values[s.cell[i]]
                store_release(w.done, s.cell[i], s.seq[i] + 1)
    return OK


@inline
def _sort(a, first, end):
    """Insertion sort of ``a[first:end]`` (a transaction's few partitions)."""
    for i in range(first + 1, end):
        x = a[i]
        j = i - 1
        while j >= first and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


@jit
def plan_partitions(ops, part_of_cell, next_seq, last, pools, pool, pool_size, my_index, plan):
    """PAT: the partitions of every transaction of the chunk and its place in their
    order (``next_seq``: each partition's transactions so far in the run, advanced);
    this executor runs those whose first operation's partition belongs to its ``pool``
    (partition ``p`` to pool ``p % pools``), spread over the pool's ``pool_size``
    executors by their place in it."""
    last[:] = -1
    k = 0
    n_txn = len(ops.txn_ptr) - 1
    for t in range(n_txn):
        plan.ptr[t] = k
        for o in range(ops.txn_ptr[t], ops.txn_ptr[t + 1]):
            for x in range(ops.dep_ptr[o], ops.dep_ptr[o + 1] + 1):
                c = ops.cell[o] if x == ops.dep_ptr[o + 1] else ops.dep_cell[x]
                p = part_of_cell[c]
                if last[p] != t:
                    last[p] = t
                    plan.part[k] = p
                    k += 1
        _sort(plan.part, plan.ptr[t], k)
        plan.mine[t] = 0
        home = part_of_cell[ops.cell[ops.txn_ptr[t]]] if k > plan.ptr[t] else -1
        for j in range(plan.ptr[t], k):
            p = plan.part[j]
            plan.seq[j] = next_seq[p]
            next_seq[p] += 1
            if p == home and p % pools == pool and plan.seq[j] % pool_size == my_index:
                plan.mine[t] = 1
    plan.ptr[n_txn] = k


@jit
def run_partitioned(begin, end, ops, state, udf, results, plan, counters, me, s):
    """PAT: this executor's transactions of begin..end-1, each once every partition it
    touches reached it (ascending partitions); OK, SET_FULL or why a wait ended."""
    deadline = monotonic_ns() + me.timeout_ns
    for t in range(begin, end):
        if not plan.mine[t]:
            continue
        for j in range(plan.ptr[t], plan.ptr[t + 1]):
            why = wait_at_least(
                counters, STRIDE * plan.part[j], plan.seq[j], me.sync, deadline, s.waited, False
            )
            if why != OK:
                return why
        if run_transaction(t, ops, state, udf, s.reads, s.log, results, True, s.waited):
            return SET_FULL
        for j in range(plan.ptr[t], plan.ptr[t + 1]):
            store_release(counters, STRIDE * plan.part[j], plan.seq[j] + 1)
    return OK


@jit
def run_unordered(begin, end, ops, state, udf, results, me, s):
    """No-Lock: transactions ``t % parties == rank`` of begin..end-1, as they come."""
    for t in range(begin + (me.rank - begin) % me.parties, end, me.parties):
        if results.status[t] == REJECTED:
            continue
        if run_transaction(t, ops, state, udf, s.reads, s.log, results, False, s.waited):
            return SET_FULL
    return OK
