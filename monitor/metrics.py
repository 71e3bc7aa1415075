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

    def seconds(self) -> tuple[float, ...]:
        """Seconds by activity, in the order of `ACTIVITIES`."""
        return tuple(getattr(self, name) for name in ACTIVITIES)


ACTIVITIES = tuple(f.name for f in fields(Breakdown))
"""The activities of a `Breakdown`, in order."""
LIVE_EXECUTOR = (*ACTIVITIES, "operations")
"""What each executor publishes in shared memory after every chunk (the columns of its
row), for the run's live metrics to read without a call."""


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
        self.sum = 0.0
        """Seconds of every latency counted: a Prometheus histogram's ``_sum``."""

    def add(self, seconds: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count latencies ``seconds``, each ``counts`` times (default: once; see
        `equal_runs`)."""
        if counts is None:
            seconds, counts = equal_runs(seconds)
        if not len(seconds):
            return
        self.sum += float(np.dot(seconds, counts))
        bins = np.searchsorted(self.EDGES, seconds)
        self.counts += np.bincount(bins, weights=counts, minlength=len(self.counts)).astype(
            np.int64
        )

    def cumulative(self, bounds: tuple[float, ...]) -> list[int]:
        """Latencies at most each of ``bounds`` (seconds, ascending), to the precision of
        the bins: a Prometheus histogram's buckets."""
        below = np.cumsum(self.counts)
        ends = np.searchsorted(self.EDGES, np.asarray(bounds) * (1 + 1e-9), side="right")
        return [int(below[i - 1]) if i else 0 for i in ends]

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile in milliseconds (bin upper edge), None without events."""
        bins = np.flatnonzero(self.counts)
        return sparse_percentile_ms(bins, self.counts[bins], q)


class SizeHistogram:
    """Sizes (events per chunk) counted as they come, in log-spaced bins: memory bounded
    however long the run, a scrape's buckets read without sorting anything. Every power
    of 2 is an edge (exact buckets there), 64 bins between two: the median to ~1%."""

    EDGES = np.unique(np.round(2.0 ** (np.arange(31 * 64 + 1) / 64)).astype(np.int64))

    def __init__(self) -> None:
        self.counts = np.zeros(len(self.EDGES) + 1, np.int64)
        self.sum = 0
        self.count = 0
        self.max = 0

    def add(self, size: int) -> None:
        """Count one ``size``."""
        self.counts[np.searchsorted(self.EDGES, size)] += 1
        self.sum += size
        self.count += 1
        self.max = max(self.max, size)

    def buckets(self, bounds: tuple[int, ...]) -> tuple[list[int], int]:
        """Sizes at most each of ``bounds`` (ascending; exact at powers of 2), and all of
        them: a Prometheus histogram's buckets and count, from one reading of the counts
        (a scrape reads while sizes are counted on another thread)."""
        below = np.cumsum(self.counts)
        ends = np.searchsorted(self.EDGES, np.asarray(bounds), side="right")
        return [int(below[i - 1]) if i else 0 for i in ends], int(below[-1])

    def median(self) -> int:
        """The median size (its bin's upper edge, at most the largest); 0 without any."""
        if not self.count:
            return 0
        i = int(np.searchsorted(np.cumsum(self.counts), (self.count + 1) // 2))
        return min(int(self.EDGES[min(i, len(self.EDGES) - 1)]), self.max)


class Timeline:
    """Events out and their latency over the run, in bins whose width follows the run's
    length: they start at `FIRST_BIN_S` and double (neighbours merged) whenever the run
    outgrows `MAX_BINS` of them, so a run of a fraction of a second and one of hours are
    both drawn in between half of `MAX_BINS` and `MAX_BINS` bins. A bin keeps its latencies
    as the histogram bins they fell in and how many (few: latencies of one moment are
    alike), so merged bins have exact percentiles and memory stays bounded."""

    FIRST_BIN_S = 0.01
    MAX_BINS = 100

    def __init__(self, start: float) -> None:
        self.start = start
        self.bin_s = self.FIRST_BIN_S
        self._index = 0
        self._now = LatencyHistogram()
        self._bins: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """Closed bins: index -> (latency histogram bins, counts)."""

    def add(self, now: float, latencies: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Count events that came out at ``now`` (`time.time`) with ``latencies`` (s),
        each ``counts`` times (default: once)."""
        index = self._bin(now)
        if index != self._index:
            self._close()
            while index >= self.MAX_BINS:
                self._coarsen()
                index = self._bin(now)
            self._index = index
        self._now.add(latencies, counts)

    def _bin(self, now: float) -> int:
        return max(0, int((now - self.start) / self.bin_s))

    def _close(self) -> None:
        bins = np.flatnonzero(self._now.counts)
        if len(bins):
            self._merge(self._bins, self._index, bins, self._now.counts[bins])
            self._now.counts[bins] = 0

    def _coarsen(self) -> None:
        self.bin_s *= 2
        merged: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for index, (bins, counts) in sorted(self._bins.items()):
            self._merge(merged, index // 2, bins, counts)
        self._bins = merged

    @staticmethod
    def _merge(into: dict, index: int, bins: np.ndarray, counts: np.ndarray) -> None:
        if index in into:
            both = np.concatenate((into[index][0], bins))
            bins, inverse = np.unique(both, return_inverse=True)
            counts = np.bincount(inverse, np.concatenate((into[index][1], counts))).astype(np.int64)
        into[index] = (bins, counts)

    def as_dict(self) -> dict[str, Any]:
        """The series so far: the start of each bin in which events came out (seconds since
        ``start``), its events and latency percentiles, and the bins' width ``bin_s``."""
        self._close()
        series: dict[str, Any] = {
            "second": [],
            "events": [],
            "latency_p50_ms": [],
            "latency_p99_ms": [],
        }
        for index, (bins, counts) in sorted(self._bins.items()):
            series["second"].append(round(index * self.bin_s, 6))
            series["events"].append(int(counts.sum()))
            series["latency_p50_ms"].append(sparse_percentile_ms(bins, counts, 50))
            series["latency_p99_ms"].append(sparse_percentile_ms(bins, counts, 99))
        return {**series, "bin_s": self.bin_s}


def sparse_percentile_ms(bins: np.ndarray, counts: np.ndarray, q: float) -> float | None:
    """The q-th percentile in milliseconds of latencies counted ``counts`` times in the
    `LatencyHistogram` bins ``bins`` (ascending); None without any."""
    cumulative = np.cumsum(counts)
    if not len(cumulative) or cumulative[-1] == 0:
        return None
    rank = max(int(np.ceil(q / 100 * cumulative[-1])), 1)
    i = int(bins[np.searchsorted(cumulative, rank)])
    edges = LatencyHistogram.EDGES
    return round(float(edges[min(i, len(edges) - 1)]) * 1e3, 4)


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
    table_rows: dict[str, int],
    config: dict,
) -> dict[str, Any]:
    """metrics.json of a session: the engine's part (`run_metrics`) with the Coordinator's
    report, start-up and console phases, each executor's socket and cores, recoveries,
    checkpoints, the rows of every table at the end (of a table of natural keys, the keys
    that exist) and the configuration."""
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
        "table_rows": table_rows,
        "config": config,
    }
