"""What a scrape of a run's live metrics reads of its team (`txstream.monitor.live_metrics`).

The watermark words and the executors' rows are in shared memory: read without a call.
The Sink's counts and latency histogram and the ProgressController's chunk sizes take
one call each per scrape, never anything per event. A recovery starts a new team, whose
actors count from nothing: what the teams before it decided is kept here, so that the
counters only grow - the events before the checkpoint by their committed outputs (the
events after it are decided again), the observations of latency as they were made.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from txstream.actors.executor import DECISIONS, output_schema
from txstream.cluster.transport import get
from txstream.connectors.outputs import part_first_ts, read_events
from txstream.engine.engine import Engine
from txstream.monitor.live_metrics import CHUNK_BOUNDS, LATENCY_BOUNDS, Histogram
from txstream.monitor.metrics import LIVE_EXECUTOR
from txstream.state.operations import STATUS_NAMES

SCRAPE_TIMEOUT_S = 5.0
"""How long a scrape waits for the team's answers (a busy actor answers between calls)."""


class LiveTeam:
    """The team's part of a run's `Figures`, read on every scrape (module docstring)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._launch = 0
        self._team: tuple[Any, Any] = (None, None)  # the Sink and ProgressController counted
        self._last: dict[str, Any] | None = None  # the current team's last answers
        self._before: dict[str, Any] = _nothing()  # what the teams before it counted
        self._rows = np.zeros(engine.live.handle.shape)  # the executors' rows read last
        self._lock = threading.Lock()  # scrapes and Ray's metrics read at the same time

    def read(self, ask: bool = True) -> dict[str, Any] | None:
        """Events by status and rejection reason, the latency and chunk histograms, the
        executors' rows (`LIVE_EXECUTOR`) and the scheduler's decisions: those of the teams
        so far. None before the first team answers; while a team does not answer (it is
        starting, or has died) or is not ``ask``ed, its last answers."""
        with self._lock:
            return self._read(ask)

    def _read(self, ask: bool) -> dict[str, Any] | None:
        engine = self.engine
        launch, first_ts, sink, controller = engine.launched
        if launch != self._launch:
            self._new_team(launch, first_ts, (sink, controller))
        answers = self._ask() if ask else None
        if answers is not None:
            self._last = answers
        if self._last is None:
            return None
        # counters only grow: a launch moving the rows into `live_before` is read as less
        rows = self._rows = np.maximum(self._rows, engine.live_before + engine.live.array)
        width = len(LIVE_EXECUTOR)
        decisions: dict[str, dict[str, int]] = {}
        if rows[0, width:].any():  # a scheduler that makes choices
            for (dimension, choice), count in zip(DECISIONS, rows[0, width:], strict=True):
                decisions.setdefault(dimension, {})[choice] = int(count)
        return _added(self._before, self._last) | {
            "executors": [tuple(row[:width].tolist()) for row in rows],
            "decisions": decisions,
        }

    def _ask(self) -> dict[str, Any] | None:
        sink, controller = self._team  # not the engine's: it may be launching the next one
        if sink is None:
            return None
        try:
            counts, chunks = get(
                [
                    sink.live.remote(LATENCY_BOUNDS),
                    controller.live.remote(CHUNK_BOUNDS),
                ],
                SCRAPE_TIMEOUT_S,
            )
        except Exception:  # a dead or stopped team: the next one answers
            return None
        latency = Histogram(
            counts["latency_buckets"], counts["latency_sum"], counts["latency_count"]
        )
        return {
            "statuses": {name: counts[name] for name in STATUS_NAMES},
            "reasons": counts["reasons"],
            "latency": latency,
            "chunks": Histogram(chunks["buckets"], chunks["sum"], chunks["count"]),
        }

    def _new_team(self, launch: int, first_ts: int, team: tuple[Any, Any]) -> None:
        """A recovery's ``team`` (its Sink and ProgressController): its predecessors'
        latency observations and chunks are kept, their decisions are those of the
        committed outputs before its first event."""
        before = self._before if self._last is None else _added(self._before, self._last)
        if launch > 1 or self.engine.plan.resume is not None:
            before["statuses"], before["reasons"] = self._committed_outcomes(first_ts)
        self._before, self._last, self._launch, self._team = before, None, launch, team

    def _committed_outcomes(self, first_ts: int) -> tuple[dict[str, int], dict[str, int]]:
        """Events by status and rejected events by reason in the committed outputs before
        the event ``first_ts``."""
        plan = self.engine.plan
        parts = [p for p in plan.output.parts() if part_first_ts(p.name) < first_ts]
        schema = output_schema(plan.topology)
        return outcomes(read_events(parts, schema, ["status", "reason"]))


def outcomes(rows: pa.Table) -> tuple[dict[str, int], dict[str, int]]:
    """Events by status and rejected events by reason among output ``rows`` (of columns
    ``status`` and ``reason`` at least)."""
    statuses = dict.fromkeys(STATUS_NAMES, 0)
    for count in pc.value_counts(rows.column("status")).to_pylist():
        statuses[count["values"]] = count["counts"]
    rejected = rows.filter(pc.equal(rows.column("status"), "rejected")).column("reason")
    reasons = {c["values"]: c["counts"] for c in pc.value_counts(rejected).to_pylist()}
    return statuses, reasons


def _nothing() -> dict[str, Any]:
    return {
        "statuses": dict.fromkeys(STATUS_NAMES, 0),
        "reasons": {},
        "latency": Histogram([0] * len(LATENCY_BOUNDS), 0.0, 0),
        "chunks": Histogram([0] * len(CHUNK_BOUNDS), 0, 0),
    }


def _added(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two teams' counts added up."""
    return {
        "statuses": _sum_counts(a["statuses"], b["statuses"]),
        "reasons": _sum_counts(a["reasons"], b["reasons"]),
        "latency": _sum_histograms(a["latency"], b["latency"]),
        "chunks": _sum_histograms(a["chunks"], b["chunks"]),
    }


def _sum_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {key: a.get(key, 0) + b.get(key, 0) for key in {**a, **b}}


def _sum_histograms(a: Histogram, b: Histogram) -> Histogram:
    buckets = (np.asarray(a.buckets) + np.asarray(b.buckets)).tolist()
    return Histogram(buckets, a.sum + b.sum, a.count + b.count)
