"""An executor's view of its team: barriers, published counts, the Coordinator, failure.

Python calls over the shared words of `txstream.state.sync`; the time spent waiting
is charged to the caller's time breakdown.
"""

from __future__ import annotations

import numpy as np
from txstream.monitor.metrics import Breakdown
from txstream.schedulers.statements import Sizes
from txstream.schedulers.team.placement import Seat
from txstream.state._kernels import compile_for
from txstream.state.sync import (
    ANSWER,
    ARGS,
    FAILURES,
    OK,
    PUBLISHED,
    REQUEST,
    add_to,
    barrier_wait,
    publish,
    published_word,
    raise_for_wait,
    report_failure,
    wait_reply,
    wake_coordinator,
    word,
)

assert len(Sizes._fields) <= PUBLISHED  # an executor publishes its share's sizes


class Member:
    """This executor's view of the sync block."""

    def __init__(self, seat: Seat, sync: np.ndarray, timeout_s: float):
        self.seat = seat
        self.rank = seat.rank
        self.parties = seat.parties
        self.sync = sync
        self.timeout_ns = int(timeout_s * 1e9)
        self._asked = 0
        self._failures_seen = 0
        self.alone = False
        """This executor runs the current chunk without its peers, which stepped aside
        (the scheduler's `Scheduler.alone_next`): its barriers wait for no one and its
        peers' shares are empty."""

    def barrier(self, breakdown: Breakdown) -> None:
        """Wait for every executor (charged to ``time`` as sync); raises if one failed
        or the timeout passed. Alone, there is no one to wait for."""
        if self.alone:
            return
        with breakdown.timing("sync"):
            why = barrier_wait(self.sync, self.parties, self.timeout_ns)
        self.check(why)

    def check(self, why: int) -> None:
        """Raise for a wait that did not end normally."""
        if why != OK:
            raise_for_wait(why, self.timeout_ns)

    def publish_share(self, counts: Sizes) -> None:
        """Publish what this executor's share of a chunk holds; every executor's is read
        after the next barrier (`shares`)."""
        for which, value in enumerate(counts):
            publish(self.sync, published_word(self.rank, which), value)

    def shares(self) -> list[Sizes]:
        """What every executor published of its share, by rank (alone: the peers' are
        empty)."""
        fields = range(len(Sizes._fields))
        empty = Sizes(*(0 for _ in fields))
        return [
            empty
            if self.alone and e != self.rank
            else Sizes(*(int(self.sync[published_word(e, w)]) for w in fields))
            for e in range(self.parties)
        ]

    def fail(self) -> None:
        """Make every peer's wait end with PEER_FAILED."""
        report_failure(self.sync)

    def ask_coordinator(
        self, kind: int, args: list[int], breakdown: Breakdown, activity: str
    ) -> int:
        """Every executor, together: executor 0 posts a request to the Coordinator, all
        wait for its answer (charged to ``activity``), which is returned."""
        self._asked += 1
        if self.rank == 0:
            base = word(ARGS)
            self.sync[base] = kind
            self.sync[base + 1 : base + 1 + len(args)] = args
            publish(self.sync, word(REQUEST), self._asked)
            wake_coordinator(self.sync)
        with breakdown.timing(activity):
            self.check(wait_reply(self.sync, self._asked, self.timeout_ns))
        return int(self.sync[word(ANSWER)])

    def add_failures(self, count: int) -> None:
        """Count operations of this executor that failed (read after the next barrier)."""
        if count:
            add_to(self.sync, word(FAILURES), count)

    def warm_up(self) -> None:
        """Compile (or load) the kernel `add_failures` calls, before the run."""
        compile_for(add_to, self.sync, 0, 0)

    def failures_since_last_check(self) -> int:
        """After a barrier: operations the team counted as failed since the last check."""
        total = int(self.sync[word(FAILURES)])
        new, self._failures_seen = total - self._failures_seen, total
        return new
