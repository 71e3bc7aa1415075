"""Where punctuation batches end and how much work is handed to the team at once.

Plain classes, used by the ProgressController and tested without Ray.

*Punctuations* are cut by count (every ``interval`` events) and by time (when the oldest
event of the open batch has waited ``punctuation_s``), and on demand (a flush, the end of
the input, an idle team): a batch never waits for events that are not coming, nor while
the team has nothing to do. Batch sizes therefore vary; results never depend on them.

A *chunk* is whole batches handed to the team in one Ray call per executor. Its size is
adaptive (none of the seed systems has this): a chunk holds what the team serves in about
half the latency target, so that an event's output is not held back behind a long chunk;
while events queue up faster than the team serves them, a whole target's worth
(throughput: a Ray call and a few barriers per chunk are amortised). Never more: a chunk
sized blind took a one-shot run's 40k SL events at 40 us per function in one piece, and
its last outputs 5 s. The team's service rate is measured on the chunks it completes;
before the first is done the sizer hands out `START_EVENTS`, and a chunk is at most
`GROWTH` times the largest one measured, so that sizes grow as measurements come in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from txstream.config import CHUNK_EVENTS
from txstream.topologies.api import conform_events, one_batch

START_EVENTS = 1024
"""Chunk size before the team's rate is known: 0.1 s at 40 us per user function (SL),
and the ramp to full chunks costs a few small ones at C = 0."""
GROWTH = 4
"""A chunk is at most this many times the largest chunk measured so far."""


@dataclass
class Chunk:
    """Whole punctuation batches to hand to the team, starting at ``ts0``."""

    ts0: int
    events: pa.Table
    arrival: np.ndarray
    """Per event, when it arrived (``time.time()``: compared across processes)."""
    batch_ends: np.ndarray
    """End of every punctuation batch, relative to ``ts0``; the last one is the chunk's size."""

    @property
    def size(self) -> int:
        """Events in the chunk."""
        return self.events.num_rows


