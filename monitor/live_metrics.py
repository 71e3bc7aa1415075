"""A run's live metrics in Prometheus' format: what an operator watches while it runs.

Nothing is counted twice: a scrape reads the run's own figures (`Figures`: what the Sink,
the executors, the checkpoints and the session already count) and `RunCollector` turns
them into Prometheus metric families, with the client library's types and exposition.
No metric is touched per event, so the run pays only for the scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from txstream.monitor.metrics import ACTIVITIES

LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the push-to-output latency histogram's buckets."""
CHUNK_BOUNDS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
"""Upper bounds (events) of the chunk size histogram's buckets."""
MAX_REASONS = 32
"""Rejection reasons given a label of their own; the rest are counted as ``other``."""
STATUSES = ("committed", "aborted", "rejected")


@dataclass
class Histogram:
    """Cumulative counts at a histogram's bounds, with the sum and count of observations."""

    buckets: list[int]
    sum: float
    count: int

    def samples(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        """Prometheus' buckets, ``+Inf`` last."""
        return [*zip((_bound(b) for b in bounds), self.buckets, strict=True), ("+Inf", self.count)]


@dataclass
class Figures:
    """What one scrape reads of a run (see module docstring)."""

    pushed: int
    watermark: int
    committed: int
    backlog_bytes: int
    statuses: dict[str, int]
    reasons: dict[str, int]
    latency: Histogram
    chunks: Histogram
    executors: list[tuple[float, ...]]
    """Per executor: seconds by activity (`ACTIVITIES`), then the operations it decomposed."""
    checkpoints: int
    checkpoint_seconds: float
    checkpoint_age_s: float | None
    recoveries: int
    rows: dict[str, int]
    decisions: dict[str, dict[str, int]] = field(default_factory=dict)
    ready: bool = True


class RunCollector(Collector):
    """The metric families of a run labelled ``run`` and ``topology``; ``read()`` gives the
    `Figures` of the moment (None while there is nothing to read: only the readiness)."""

    def __init__(self, run: str, topology: str, read: Callable[[], Figures | None]):
        self.labels = {"run": run, "topology": topology}
        self._read = read

    def collect(self) -> Iterator:
        """Every family, from one read of the run's figures."""
        figures = self._read()
        yield self._gauge("txstream_up", "1 while the run is alive", 1)
        ready = figures is not None and figures.ready
        yield self._gauge(
            "txstream_ready", "1 while the team runs; 0 while starting or recovering", int(ready)
        )
        if figures is None:
            return
        yield from self._events(figures)
        yield from self._team(figures)
        yield from self._checkpoints(figures)

    def _events(self, f: Figures) -> Iterator:
        yield self._counter("txstream_events_pushed", "events pushed into the run", f.pushed)
        events = self._family(
            CounterMetricFamily, "txstream_events", "events decided, by status", ["status"]
        )
        for status in STATUSES:
            events.add_metric([*self.labels.values(), status], f.statuses.get(status, 0))
        yield events
        reasons = self._family(
            CounterMetricFamily, "txstream_rejections", "events rejected, by reason", ["reason"]
        )
        for reason, count in bounded_reasons(f.reasons).items():
            reasons.add_metric([*self.labels.values(), reason], count)
        yield reasons
        yield self._gauge(
            "txstream_watermark_events", "events whose outputs are written", f.watermark
        )
        yield self._gauge(
            "txstream_committed_watermark_events",
            "events whose outputs are committed",
            f.committed,
        )
        yield self._gauge(
            "txstream_backlog_events",
            "events pushed and not yet processed (pushed - watermark)",
            max(0, f.pushed - f.watermark),
        )
        yield self._gauge(
            "txstream_backlog_bytes",
            "bytes of pushed tables not yet processed",
            f.backlog_bytes,
        )
        yield self._histogram(
            "txstream_latency_seconds",
            "push-to-output latency of each event",
            f.latency,
            LATENCY_BOUNDS,
        )

    def _team(self, f: Figures) -> Iterator:
        yield self._histogram(
            "txstream_chunk_events", "events per chunk handed to the team", f.chunks, CHUNK_BOUNDS
        )
        seconds = self._family(
            CounterMetricFamily,
            "txstream_executor_seconds",
            "seconds each executor spent, by activity (busy = useful)",
            ["executor", "activity"],
        )
        operations = self._family(
            CounterMetricFamily,
            "txstream_executor_operations",
            "state operations each executor decomposed",
            ["executor"],
        )
        for rank, row in enumerate(f.executors):
            for activity, value in zip(ACTIVITIES, row, strict=False):
                seconds.add_metric([*self.labels.values(), str(rank), activity], value)
            operations.add_metric([*self.labels.values(), str(rank)], row[len(ACTIVITIES)])
        yield seconds
        yield operations
        rows = self._family(
            GaugeMetricFamily,
            "txstream_table_rows",
            "rows per table (of a table of natural keys, the keys that exist)",
            ["table"],
        )
        for table, count in f.rows.items():
            rows.add_metric([*self.labels.values(), table], count)
        yield rows
        decisions = self._family(
            CounterMetricFamily,
            "txstream_scheduler_decisions",
            "punctuation batches by the scheduler's choice (morphstream)",
            ["dimension", "choice"],
        )
        for dimension, choices in f.decisions.items():
            for choice, count in choices.items():
                decisions.add_metric([*self.labels.values(), dimension, choice], count)
        yield decisions

    def _checkpoints(self, f: Figures) -> Iterator:
        yield self._counter("txstream_checkpoints", "checkpoints written", f.checkpoints)
        yield self._counter(
            "txstream_checkpoint_seconds",
            "seconds spent writing checkpoints in the background",
            f.checkpoint_seconds,
        )
        if f.checkpoint_age_s is not None:
            yield self._gauge(
                "txstream_checkpoint_age_seconds",
                "seconds since the newest checkpoint was written",
                f.checkpoint_age_s,
            )
        yield self._counter(
            "txstream_recoveries", "new teams started from a checkpoint", f.recoveries
        )

    # ---------------------------------------------------------------- families
    def _family(self, kind: type, name: str, documentation: str, labels: list[str]):
        return kind(name, documentation, labels=[*self.labels, *labels])

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = self._family(CounterMetricFamily, name, documentation, [])
        family.add_metric(list(self.labels.values()), value)
        return family

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = self._family(GaugeMetricFamily, name, documentation, [])
        family.add_metric(list(self.labels.values()), value)
        return family

    def _histogram(
        self, name: str, documentation: str, histogram: Histogram, bounds: tuple[float, ...]
    ) -> HistogramMetricFamily:
        family = self._family(HistogramMetricFamily, name, documentation, [])
        family.add_metric(
            list(self.labels.values()), histogram.samples(bounds), sum_value=histogram.sum
        )
        return family


def bounded_reasons(reasons: dict[str, int]) -> dict[str, int]:
    """``reasons`` (in the order first seen) with at most `MAX_REASONS` labels: the first
    keep theirs, later ones add up to ``other`` (a label's values must stay few for
    Prometheus, and a series must not move from one label to another)."""
    items = list(reasons.items())
    kept = dict(items[:MAX_REASONS])
    rest = sum(count for _, count in items[MAX_REASONS:])
    if rest:
        kept["other"] = kept.get("other", 0) + rest
    return kept


def _bound(value: float) -> str:
    """A bucket's bound as Prometheus' ``le`` label writes it."""
    return repr(float(value))
