"""Sink: writes output rows in ts order as committed part files, measures latency.

Executors hand it their shares of every chunk, in any order; it writes them in ts order
and publishes the *watermark* (how many events have their outputs written) in shared
memory, where the session and outside readers see it without a call. Rows go into a part
file under the output's ``_temporary/``; a part is closed and committed at the commit
points it is given (a flush, a checkpoint, the end) and, in a session, once it has been
open for ``PART_SECONDS``, so that committed outputs follow the stream closely.
"""

from __future__ import annotations

import bisect
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from txstream.connectors.outputs import OutputDir, events_writer
from txstream.monitor.metrics import LatencyHistogram, Timeline, equal_runs
from txstream.state.operations import REJECTED, STATUS_NAMES
from txstream.state.shared import ArrayHandle
from txstream.state.watermark import Watermark

PART_SECONDS = 1.0
"""In a session, a part is committed at the first write after it was open this long."""


class Sink:
    """Receives shares of output rows (from any executor, in any order) and writes them
    in ts order into part files (see module docstring)."""

    def __init__(
        self, output: OutputDir, schema: pa.Schema, watermark: ArrayHandle, start_ts: int = 0
    ):
        self.output = output
        self.schema = schema
        self._watermark = Watermark.attach(watermark)
        self._waiting: dict[int, tuple[pa.RecordBatch, np.ndarray]] = {}
        self._next_ts = start_ts
        self._commit_points: list[int] = []
        self._writer: pq.ParquetWriter | None = None
        self._part_start = start_ts
        self._part_opened = 0.0
        self._parts = 0
        self._committed = start_ts
        self.latency = LatencyHistogram()
        self.timeline = Timeline(time.time())
        self.counts = dict.fromkeys(STATUS_NAMES, 0)
        self.reasons: dict[str, int] = {}
        """Rejected events by reason."""
        self._cpu_s = 0.0
        self._publish()

    def pin(self, cpus: set[int]) -> None:
        """Run the calls that follow on ``cpus`` (a Sink that is a thread of the team's
        process: `ProgressController._pin`)."""
        os.sched_setaffinity(0, cpus)

    def write(self, rows: pa.RecordBatch, ts0: int, arrival: np.ndarray) -> None:
        """Accept a share that starts at ``ts0``; write every share that is now in order."""
        if rows.num_rows == 0:  # an executor's empty share of a small chunk
            return
        start = time.thread_time()  # a team's threads may share the process
        self._waiting[ts0] = (rows, arrival)
        while self._next_ts in self._waiting:
            rows, arrival = self._waiting.pop(self._next_ts)
            self._write(rows, arrival)
        self._cpu_s += time.thread_time() - start

    def commit_at(self, ts: int) -> None:
        """Commit a part that ends exactly at ``ts`` (registered before any row at or after
        ``ts`` is dispatched; committed at once if every row before it is written)."""
        if ts < self._next_ts:
            raise ValueError(
                f"sink: commit point {ts} is behind the rows written ({self._next_ts})"
            )
        bisect.insort(self._commit_points, ts)
        self._commit_due()

    def _write(self, rows: pa.RecordBatch, arrival: np.ndarray) -> None:
        while rows.num_rows:
            # never across a commit point: a part ends exactly there
            room = self._commit_points[0] - self._next_ts if self._commit_points else rows.num_rows
            piece, rows = rows.slice(0, room), rows.slice(room)
            part_arrival, arrival = arrival[:room], arrival[room:]
            if self._writer is None:
                self._open()
            self._writer.write_batch(piece)
            now = time.time()
            arrivals, counts = equal_runs(part_arrival)  # per run, not per event
            latencies = now - arrivals
            self.latency.add(latencies, counts)
            self.timeline.add(now, latencies, counts)
            status = _status_counts(piece)
            for name, count in zip(STATUS_NAMES, status, strict=True):
                self.counts[name] += count
            if status[REJECTED]:
                for reason, count in _rejection_reasons(piece).items():
                    self.reasons[reason] = self.reasons.get(reason, 0) + count
            self._next_ts += piece.num_rows
            self._commit_due()
        if self.output.progressive and time.monotonic() - self._part_opened >= PART_SECONDS:
            self._commit()
        self._publish()

    def _commit_due(self) -> None:
        while self._commit_points and self._commit_points[0] == self._next_ts:
            self._commit_points.pop(0)
            self._commit()

    def _open(self) -> None:
        self._part_start = self._next_ts
        self._part_opened = time.monotonic()
        self._writer = events_writer(self._in_progress(), self.schema)

    def _commit(self) -> None:
        """Close the open part and commit it (nothing to do if no row went into it)."""
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        self.output.stage_part(self._in_progress(), self._part_start)
        self._parts += 1
        self._committed = self._next_ts
        self._publish()

    def _in_progress(self) -> Path:
        return self.output.temporary / f"part-{self._part_start}.inprogress"

    def _publish(self) -> None:
        """The watermark (outputs written up to it) and the end of what is committed."""
        self._watermark.publish(self._next_ts, self._committed)

    def stats(self) -> dict:
        """What the sink has seen so far: watermark, status counts, latency percentiles."""
        return {
            "events": self._next_ts,
            **self.counts,
            "parts": self._parts,
            "cpu_s": round(self._cpu_s, 3),
            "latency_ms": {
                "p50": self.latency.percentile_ms(50),
                "p99": self.latency.percentile_ms(99),
            },
        }

    def live(self, latency_bounds: tuple[float, ...]) -> dict:
        """What the run's live metrics read on every scrape: events by status, rejections
        by reason, and the latency histogram as buckets at ``latency_bounds`` (seconds),
        with its sum and count."""
        return {
            **self.counts,
            "reasons": dict(self.reasons),
            "latency_buckets": self.latency.cumulative(latency_bounds),
            "latency_sum": self.latency.sum,
            "latency_count": int(self.latency.counts.sum()),
        }

    def finish(self) -> dict:
        """Commit the last part (an empty one if the run had no event, so that a one-shot
        output always has its events file); the sink's `stats` and its `Timeline`."""
        if self._waiting:
            raise RuntimeError(f"sink: shares after ts {self._next_ts} never became contiguous")
        if self._writer is None and not self.output.parts():
            self._open()
        self._commit()
        self._watermark.close()
        return {**self.stats(), "timeline": self.timeline.as_dict()}


