"""Run metrics: the papers' time breakdown and per-event latency percentiles."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np


@dataclass
class Breakdown:
    """Seconds spent per activity, as TStream and MorphStream break execution down.

    useful: pre-/post-processing and executing operations; sync: waiting at barriers
    or for other executors; lock: acquiring locks; construct: decomposing transactions
    into operations and building chains or graphs; explore: finding ready operations;
    abort: rolling back and redoing after aborts.
    """

    useful: float = 0.0
    sync: float = 0.0
    lock: float = 0.0
    construct: float = 0.0
    explore: float = 0.0
    abort: float = 0.0

    @contextmanager
    def timing(self, activity: str) -> Iterator[None]:
        """Add the time spent in the ``with`` block to ``activity``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, activity, getattr(self, activity) + time.perf_counter() - start)

    def add(self, other: Breakdown) -> None:
        """Accumulate another breakdown into this one."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        """Rounded seconds by activity."""
        return {k: round(v, 6) for k, v in asdict(self).items()}


def equal_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as (value, how many times) per run of equal neighbours: events that
    arrived together have the same arrival time and latency, and a histogram bins each
    run once (a binary search per event would be a large share of the Sink's time)."""
    values = np.asarray(values)
    if not len(values):
        return values, np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts], np.diff(np.append(starts, len(values)))


class LatencyHistogram:
    """Per-event latencies in log-spaced bins: bounded memory, ~1% precision."""

    EDGES = np.logspace(-6, 4, 2001)  # 1 us .. 10^4 s

    def __init__(self) -> None:
        self.counts = np.zeros(len(self.EDGES) + 1, np.int64)

    def add(self, seconds: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count latencies ``seconds``, each ``counts`` times (default: once; see
        `equal_runs`)."""
        if counts is None:
            seconds, counts = equal_runs(seconds)
        if not len(seconds):
            return
        bins = np.searchsorted(self.EDGES, seconds)
        self.counts += np.bincount(bins, weights=counts, minlength=len(self.counts)).astype(
            np.int64
        )

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile in milliseconds (bin upper edge), None without events."""
        total = self.counts.sum()
        if total == 0:
            return None
        rank = int(np.ceil(q / 100 * total))
        i = int(np.searchsorted(np.cumsum(self.counts), max(rank, 1)))
        return round(float(self.EDGES[min(i, len(self.EDGES) - 1)]) * 1e3, 4)


class Timeline:
    """Events out and their latency, per second of the run: what the report plots over
    time. Each second keeps three figures (its latency histogram only while it lasts), so
    memory grows by a few bytes per second of run, whatever the rate."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._second = 0
        self._now = LatencyHistogram()
        self.series: dict[str, list] = {
            "second": [],
            "events": [],
            "latency_p50_ms": [],
            "latency_p99_ms": [],
        }

    def add(self, now: float, latencies: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count events that came out at ``now`` (`time.time`) with ``latencies`` (s),
        each ``counts`` times (default: once)."""
        second = max(0, int(now - self.start))
        if second != self._second:
            self._close()
            self._second = second
        self._now.add(latencies, counts)

    def _close(self) -> None:
        events = int(self._now.counts.sum())
        if events:
            self.series["second"].append(self._second)
            self.series["events"].append(events)
            self.series["latency_p50_ms"].append(self._now.percentile_ms(50))
            self.series["latency_p99_ms"].append(self._now.percentile_ms(99))
            self._now = LatencyHistogram()

    def as_dict(self) -> dict[str, list]:
        """The series so far (seconds since ``start`` in which events came out)."""
        self._close()
        return {key: list(values) for key, values in self.series.items()}


def run_metrics(summary: dict, run_info: dict, seconds: float) -> dict[str, Any]:
    """The engine's part of metrics.json: event counts from the Sink's ``summary``, the time
    breakdown and per-batch figures from the executors' reports in ``run_info``, over a run
    of ``seconds``."""
    total = Breakdown()
    for executor in run_info["executors"]:
        total.add(Breakdown(**executor["breakdown_s"]))
    events = summary["events"]
    return {
        "events": events,
        "committed": summary["committed"],
        "aborted": summary["aborted"],
        "rejected": summary["rejected"],
        "seconds": round(seconds, 6),
        "throughput_eps": round(events / seconds, 1) if seconds > 0 else None,
        "latency_ms": summary["latency_ms"],
        "timeline": summary["timeline"],
        "breakdown_s": total.as_dict(),
        "breakdown_per_executor_s": [e["breakdown_s"] for e in run_info["executors"]],
        "batches": batch_metrics(run_info["executors"]),
        "chunks": run_info["chunks"],
        "punctuations": run_info["punctuations"],
        "cpu_s": {"progress_controller": run_info["cpu_s"], "sink": summary["cpu_s"]},
        "operations": sum(e["operations"] for e in run_info["executors"]),
        **run_info["executors"][0]["scheduler"],  # what the scheduler reports (decisions)
    }


def batch_metrics(executors: list[dict]) -> dict[str, Any]:
    """Per punctuation batch: how long the team's state access took (percentiles; the
    batches end at a barrier, so every executor saw the same durations), and the time
    breakdown of every chunk of batches, summed over the executors that ran it (executor 0
    runs every chunk; its peers may step aside from some: `Member.alone`)."""
    seconds = np.asarray(executors[0]["batch_seconds"])
    totals: dict[int, Breakdown] = {}
    for executor in executors:
        for part in executor["chunks"]:
            totals.setdefault(part["ts"], Breakdown()).add(Breakdown(**part["breakdown_s"]))
    chunks = [
        {"ts": part["ts"], "events": part["events"], "breakdown_s": totals[part["ts"]].as_dict()}
        for part in executors[0]["chunks"]
    ]
    state_access = dict.fromkeys(("p50", "p99", "max"))
    if len(seconds):
        p50, p99, top = np.percentile(seconds, [50, 99, 100]) * 1e3
        state_access = {"p50": round(p50, 4), "p99": round(p99, 4), "max": round(top, 4)}
    return {"count": len(seconds), "state_access_ms": state_access, "chunks": chunks}


def session_metrics(
    summary: dict,
    run_info: dict,
    seconds: float,
    *,
    coordinator: dict | None,
    startup_s: float,
    phases_s: dict[str, float],
    cores: list[tuple[int, int]],
    recoveries: list[dict],
    checkpoints: dict | None,
    config: dict,
) -> dict[str, Any]:
    """metrics.json of a session: the engine's part (`run_metrics`) with the Coordinator's
    report, start-up and console phases, each executor's socket and cores, recoveries,
    checkpoints and the configuration."""
    return {
        **run_metrics(summary, run_info, seconds),
        "coordinator": coordinator,
        "startup_s": round(startup_s, 3),
        "phases_s": phases_s,
        "executor_cores": [
            {"socket": socket, "cpus": e["cpus"]}
            for (socket, _), e in zip(cores, run_info["executors"], strict=True)
        ],
        "recoveries": recoveries,
        "checkpoints": checkpoints,
        "config": config,
    }
