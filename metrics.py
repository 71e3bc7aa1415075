"""Run metrics: the papers' time breakdown and per-event latency percentiles."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields

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


class LatencyHistogram:
    """Per-event latencies in log-spaced bins: bounded memory, ~1% precision."""

    EDGES = np.logspace(-6, 4, 2001)  # 1 us .. 10^4 s

    def __init__(self) -> None:
        self.counts = np.zeros(len(self.EDGES) + 1, np.int64)

    def add(self, seconds: np.ndarray) -> None:
        """Count a batch of latencies."""
        self.counts += np.bincount(np.searchsorted(self.EDGES, seconds), minlength=len(self.counts))

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile in milliseconds (bin upper edge), None without events."""
        total = self.counts.sum()
        if total == 0:
            return None
        rank = int(np.ceil(q / 100 * total))
        i = int(np.searchsorted(np.cumsum(self.counts), max(rank, 1)))
        return round(float(self.EDGES[min(i, len(self.EDGES) - 1)]) * 1e3, 4)