def _rejection_reasons(rows: pa.RecordBatch) -> dict[str, int]:
    """Rejected rows by reason (the dictionary's strings)."""
    status = _codes(rows.column("status").indices, np.int8)
    reasons = rows.column("reason")
    codes = _codes(reasons.indices, np.int32)[status == REJECTED]
    counts = np.bincount(codes, minlength=len(reasons.dictionary))
    names = reasons.dictionary.to_pylist()
    return {names[code]: int(counts[code]) for code in np.flatnonzero(counts)}


def _codes(indices: pa.Array, dtype: type) -> np.ndarray:
    """A dictionary's codes as a view of their buffer (see `_status_counts`); a masked
    code (no reason) reads as whatever its slot holds: rejected rows always have one."""
    values = np.frombuffer(indices.buffers()[1], dtype, indices.offset + len(indices))
    return values[indices.offset :]


def _status_counts(rows: pa.RecordBatch) -> list[int]:
    """Rows per status code, from the codes' buffer: ``to_numpy(zero_copy_only=False)``
    imports pandas on its first call, which stalled a run's first write (py-spy). A
    comparison per code: ``np.bincount`` widened the int8 codes to 64 bits first."""
    values = _codes(rows.column("status").indices, np.int8)
    return [int(np.count_nonzero(values == code)) for code in range(len(STATUS_NAMES))]
