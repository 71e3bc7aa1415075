"""Synchronisation between executors in shared memory: the team's barrier, its failure
flag, the words each executor publishes for its peers, and the request/reply words of
the Coordinator, each on its own cache line; and waiting on any shared word.

Executors never make a Ray call to synchronise. Every wait on a shared word (barriers,
dependency waits, the baselines' hand-offs) follows one policy, `pause`: spin, then
sleep in steps that grow with the wait; it gives up with an error code when a peer
reports a failure or the run's timeout passes. Only the waits for the Coordinator sleep
on a futex at once (it needs one of the executors' cores to answer). Words a scheduler needs besides
these (progress counters, work-pool counters, ...) it declares itself, in its run
segment (`txstream.state.chunk`).
"""

from __future__ import annotations

import ctypes
import platform
from time import monotonic_ns as clock_ns

import numpy as np
from txstream.state._numba import (
    fetch_add,
    fine_timer_slack,
    inline,
    jit,
    load_acquire,
    monotonic_ns,
    sleep_us,
    store_release,
)

STRIDE = 8
"""int64 words per line of the sync block: one 64-byte cache line, so executors never
share a line."""
ARRIVE, EPOCH, FAILED = 0, 1, 2
REQUEST, REPLY, STOP, FAILURES, ANSWER, ARGS = 3, 4, 5, 6, 7, 8
"""Lines of the Coordinator's words: requests posted and answered (counters), the
driver's stop word, operations that failed so far (counter), the last answer, and a
request's arguments."""
ARG_WORDS = 2 * STRIDE
PAUSE = 10
"""Set by an executor that asks its peers to stop at their next safe point (an
interruptible wait returns INTERRUPTED while it is set)."""
FIXED_LINES = 11
PUBLISHED = STRIDE
"""Words each executor may publish for its peers (one cache line per executor)."""
OK, TIMED_OUT, PEER_FAILED, INTERRUPTED = 0, 1, 2, 3
SPIN_NS = 200_000
"""How long a waiter busy-waits before it sleeps. Between two pinned processes
(bench/waits.py), a hand-off to a spinning waiter takes well under a microsecond, whether
or not lower-priority processes want the cores; to a sleeping one over ten microseconds
(``usleep`` at 1 us timer slack, or a futex wake), tens at the default slack. A futex
would need every publisher of every waited word to wake. Most waits end within a
transaction's time (tens of microseconds at --udf-cost-us 10: the baselines' hand-offs,
a dependency on the peer's operation), so they stay in the spin. ``sched_yield`` is not
used: with a feeder runnable on the waiter's core a hand-off can take milliseconds (the
yield gives the feeder a whole time slice)."""
SLEEP_US = 10
"""Past SPIN_NS the wait is long (a peer descheduled, or building alone): sleep in steps
of at least this, with the thread's timer slack at 1 us (`fine_timer_slack`) so that a
step lasts about what it asks for, leaving the core to the processes feeding the team."""
BACKOFF = 16
"""A step is at most 1/BACKOFF of the time waited past SPIN_NS (so waking up adds at most
~6% to a long wait), and at most MAX_SLEEP_US: a waiter sleeping in short steps takes
a good part of a core in wake-ups, one sleeping in millisecond steps next to nothing
(bench/waits.py): CPU that the processes feeding the team need meanwhile."""
MAX_SLEEP_US = 1000
CHECK_EVERY = 63
"""Spin rounds between reads of the clock and the failure word (a mask)."""


def sync_words(executors: int) -> int:
    """Size in int64 words of the sync block of a team of ``executors``."""
    return STRIDE * (FIXED_LINES + executors)


def published_word(executor: int, which: int) -> int:
    """Word where ``executor`` publishes its value ``which`` (< PUBLISHED)."""
    return STRIDE * (FIXED_LINES + executor) + which


@inline
def word(line):
    """Index of the first word of fixed line ``line``."""
    return STRIDE * line


@inline
def pause(spins, start, deadline, sync):
    """One round of waiting that began at ``start``; OK to keep waiting, else why to
    stop. Busy for SPIN_NS, then sleeping in steps that grow with the wait (SLEEP_US,
    BACKOFF, MAX_SLEEP_US)."""
    if (spins & CHECK_EVERY) != CHECK_EVERY:
        return OK
    if load_acquire(sync, STRIDE * FAILED) != 0:
        return PEER_FAILED
    now = monotonic_ns()
    if now > deadline:
        return TIMED_OUT
    if now - start > SPIN_NS:
        fine_timer_slack()
        step = (now - start - SPIN_NS) // (1000 * BACKOFF)
        sleep_us(min(MAX_SLEEP_US, max(SLEEP_US, step)))
    return OK


@jit
def barrier_wait(sync, parties, timeout_ns):
    """Wait until all ``parties`` arrived (epoch barrier); OK, TIMED_OUT or PEER_FAILED."""
    epoch = load_acquire(sync, STRIDE * EPOCH)
    if fetch_add(sync, STRIDE * ARRIVE, 1) == parties - 1:
        store_release(sync, STRIDE * ARRIVE, 0)
        fetch_add(sync, STRIDE * EPOCH, 1)
        return OK
    start = monotonic_ns()
    deadline = start + timeout_ns
    spins = 0
    while load_acquire(sync, STRIDE * EPOCH) == epoch:
        spins += 1
        why = pause(spins, start, deadline, sync)
        if why != OK:
            return why
    return OK


