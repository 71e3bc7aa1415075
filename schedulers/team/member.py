"""An executor's view of its team: barriers, published counts, the Coordinator, failure.

Python calls over the shared words of `txstream.state.sync`; the time spent waiting
is charged to the caller's time breakdown.
"""

from __future__ import annotations

import numpy as np
from txstream.monitor.metrics import Breakdown
from txstream.schedulers.team.placement import Seat
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


class Team:
    """This executor's view of the sync block."""

    def __init__(self, seat: Seat, sync: np.ndarray, timeout_s: float):
        self.seat = seat
        self.rank = seat.rank
        self.parties = seat.parties
        self.sync = sync
        self.timeout_ns = int(timeout_s * 1e9)
        self._asked = 0
        self._failures_seen = 0

    def barrier(self, time: Breakdown) -> None:
        """Wait for every executor (charged to ``time`` as sync); raises if one failed
        or the timeout passed."""
        with time.timing("sync"):
            why = barrier_wait(self.sync, self.parties, self.timeout_ns)
        self.check(why)

    def check(self, why: int) -> None:
        """Raise for a wait that did not end normally."""
        if why != OK:
            raise_for_wait(why, self.timeout_ns)

    def publish_counts(self, *counts: int) -> None:
        """Publish this executor's counts; read them all after the next barrier."""
        assert len(counts) <= PUBLISHED
        for which, value in enumerate(counts):
            publish(self.sync, published_word(self.rank, which), value)

    def counts(self, which: int) -> list[int]:
        """Published count ``which`` of every executor, by rank."""
        return [int(self.sync[published_word(e, which)]) for e in range(self.parties)]

    def fail(self) -> None:
        """Make every peer's wait end with PEER_FAILED."""
        report_failure(self.sync)

    def ask_coordinator(self, kind: int, args: list[int], time: Breakdown, activity: str) -> int:
        """Every executor, together: executor 0 posts a request to the Coordinator, all
        wait for its answer (charged to ``activity``), which is returned."""
        self._asked += 1
        if self.rank == 0:
            base = word(ARGS)
            self.sync[base] = kind
            self.sync[base + 1 : base + 1 + len(args)] = args
            publish(self.sync, word(REQUEST), self._asked)
            wake_coordinator(self.sync)
        with time.timing(activity):
            self.check(wait_reply(self.sync, self._asked, self.timeout_ns))
        return int(self.sync[word(ANSWER)])

    def add_failures(self, count: int) -> None:
        """Count operations of this executor that failed (read after the next barrier)."""
        if count:
            add_to(self.sync, word(FAILURES), count)

    def failures_since_last_check(self) -> int:
        """After a barrier: operations the team counted as failed since the last check."""
        total = int(self.sync[word(FAILURES)])
        new, self._failures_seen = total - self._failures_seen, total
        return new
