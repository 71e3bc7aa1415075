"""ProgressController: the session's front door. Assigns ts, cuts punctuations, feeds the team.

Input arrives as it is pushed (Arrow tables, or sources it reads itself: Parquet files,
Spark partitions), in push order. ts is the position in the concatenation of everything
pushed. Punctuation batches are cut by count, by time, and at once when no chunk is in
flight nor ready (the team would otherwise sit idle until the cut), and handed to the team in
chunks of whole batches, sized for the latency target (`txstream.actors.punctuation`):
one Ray call per executor per chunk, never per event or per batch, and a bounded number
of chunks in flight. Every executor gets a contiguous share of every chunk to pre-process
(a team of threads, whose Python steps share one GIL, may ask for the whole chunk on
executor 0: `Scheduler.whole_chunks`); the team executes the chunk together,
synchronising in shared memory.

It runs as a Ray actor with three concurrency groups: ``input`` (push, flush, close: one
thread, so calls keep the order they were made in), ``run`` (the dispatch loop, one long
call for the whole session) and the default group (status and queries from outside
readers, when the session is named).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import ray
from txstream import schedulers
from txstream.actors.punctuation import Chunk, ChunkSizer, Punctuator
from txstream.cluster.transport import LocalActor, get, wait_all
from txstream.monitor.metrics import SizeHistogram
from txstream.state.checkpoints import CheckpointBuffer, CheckpointBufferHandle
from txstream.state.keys import KeyIndex, StreamKeys, dense_keys
from txstream.state.shared import ArrayHandle
from txstream.state.snapshots import SnapshotHandle, SnapshotRing
from txstream.state.values import ValueType, typed_table
from txstream.state.watermark import Watermark
from txstream.topologies.api import Layout, one_batch, own_memory

if TYPE_CHECKING:
    from txstream.config import RunConfig
    from txstream.connectors.sources import Source

CHUNKS_IN_FLIGHT = 2
"""Chunks handed to the team and not finished yet: one being executed, one ready."""
READ_AHEAD = 2
"""A source is read ahead of the team by up to this many chunk steps (`ChunkSizer.step`),
in pieces of one step, while what waits (read, or in flight) leaves room for one more
step within what the team serves in a latency target; past that, one step at a time, only
when the team has room for a chunk (`ProgressController._may_read`). So an event read
waits for at most the chunk being executed before its own, a one-shot run's latency
means what a session's does (events arrive when they are read), and memory stays
bounded. Read further ahead at costly operations, events waited for their turn and were
counted as a backlog (`ChunkSizer.limit`): latency ~3 targets (docs/performance.md)."""
SOURCE_BATCH_ROWS = 1 << 24
"""Rows asked of a source at a time for executors in this process. Sources in memory (a
table, Spark's partitions) hand views that long, read a `ChunkSizer.step` at a time: a
chunk's events are then one slice of them, conformed at once (`Punctuator.take`), which
executors read without a copy. Parquet decodes smaller batches of its own
(`txstream.connectors.sources.PARQUET_BATCH_ROWS`). Executors in other processes get at
most the largest chunk at a time: a pickled slice carries its whole batch's memory."""
CONCURRENCY = {"input": 1, "run": 1}
"""Ray concurrency groups (see module docstring)."""


def share_bounds(events: int, parties: int, whole: bool = False) -> list[tuple[int, int]]:
    """Contiguous, near-equal shares ``(first, end)`` of a chunk, in rank order; or, with
    ``whole``, the whole chunk for executor 0 and an empty share for the others."""
    if whole:
        return [(0, events)] + [(events, events)] * (parties - 1)
    cuts = [events * rank // parties for rank in range(parties + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


@dataclass
class _InFlight:
    seq: int
    ts0: int
    size: int
    dispatched: float
    calls: list


class ProgressController:
    """Takes pushed input in order and dispatches it to the whole team (module docstring).

    ``schema`` is the topology's canonical event schema (every pushed batch is conformed
    to it); ``watermark``, ``snapshots`` (None: nobody may query, `Plan.queryable`),
    ``layout`` and ``tables`` (value columns by table) serve outside readers.
    """

    def __init__(
        self,
        config: RunConfig,
        schema: pa.Schema,
        executors: list,
        sink: object,
        watermark: ArrayHandle,
        snapshots: SnapshotHandle | None,
        layout: Layout,
        tables: dict[str, list[str]],
        checkpoints: CheckpointBufferHandle | None = None,
        start_ts: int = 0,
        keys: StreamKeys | None = None,
        types: dict[str, dict[str, ValueType]] | None = None,
    ):
        self.config = config
        self.schema = schema
        self.executors = executors
        self._remote = not all(isinstance(e, LocalActor) for e in executors)
        self._whole = not self._remote and schedulers.get(config.scheduler).whole_chunks(config)
        """Executor 0 gets every chunk whole (`Scheduler.whole_chunks`)."""
        self._alone: bool | None = None
        """Executor 0 runs the next chunks alone, its peers idle (`Scheduler.alone_next`,
        as it answered for the last chunk reaped; only where chunks go whole to it). None
        until its first answer, which the second chunk waits for: a chunk dispatched
        before it would keep the whole team at its barriers."""
        self._first_walk = (
            schedulers.get(config.scheduler).first_walk_events(config) if self._whole else 0
        )
        """Events of the first chunk, which executor 0 runs alone (0: the team does;
        `Scheduler.first_walk_events`); the sizer learns the team's rate from the next."""
        self._cpus: tuple[set[int], set[int], set[int]] | None = None
        """Where the dispatch loop and its reaper run while the team works, where the
        Sink does (wherever the process may), and where all three run while executor 0
        runs alone (off its core, as beside one executor); set by `run`."""
        self._pinned_alone = False
        self._reaper_tid: int | None = None
        self.sink = sink
        self._handles = (watermark, snapshots)
        self.layout = layout
        self.tables = tables
        self.keys = keys
        """Turns the natural keys of a chunk into rows before the team gets it."""
        self.types = types or {}
        """The value types of every table's columns, which queries hand out."""
        self._readers: tuple[Watermark, SnapshotRing] | None = None
        self._cond = threading.Condition()
        self._queue: deque = deque()  # ("table", [(RecordBatch, arrival)]) | ("source", Source)
        self._flush_through = 0
        self._closing = False
        self._dispatching = True
        self._received = 0
        self._failure: BaseException | None = None
        self._reaper_cpu_s = 0.0  # the reaper thread's CPU, counted with the dispatch loop's
        punctuation_s = None if config.punctuation_ms is None else config.punctuation_ms / 1e3
        self._punctuator = Punctuator(config.punctuation_interval, punctuation_s, start_ts, schema)
        self._checkpoints = CheckpointBuffer.attach(checkpoints) if checkpoints else None
        self._batches_since_checkpoint = 0
        self._sizer = ChunkSizer(config.latency_target_ms / 1e3, config.max_chunk_events)
        self._in_flight: deque[_InFlight] = deque()
        self._seq = 0
        self._chunk_sizes = SizeHistogram()
        self._started = time.time()

    # ---------------------------------------------------------------- input (in order)
    @ray.method(concurrency_group="input")
    def push(self, events: pa.Table, runs: list[tuple[int, float]]) -> None:
        """Events pushed in ``runs`` of ``(rows, arrival)`` (one per push the session
        gathered into this call); they follow everything pushed before, and are conformed
        to the event schema as chunks are taken (`Punctuator.take`)."""
        pieces, start = [], 0
        for rows, arrival in runs:
            pieces += [(batch, arrival) for batch in events.slice(start, rows).to_batches()]
            start += rows
        with self._cond:
            self._queue.append(("table", pieces))
            self._received += events.num_rows
            self._cond.notify_all()

    @ray.method(concurrency_group="input")
    def push_source(self, source: Source) -> None:
        """A source to read in full (Parquet files, Spark partitions) after what was
        pushed before; its events arrive as they are read."""
        with self._cond:
            self._queue.append(("source", source))
            self._received += source.num_rows or 0
            self._cond.notify_all()

    @ray.method(concurrency_group="input")
    def flush(self, through: int) -> None:
        """Punctuate and commit the outputs once the first ``through`` events arrived."""
        with self._cond:
            self._flush_through = max(self._flush_through, through)
            self._cond.notify_all()

    @ray.method(concurrency_group="input")
    def close(self) -> None:
        """No more input: process what is pending, then `run` returns."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    # ---------------------------------------------------------------- the dispatch loop
    @ray.method(concurrency_group="run")
    def run(self, cpus: set[int] | None = None, alone_cpus: set[int] | None = None) -> dict:
        """Dispatch every pushed event until `close`; returns what each executor reports.
        Raises the root cause if an executor fails. With ``cpus``, the dispatch loop and
        its reaper run there (as threads: the calling thread is pinned); with
        ``alone_cpus``, there while executor 0 runs chunks alone (`_pin`)."""
        process_cpus = os.sched_getaffinity(0)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if alone_cpus:
            self._cpus = (os.sched_getaffinity(0), process_cpus, alone_cpus)
        cpu_start = time.thread_time()  # this thread's and the reaper's: not the team's
        reaper = threading.Thread(target=self._reap, name="reaper", daemon=True)
        reaper.start()
        self._reaper_tid = reaper.native_id
        try:
            self._dispatch_until_closed()
            with self._cond:
                while self._in_flight and self._failure is None:
                    self._cond.wait()
        finally:
            with self._cond:
                self._dispatching = False
                self._cond.notify_all()
            reaper.join()
        if self._failure is not None:
            raise self._failure
        executors = get([e.flush.remote() for e in self.executors], self.config.timeout_s)
        sizes, p = self._chunk_sizes, self._punctuator
        return {
            "events": p.ts,
            "executors": executors,
            "cpu_s": round(time.thread_time() - cpu_start + self._reaper_cpu_s, 3),
            "chunks": {
                "count": sizes.count,
                "events_p50": sizes.median(),
                "events_max": sizes.max,
            },
            "punctuations": {"by_count": p.count_cuts, "by_time": p.time_cuts},
        }

    def _dispatch_until_closed(self) -> None:
        p = self._punctuator
        source = None
        batch: pa.RecordBatch | None = None  # the source's last batch
        read = 0  # its rows read so far
        flushed = 0
        while True:
            with self._cond:
                while True:
                    if self._failure is not None:
                        return
                    self._take_tables()
                    if source is None and self._queue:
                        rows = self._sizer.largest if self._remote else SOURCE_BATCH_ROWS
                        source = self._queue.popleft()[1].iter_batches(rows)
                    now = time.time()
                    arrived = p.ts + p.pending
                    flush = self._flush_through if self._flush_through > flushed else 0
                    flush = flush if arrived >= flush else 0
                    room = self._room()
                    # the team has nothing to do: waiting for a cut would only add latency
                    # (a closed batch goes first: cutting the open one then adds a chunk)
                    idle = not self._in_flight and p.pending > 0 and not p.closed
                    # the end: cut the open batch and hand out the rest as room appears
                    ending = self._closing and source is None and not self._queue
                    ending = ending and (room or p.pending == 0)
                    step = self._sizer.step
                    readable = source is not None and self._may_read(step, room)
                    deadline = p.deadline()
                    due = deadline is not None and now >= deadline
                    if flush or ending or due or readable or idle or (room and p.closed):
                        break
                    self._cond.wait(None if deadline is None else max(deadline - now, 1e-3))
            if readable:
                if batch is None or read == batch.num_rows:
                    batch, read = next(source, None), 0
                if batch is None:
                    source = None
                else:
                    rows = min(step, batch.num_rows - read)
                    p.add(batch, time.time(), read, rows)  # conformed in chunks (`take`)
                    read += rows
            p.cut_if_due(time.time())
            if flush or ending or idle:
                p.punctuate()
            if flush:
                get(self.sink.commit_at.remote(flush), self.config.timeout_s)
                flushed = flush
            while self._room():
                chunk = self._take()
                if chunk is None:
                    break
                self._dispatch(chunk)
            if ending and p.pending == 0:
                return

    def _take(self) -> Chunk | None:
        """The next chunk as the sizer bounds it; the first no longer than the first walk
        (`_first_walk`), its first batch cut there if need be."""
        p = self._punctuator
        limit = self._sizer.limit(p.pending)
        if self._seq == 0 and self._first_walk:
            return p.take(min(limit, self._first_walk), split=True)
        return p.take(limit)

    def _room(self) -> bool:
        """Whether the team can take one more chunk: fewer than `CHUNKS_IN_FLIGHT` are in
        flight, and, where chunks go whole to executor 0, it answered whether it runs the
        next alone (`_alone`)."""
        if self._whole and self._alone is None and self._in_flight:
            return False
        return len(self._in_flight) < CHUNKS_IN_FLIGHT

    def _pin(self, alone: bool) -> None:
        """Executor 0 running alone leaves its peers' cores idle: the dispatch loop, its
        reaper and the Sink move there, off executor 0's core (the feeders otherwise
        share its core now and then: the Sink, left to the kernel's scheduler, took it
        from the lone executor tens of times a run); back when the team works."""
        if self._cpus is None or alone == self._pinned_alone:
            return
        team_cpus, sink_cpus, alone_cpus = self._cpus
        cpus = alone_cpus if alone else team_cpus
        os.sched_setaffinity(0, cpus)
        if self._reaper_tid is not None:
            with contextlib.suppress(OSError):  # (the reaper ended: a failure)
                os.sched_setaffinity(self._reaper_tid, cpus)
        self.sink.pin.remote(alone_cpus if alone else sink_cpus)
        self._pinned_alone = alone

    def _may_read(self, step: int, room: bool) -> bool:
        """Whether the source is read one ``step`` further (`READ_AHEAD`); ``room``: the
        team can take one more chunk. Called holding the condition."""
        pending = self._punctuator.pending
        waiting = pending + sum(chunk.size for chunk in self._in_flight)
        if waiting + step <= self._sizer.target_events:
            return pending < READ_AHEAD * step
        return room and pending < step

    def _checkpoint_after(self, chunk: Chunk) -> bool:
        """Whether the team copies the state for a checkpoint at the end of ``chunk``: once
        every ``checkpoint_every`` batches, when the copy asked last is written (else at
        the next chunk). Its outputs are then committed exactly up to there."""
        if self._checkpoints is None:
            return False
        self._batches_since_checkpoint += len(chunk.batch_ends)
        due = self._batches_since_checkpoint >= self.config.checkpoint_every
        if not due or not self._checkpoints.free:
            return False
        end = chunk.ts0 + chunk.size
        get(self.sink.commit_at.remote(end), self.config.timeout_s)
        self._checkpoints.ask(end)
        self._batches_since_checkpoint = 0
        return True

    def _take_tables(self) -> None:
        """Move pushed tables at the head of the queue to the punctuator (a source ahead
        of them is read first)."""
        while self._queue and self._queue[0][0] == "table":
            for batch, arrival in self._queue.popleft()[1]:
                self._punctuator.add(batch, arrival)

    def _dispatch(self, chunk: Chunk) -> None:
        checkpoint = self._checkpoint_after(chunk)
        events = chunk.events if self.keys is None else self.keys.rows(chunk.events)
        calls = []
        alone = self._whole and bool(self._alone or (self._seq == 0 and self._first_walk))
        self._pin(alone)
        executors = self.executors[:1] if alone else self.executors
        for executor, (first, end) in zip(
            executors, share_bounds(chunk.size, len(executors), self._whole), strict=True
        ):
            share = events.slice(first, end - first)
            if self._remote:  # pickled whole; a thread makes it one batch on its own core
                share = own_memory(one_batch(share))
            arrival = chunk.arrival[first:end]
            calls.append(
                executor.process.remote(
                    share, self._seq, first, chunk.ts0, chunk.batch_ends, arrival, checkpoint, alone
                )
            )
        with self._cond:
            self._in_flight.append(_InFlight(self._seq, chunk.ts0, chunk.size, time.time(), calls))
            self._cond.notify_all()
        self._chunk_sizes.add(chunk.size)
        self._seq += 1

    def _reap(self) -> None:
        """`_reap_in_order` on the reaper thread, whose CPU it then records."""
        try:
            self._reap_in_order()
        finally:
            self._reaper_cpu_s = time.thread_time()

    def _reap_in_order(self) -> None:
        """Wait for the chunks in flight in order; measure the team's service rate; keep
        the first failure (its root cause, not a peer's PeerFailed)."""
        previous_end = 0.0
        while True:
            with self._cond:
                while not self._in_flight and self._dispatching:
                    self._cond.wait()
                if not self._in_flight:
                    return
                oldest = self._in_flight[0]
            try:
                alone_next = wait_all(oldest.calls, self.config.timeout_s)[0]
            except BaseException as exc:
                with self._cond:
                    self._failure = exc
                    self._in_flight.clear()
                    self._cond.notify_all()
                return
            done = time.time()
            if oldest.seq or not self._first_walk:  # (the first walk is one executor's)
                self._sizer.observe(oldest.size, done - max(oldest.dispatched, previous_end))
            previous_end = done
            with self._cond:
                self._in_flight.popleft()
                self._alone = bool(alone_next)
                self._cond.notify_all()

    # ---------------------------------------------------------------- outside readers
    def status(self) -> dict:
        """Watermark, events received, throughput and latency so far; where the run's
        live metrics are served, if they are (`txstream top` reads them there)."""
        watermark, _ = self._attach()
        sink = get(self.sink.stats.remote(), self.config.timeout_s)
        up = time.time() - self._started
        w = watermark.written
        url = self.config.metrics_url
        served = {"metrics_url": url} if url else {}
        return {
            "watermark": w,
            "received": self._received,
            "pending": self._received - w,
            "uptime_s": round(up, 3),
            "throughput_eps": round(self._sizer.rate, 1) if self._sizer.rate else None,
            "latency_ms": sink["latency_ms"],
            "committed": sink["committed"],
            "aborted": sink["aborted"],
            "rejected": sink["rejected"],
            **served,
        }

    def live(self, bounds: tuple[int, ...]) -> dict:
        """The chunks handed to the team so far, as histogram buckets at ``bounds``
        (events), with their sum and count: what the run's live metrics read."""
        buckets, count = self._chunk_sizes.buckets(bounds)
        return {"buckets": buckets, "sum": self._chunk_sizes.sum, "count": count}

    def query(self, table: str, keys: list | None) -> tuple[int, pa.Table]:
        """A table's rows as of the watermark (see `SnapshotRing.query`); of a table of
        natural keys, by natural key (`StreamKeys.query`)."""
        watermark, ring = self._attach()

        def read(rows: list | np.ndarray | None) -> tuple[int, pa.Table]:
            return ring.query(
                self.layout,
                self.tables,
                table,
                rows,
                lambda: watermark.written,
                self.config.timeout_s,
            )

        if self.keys is not None and table in self.keys.indexes:
            ts, rows = self.keys.query(table, keys, read)
        else:
            ts, rows = read(dense_keys(table, keys))
        return ts, typed_table(rows, self.types.get(table, {}))

    def key_arrays(self) -> dict[str, np.ndarray]:
        """The key indexes as a checkpoint stores them (`StreamKeys.arrays`)."""
        return {} if self.keys is None else self.keys.arrays()

    def key_indexes(self) -> dict[str, KeyIndex]:
        """The key index of every table of natural keys, as the chunks so far made it."""
        return {} if self.keys is None else self.keys.indexes

    def _attach(self) -> tuple[Watermark, SnapshotRing]:
        if self._readers is None:
            watermark, snapshots = self._handles
            self._readers = (Watermark.attach(watermark), SnapshotRing.attach(snapshots))
        return self._readers