@inline
def wait_at_least(words, index, target, sync, deadline, waited, interruptible):
    """Wait until ``words[index] >= target`` (a word of any shared array; ``sync`` is
    the team's block, whose failure flag ends the wait, and, if ``interruptible``, its
    PAUSE word: INTERRUPTED); the nanoseconds spent waiting are added to ``waited[0]``
    (no clock read if there was no wait)."""
    if load_acquire(words, index) >= target:
        return OK
    start = monotonic_ns()
    spins = 0
    why = OK
    while load_acquire(words, index) < target:
        if interruptible and load_acquire(sync, STRIDE * PAUSE):
            why = INTERRUPTED
            break
        spins += 1
        why = pause(spins, start, deadline, sync)
        if why != OK:
            break
    waited[0] += monotonic_ns() - start
    return why


def wait_request(sync: np.ndarray, answered: int) -> int:
    """Coordinator: wait until a request after number ``answered`` is posted, the driver
    asks it to stop (then the request count stays ``answered``) or an executor fails.
    It sleeps on a futex, so it takes no core from the executors while there is nothing
    to resolve. No timeout: a run may go on for long without an abort; the driver stops
    the Coordinator at the end, or kills it when the run fails."""
    while load(sync, word(REQUEST)) <= answered and not load(sync, word(STOP)):
        if load(sync, word(FAILED)):
            return PEER_FAILED
        _futex(sync, word(REQUEST), FUTEX_WAIT, answered, _WAKE_CHECK)
    return OK


def wake_coordinator(sync: np.ndarray) -> None:
    """Wake the Coordinator's `wait_request` after a request or a stop was posted."""
    _futex(sync, word(REQUEST), FUTEX_WAKE, 1, None)


def wait_reply(sync: np.ndarray, asked: int, timeout_ns: int) -> int:
    """Executors: wait until the Coordinator answered request number ``asked``. They
    sleep on a futex rather than spin: the Coordinator needs one of their cores."""
    deadline = clock_ns() + timeout_ns
    while (replied := load(sync, word(REPLY))) < asked:
        if load(sync, word(FAILED)):
            return PEER_FAILED
        if clock_ns() > deadline:
            return TIMED_OUT
        _futex(sync, word(REPLY), FUTEX_WAIT, replied, _WAKE_CHECK)
    return OK


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
FUTEX_WAIT, FUTEX_WAKE = 0, 1
"""Shared (not private) futex operations: the word lives in shared memory."""
_WAKE_CHECK = _Timespec(0, 100_000_000)
"""A sleeper on a futex looks at the failure word (and its deadline) every 100 ms."""


def _futex(sync: np.ndarray, index: int, op: int, value: int, timeout: _Timespec | None) -> None:
    """futex(2) on the low 32 bits of word ``index`` (little-endian)."""
    address = ctypes.c_void_p(sync.ctypes.data + index * sync.itemsize)
    expected = ctypes.c_int32(value)  # truncated to the low 32 bits, as the kernel compares
    timeout_ref = ctypes.byref(timeout) if timeout is not None else None
    _LIBC.syscall(_SYS_FUTEX, address, op, expected, timeout_ref, None, 0)


@jit
def add_to(sync, index, value):
    """Atomically add ``value`` to word ``index``; returns its new value."""
    return fetch_add(sync, index, value) + value


@jit
def report_failure(sync):
    """Tell the peers to stop waiting: this executor failed."""
    store_release(sync, STRIDE * FAILED, 1)


@jit
def publish(sync, index, value):
    """Store word ``index`` for the peers (visible to them after the next barrier)."""
    store_release(sync, index, value)


@jit
def load(sync, index):
    """Word ``index`` as the last store to it left it (load-acquire)."""
    return load_acquire(sync, index)


def raise_for_wait(why: int, timeout_ns: int) -> None:
    """Raise for a wait that ended with ``why`` (not OK)."""
    from txstream.errors import PeerFailed, RuntimeFailure

    if why == PEER_FAILED:
        raise PeerFailed("another member of the team failed")
    raise RuntimeFailure(f"the team waited on each other over {timeout_ns / 1e9} s")


def request(sync: np.ndarray) -> tuple[int, list[int]]:
    """Coordinator: the posted request's kind and arguments."""
    base = word(ARGS)
    return int(sync[base]), [int(v) for v in sync[base + 1 : base + ARG_WORDS]]


def answer(sync: np.ndarray, number: int, value: int) -> None:
    """Coordinator: answer request ``number`` with ``value`` and wake the executors."""
    sync[word(ANSWER)] = value
    publish(sync, word(REPLY), number)
    _futex(sync, word(REPLY), FUTEX_WAKE, 1 << 30, None)


def posted(sync: np.ndarray) -> int:
    """Coordinator: how many requests were posted so far."""
    return int(load(sync, word(REQUEST)))


def ask_to_stop(sync: np.ndarray) -> None:
    """Driver: the run is over, the Coordinator may return."""
    publish(sync, word(STOP), 1)
    wake_coordinator(sync)
