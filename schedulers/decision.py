"""MorphStream's decision model (SIGMOD'23 §4.4, Fig. 6), from measured statistics.

Before each punctuation batch is explored, the team has linked its TPG and counted
what the paper's model reads (Table 3): temporal, parametric and logical dependencies,
how skewed the operations are over the cells (the hottest cell's operations against
the average), how many dependencies cross rows (the edges between coarse units);
recent batches tell the rest: the share of rows coarse units had to merge into
cycles, the share of transactions whose operations failed, the operations redone per
failure, and the time one operation took. `decide` is a small pure function of those;
every executor computes it from the same shared numbers, so the team agrees without a
message.

The thresholds (`Thresholds`) were calibrated on this engine with bench/morphstream.py
(docs/design.md, "morphstream"): they are configuration, documented field by field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np

EXPLORE = ("bfs", "dfs", "ns")
GRANULARITY = ("fine", "coarse")
ABORT = ("eager", "lazy")
ORDERED = "ordered"
"""What `decisions` counts under ``explore`` for a batch walked in order (`ordered`): it
has no units and no abort policy, so it is not counted under the other two."""


@dataclass(frozen=True)
class Thresholds:
    """Where the decision model switches (calibrated on a 2-core host: docs/performance.md)."""

    coarse_max_cross: float = 0.05
    """Coarse units only while at most this share of operations has a parametric read
    of another row in the batch (each is an edge between units, and edges make cycles)."""
    coarse_max_merged: float = 0.05
    """... and while, when coarse units were last built, at most this share of their
    rows had to be merged into cyclic groups (merged groups run serially)."""
    ns_min_skew: float = 8.0
    """Non-structured exploration once the hottest cell has this many times the mean
    operations per cell (skew makes strata unbalanced, which costs BFS and DFS waits) ..."""
    ns_min_cost_us: float = 1.0
    """... and an operation costs at least this many microseconds (as measured by the
    team): NS's ready queue and count-downs cost a few atomics per unit, which an operation
    of a fraction of a microsecond (C = 0) does not repay, while a costlier one does
    (bench/morphstream.py's full grid)."""
    bfs_max_strata_share: float = 0.02
    """BFS (a barrier per stratum, nothing else) while strata are at most this share of
    the units; DFS (per-dependency checks, no barrier) beyond it. The strata of fine
    units are at least the hottest cell's operations."""
    eager_min_late_us: float = 1000.0
    """Eager aborts only when a failure resolved after the batch costs at least this
    much redo (measured time per operation x operations redone per failure in lazy
    batches): each eager pause costs the team about a millisecond of barriers and a
    Coordinator round trip (bench/morphstream.py: abort time / repairs) ..."""
    eager_max_failures: float = 64.0
    """... and while at most this many failures are expected in the batch (observed
    abort ratio x its transactions): every failure that wrote pauses the team, and with
    thousands of pauses per run eager is many times slower than lazy."""
    team_cost_us: float = 0.25
    """What a team adds per operation over one executor walking in order: linking,
    dealing, exploring and the barriers between them (`executors_for`). An operation of
    cost c then takes c / N + this on a team of N and c on one, so the team pays above
    2 x this on two executors; at C = 0 an operation costs about a tenth of that
    (bench/morphstream.py: construction and sync per operation)."""
    memory: float = 0.5
    """Weight of the newest batch in the running averages of measured quantities."""


@dataclass
class BatchStats:
    """What one batch's TPG showed, what was chosen, and what happened (per batch)."""

    transactions: int
    operations: int
    td: int
    """Operations with an earlier operation on their cell in the batch."""
    pd: int
    """Parametric reads of a cell written earlier in the batch."""
    ld: int
    """Operations after the first of their transaction."""
    cross: int
    """Parametric reads of a row other than the reader's (edges between coarse units)."""
    rows: int
    """Rows touched (coarse units before merging)."""
    hot: int
    """Most operations on one cell."""
    explore: str = ""
    granularity: str = ""
    abort: str = ""
    strata: int = 0
    merged: int = 0
    """Coarse: rows merged into another row's unit (cycles)."""
    failed: int = 0
    """Operations that failed in exploration."""
    redone: int = 0
    """Operations rolled back and redone."""
    repairs: int = 0
    """Times the team paused to resolve failures with the Coordinator."""
    explore_s: float = 0.0
    """Seconds the team spent in exploration kernels (summed over executors)."""

    @property
    def skew(self) -> float:
        """The hottest cell's operations over the mean per cell touched (1: uniform)."""
        cells = max(1, self.operations - self.td)
        return self.hot * cells / max(1, self.operations)


@dataclass
class History:
    """Running averages of what recent batches measured (the same on every executor)."""

    abort_ratio: float | None = None
    cost_us: float | None = None
    redo_per_failure: float | None = None
    """Operations redone per failed operation, in batches resolved lazily."""
    merged_share: float | None = None
    """Rows merged into cycles / rows, when coarse units were last built."""

    def update(self, stats: BatchStats, memory: float) -> None:
        """Fold in a finished batch."""
        if stats.transactions:
            self.abort_ratio = _average(self.abort_ratio, stats.failed / stats.transactions, memory)
        if stats.operations:
            per_op = stats.explore_s / stats.operations * 1e6
            self.cost_us = _average(self.cost_us, per_op, memory)
        if stats.abort == "lazy" and stats.failed:
            per_failure = stats.redone / stats.failed
            self.redo_per_failure = _average(self.redo_per_failure, per_failure, memory)
        if stats.granularity == "coarse" and stats.rows:
            self.merged_share = _average(self.merged_share, stats.merged / stats.rows, memory)

    def save(self, words) -> None:
        """Into ``HISTORY_WORDS`` floats of shared memory (NaN: not measured), for peers
        that stepped aside while one executor measured alone."""
        values = (getattr(self, f.name) for f in fields(self))
        words[:HISTORY_WORDS] = [math.nan if v is None else v for v in values]

    @classmethod
    def load(cls, words) -> History:
        """What `save` wrote."""
        return cls(*(None if math.isnan(v) else float(v) for v in words[:HISTORY_WORDS]))


HISTORY_WORDS = len(History.__dataclass_fields__)


def _average(old: float | None, new: float, memory: float) -> float:
    return new if old is None else memory * new + (1 - memory) * old


@dataclass(frozen=True)
class Choice:
    """What a batch runs with."""

    explore: str
    granularity: str
    abort: str


def decide(stats: BatchStats, history: History, fixed: Choice, th: Thresholds) -> Choice:
    """The three dimensions for a batch (a fixed one, from the command line, is kept)."""
    granularity = fixed.granularity
    if granularity == "auto":
        few_cross = stats.cross <= th.coarse_max_cross * stats.operations
        merged = history.merged_share
        granularity = "coarse" if few_cross and (merged or 0) <= th.coarse_max_merged else "fine"
    explore = fixed.explore
    if explore == "auto":
        edges = stats.cross if granularity == "coarse" else stats.td + stats.pd
        units = stats.rows if granularity == "coarse" else stats.operations
        strata = 1 if granularity == "coarse" and stats.cross == 0 else stats.hot
        if edges == 0 or strata <= th.bfs_max_strata_share * units:
            explore = "bfs"
        elif stats.skew >= th.ns_min_skew and _costly(history, th):
            explore = "ns"
        else:
            explore = "dfs"
    abort = fixed.abort
    if abort == "auto":
        late = (history.cost_us or 0.0) * (history.redo_per_failure or 0.0)
        failures = (history.abort_ratio or 0.0) * stats.transactions
        costly = late >= th.eager_min_late_us
        abort = "eager" if costly and failures <= th.eager_max_failures else "lazy"
    return Choice(explore, granularity, abort)


def executors_for(history: History, th: Thresholds, parties: int) -> int:
    """How many of the team's ``parties`` executors work on the next chunk: all of them
    over a graph, or one walking it in order (serial's kernel, no graph) while the
    operations measured so far cost less than the team would add to them
    (`Thresholds.team_cost_us`); until anything is measured, all."""
    cost = history.cost_us
    if cost is None or parties == 1:
        return parties
    return parties if cost / parties + th.team_cost_us < cost else 1


def _costly(history: History, th: Thresholds) -> bool:
    """Whether operations cost enough for NS's queue (not measured yet: assumed so)."""
    return history.cost_us is None or history.cost_us >= th.ns_min_cost_us


class WalkedBatches(NamedTuple):
    """Batches walked in order, as columns: a chunk's walk is logged at once, without an
    object per batch (at cheap operations a batch's walk takes a fraction of a
    millisecond). Their other statistics are those of a walk: no graph, no units."""

    transactions: np.ndarray
    operations: np.ndarray
    failed: np.ndarray
    explore_s: np.ndarray


def no_walk() -> BatchStats:
    """The statistics of a walk in order before any batch is counted: no graph, no units
    (what every walked batch shares but its counts)."""
    return BatchStats(0, 0, 0, 0, 0, 0, 0, 0, explore=ORDERED)


_WALKED = no_walk()
_FIELDS = tuple(BatchStats.__dataclass_fields__)


@dataclass
class DecisionLog:
    """Every batch's statistics and choices, for metrics.json (contract §5 `decisions`)."""

    limit: int = 10_000
    """Batches whose statistics are kept (the counts cover all)."""
    counts: dict[str, dict[str, int]] = field(
        default_factory=lambda: {
            "explore": dict.fromkeys((*EXPLORE, ORDERED), 0),
            "granularity": dict.fromkeys(GRANULARITY, 0),
            "abort": dict.fromkeys(ABORT, 0),
        }
    )
    entries: list[BatchStats | WalkedBatches] = field(default_factory=list)
    """The kept statistics, in batch order."""
    kept: int = 0

    def add(self, stats: BatchStats) -> None:
        """Count a finished batch's choices and keep its statistics."""
        for dimension in ("explore",) if stats.explore == ORDERED else self.counts:
            self.counts[dimension][getattr(stats, dimension)] += 1
        if self.kept < self.limit:
            self.entries.append(stats)
            self.kept += 1

    def add_walked(self, walked: WalkedBatches) -> None:
        """Count batches walked in order and keep their statistics."""
        n = len(walked.transactions)
        self.counts["explore"][ORDERED] += n
        room = min(n, self.limit - self.kept)
        if room > 0:
            self.entries.append(WalkedBatches(*(column[:room] for column in walked)))
            self.kept += room

    def report(self) -> dict:
        """`decisions` (counts per dimension) and per-batch statistics, as columns."""
        columns: dict[str, list] = {name: [] for name in _FIELDS}
        for entry in self.entries:
            if isinstance(entry, BatchStats):
                for name in _FIELDS:
                    columns[name].append(getattr(entry, name))
                continue
            n = len(entry.transactions)
            for name in _FIELDS:
                if name in WalkedBatches._fields:
                    columns[name] += getattr(entry, name).tolist()
                else:
                    columns[name] += [getattr(_WALKED, name)] * n
        return {"decisions": self.counts, "decision_batches": columns}