class Punctuator:
    """Pending events and the punctuations among them (see module docstring)."""

    def __init__(
        self,
        interval: int,
        punctuation_s: float | None,
        start_ts: int = 0,
        schema: pa.Schema | None = None,
    ):
        self.interval = interval
        self.schema = schema
        """With a schema, a chunk's events are conformed to it as the chunk is taken
        (`take`); without, they are added conformed."""
        self.punctuation_s = punctuation_s
        self.ts = start_ts
        """ts of the first pending event (every event before it is in a chunk)."""
        self._pieces: deque[tuple[pa.RecordBatch, int, int, float]] = deque()
        """Pending events as (batch, first row, rows, arrival)."""
        self._ends: deque[int] = deque()  # absolute ts where batches end (not yet taken)
        self._end = start_ts  # ts after the last pending event
        self._open = start_ts  # ts where the open batch starts
        self._open_since: float | None = None  # arrival of the open batch's first event
        self.time_cuts = 0
        self.count_cuts = 0

    @property
    def pending(self) -> int:
        """Events not yet taken into a chunk."""
        return self._end - self.ts

    @property
    def closed(self) -> int:
        """Pending events whose batch is closed (ready to be taken)."""
        return (self._ends[-1] if self._ends else self.ts) - self.ts

    def add(
        self, batch: pa.RecordBatch, arrival: float, first: int = 0, rows: int | None = None
    ) -> None:
        """Events that arrived at ``arrival``: ``rows`` rows of ``batch`` from ``first``
        (all of it by default); cuts a batch every ``interval`` events. Rows added in
        order from one batch make one slice of it in a chunk (`take`), not a copy."""
        rows = batch.num_rows - first if rows is None else rows
        if rows == 0:
            return
        self._pieces.append((batch, first, rows, arrival))
        if self._open == self._end:
            self._open_since = arrival
        self._end += rows
        while self._end - self._open >= self.interval:
            self._cut(self._open + self.interval, arrival)
            self.count_cuts += 1

    def punctuate(self) -> None:
        """Close the open batch now (a flush, the end of the input)."""
        if self._end > self._open:
            self._cut(self._end, None)

    def deadline(self) -> float | None:
        """When the open batch must be closed by time (``time.time()``), if it must."""
        if self.punctuation_s is None or self._open_since is None:
            return None
        return self._open_since + self.punctuation_s

    def cut_if_due(self, now: float) -> None:
        """Close the open batch if its oldest event has waited ``punctuation_s``."""
        deadline = self.deadline()
        if deadline is not None and now >= deadline:
            self.punctuate()
            self.time_cuts += 1

    def take(self, limit: int, split: bool = False) -> Chunk | None:
        """The longest run of closed batches of at most ``limit`` events (at least one
        batch), or None if no batch is closed. With ``split``, a first batch of more than
        ``limit`` events is cut after ``limit`` (a punctuation added, none moved)."""
        if not self._ends:
            return None
        if split and self._ends[0] - self.ts > limit:
            self._ends.appendleft(self.ts + limit)
        ends = [self._ends.popleft()]
        while self._ends and self._ends[0] - self.ts <= limit:
            ends.append(self._ends.popleft())
        n = ends[-1] - self.ts
        spans: list[list] = []  # [batch, first, rows]: consecutive rows of one batch
        arrivals, sizes = [], []
        taken = 0
        while taken < n:
            batch, first, rows, arrival = self._pieces[0]
            use = min(rows, n - taken)
            if spans and spans[-1][0] is batch and spans[-1][1] + spans[-1][2] == first:
                spans[-1][2] += use
            else:
                spans.append([batch, first, use])
            arrivals.append(arrival)
            sizes.append(use)
            taken += use
            if use == rows:
                self._pieces.popleft()
            else:
                self._pieces[0] = (batch, first + use, rows - use, arrival)
        chunk = Chunk(
            ts0=self.ts,
            events=pa.Table.from_batches([self._conformed(*span) for span in spans]),
            arrival=np.repeat(np.asarray(arrivals, np.float64), sizes),
            batch_ends=np.asarray(ends, np.int64) - self.ts,
        )
        self.ts = ends[-1]
        return chunk

    def _conformed(self, batch: pa.RecordBatch, first: int, rows: int) -> pa.RecordBatch:
        """Rows ``first..`` of ``batch``, ``rows`` of them, conformed to the schema: one
        conversion for all of them, and no copy where none is needed."""
        events = batch.slice(first, rows)
        return events if self.schema is None else one_batch(conform_events(events, self.schema))

    def _cut(self, at: int, arrival: float | None) -> None:
        """A batch ends at ``at``; the next one starts with an event that arrived at
        ``arrival`` (None: none pending yet)."""
        self._ends.append(at)
        self._open = at
        self._open_since = arrival if at < self._end else None


class ChunkSizer:
    """How many events to hand to the team at once (see module docstring).

    ``observe`` is told how long the team took for each chunk it completed, from the
    moment it could start it (its dispatch, or the end of the previous chunk, whichever is
    later): an estimate of the service rate, smoothed over recent chunks.
    """

    SMOOTHING = 0.3

    def __init__(self, latency_target_s: float, largest: int = CHUNK_EVENTS):
        self.latency_target_s = latency_target_s
        self.largest = largest
        self.rate: float | None = None
        """Events per second the team serves (None until a chunk completed)."""
        self._measured = 0  # the largest chunk measured

    def observe(self, events: int, seconds: float) -> None:
        """A chunk of ``events`` took the team ``seconds``."""
        if events <= 0 or seconds <= 0:
            return
        rate = events / seconds
        self.rate = rate if self.rate is None else self.rate + self.SMOOTHING * (rate - self.rate)
        self._measured = max(self._measured, events)

    @property
    def step(self) -> int:
        """Events the team serves in half the latency target (`START_EVENTS` before any
        measurement): the size of a chunk when the team keeps up, and how far a source
        is read ahead, in units of it."""
        if self.rate is None:
            return self._bounded(START_EVENTS)
        return self._bounded(self.rate * self.latency_target_s / 2)

    @property
    def target_events(self) -> float:
        """Events the team serves in one latency target (unbounded before any
        measurement)."""
        return math.inf if self.rate is None else self.rate * self.latency_target_s

    def limit(self, backlog: int) -> int:
        """Events for the next chunk when ``backlog`` events wait: the `step`, or twice it
        while the backlog alone takes longer than the latency target to serve."""
        if backlog <= self.target_events:
            return self.step
        return self._bounded(self.target_events)

    def _bounded(self, events: float) -> int:
        grown = max(START_EVENTS, GROWTH * self._measured)
        return int(np.clip(events, 1, min(self.largest, grown)))
