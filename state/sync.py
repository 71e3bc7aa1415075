"""Synchronisation between executors in shared memory: a barrier, progress counters,
published counts and work-pool counters, each on its own cache line.

Executors never make a Ray call to synchronise: they spin on these words (atomic
load-acquire / store-release), then sleep in short steps so that a long wait leaves
the core to the processes that feed them, and give up with an error code when a
peer reports a failure or the run's timeout passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from txstream._numba import (
    fetch_add,
    inline,
    jit,
    load_acquire,
    monotonic_ns,
    sleep_us,
    store_release,
)
from txstream.metrics import Breakdown

STRIDE = 8
"""int64 words per slot: one 64-byte cache line, so executors never share a line."""
ARRIVE, EPOCH, FAILED = 0, 1, 2
FIXED_SLOTS = 3
PER_EXECUTOR = 4  # progress, then three published counts
OK, TIMED_OUT, PEER_FAILED = 0, 1, 2
SPIN_NS = 50_000
"""How long a waiter busy-waits before it starts sleeping: most waits for a peer end
within microseconds, and a sleep costs ~60 us however short it is asked to be."""
SLEEP_US = 20
CHECK_EVERY = 63
"""Spin rounds between reads of the clock and the failure word (a mask)."""


def slots(executors: int, pools: int) -> int:
    """Size in int64 words of the block for ``executors`` and ``pools`` work pools."""
    return STRIDE * (FIXED_SLOTS + PER_EXECUTOR * executors + pools)


@inline
def progress_slot(executor):
    """Word holding how far ``executor`` is: all its operations below it are done."""
    return STRIDE * (FIXED_SLOTS + PER_EXECUTOR * executor)


@inline
def count_slot(executor, which):
    """Word where ``executor`` publishes count ``which`` (0..2)."""
    return STRIDE * (FIXED_SLOTS + PER_EXECUTOR * executor + 1 + which)


@inline
def pool_slot(executors, pool):
    """Word counting the chains claimed from work pool ``pool``."""
    return STRIDE * (FIXED_SLOTS + PER_EXECUTOR * executors + pool)


@inline
def _pause(spins, start, deadline, sync):
    """One round of waiting that began at ``start``; OK to keep waiting, else why to
    stop. Busy for SPIN_NS, then sleeping in short steps."""
    if (spins & CHECK_EVERY) != CHECK_EVERY:
        return OK
    if load_acquire(sync, STRIDE * FAILED) != 0:
        return PEER_FAILED
    now = monotonic_ns()
    if now > deadline:
        return TIMED_OUT
    if now - start > SPIN_NS:
        sleep_us(SLEEP_US)
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
        why = _pause(spins, start, deadline, sync)
        if why != OK:
            return why
    return OK


@inline
def wait_progress(sync, executor, target, deadline, waited):
    """Wait until ``executor`` has done all its operations below ``target``; the
    nanoseconds spent waiting are added to ``waited[0]`` (no clock read if none)."""
    if load_acquire(sync, progress_slot(executor)) >= target:
        return OK
    start = monotonic_ns()
    spins = 0
    why = OK
    while load_acquire(sync, progress_slot(executor)) < target:
        spins += 1
        why = _pause(spins, start, deadline, sync)
        if why != OK:
            break
    waited[0] += monotonic_ns() - start
    return why


@jit
def report_failure(sync):
    """Tell the peers to stop waiting: this executor failed."""
    store_release(sync, STRIDE * FAILED, 1)


@jit
def publish(sync, slot, value):
    """Store a word for the peers (visible to them after the next barrier)."""
    store_release(sync, slot, value)


@dataclass(frozen=True)
class Seat:
    """An executor's place in the team: picklable, handed to it at start."""

    rank: int
    parties: int
    pool: int
    pools: int
    pool_ranks: tuple[int, ...]
    """Ranks sharing this executor's work pool (lowest first)."""


def seats(placement: str, sockets: list[int]) -> list[Seat]:
    """Seats for executors on ``sockets`` (one entry per executor): shared-nothing has
    no pools, shared-per-socket one pool per socket, shared-everything one pool."""
    n = len(sockets)
    if placement == "shared-everything":
        pool_of = [0] * n
    else:
        order = sorted(set(sockets))
        pool_of = [order.index(s) for s in sockets]
    pools = 0 if placement == "shared-nothing" else max(pool_of) + 1
    return [
        Seat(r, n, pool_of[r], pools, tuple(i for i in range(n) if pool_of[i] == pool_of[r]))
        for r in range(n)
    ]


class Team:
    """This executor's view of the sync block: barriers and counts, as Python calls."""

    def __init__(self, seat: Seat, sync: np.ndarray, timeout_s: float):
        self.seat = seat
        self.rank = seat.rank
        self.parties = seat.parties
        self.sync = sync
        self.timeout_ns = int(timeout_s * 1e9)

    def barrier(self, time: Breakdown) -> None:
        """Wait for every executor (charged to ``time`` as sync); raises if one failed
        or the timeout passed."""
        with time.timing("sync"):
            why = barrier_wait(self.sync, self.parties, self.timeout_ns)
        self.check(why)

    def check(self, why: int) -> None:
        """Raise for a wait that did not end normally."""
        from txstream.errors import PeerFailed, RuntimeFailure

        if why == PEER_FAILED:
            raise PeerFailed("another executor failed")
        if why == TIMED_OUT:
            raise RuntimeFailure(f"executors waited on each other over {self.timeout_ns / 1e9} s")

    def publish_counts(self, *counts: int) -> None:
        """Publish this executor's counts; read them all after the next barrier."""
        for which, value in enumerate(counts):
            publish(self.sync, count_slot(self.rank, which), value)

    def counts(self, which: int) -> list[int]:
        """Count ``which`` of every executor, by rank."""
        return [int(self.sync[count_slot(e, which)]) for e in range(self.parties)]

    def reset_progress(self) -> None:
        """Start of a chunk: nothing of it is done yet."""
        publish(self.sync, progress_slot(self.rank), 0)

    def reset_pools(self) -> None:
        """Leader, before a barrier: every pool's claim counter back to 0."""
        for pool in range(self.seat.pools):
            publish(self.sync, pool_slot(self.parties, pool), 0)

    def fail(self) -> None:
        """Make every peer's wait end with PEER_FAILED."""
        report_failure(self.sync)
