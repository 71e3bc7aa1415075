"""morphstream: a task precedence graph per punctuation batch, explored adaptively
(MorphStream, SIGMOD'23 §3-5).

Per batch, the whole team:

1. *constructs* the TPG in parallel: each executor links the operations of the rows
   it owns (temporal and parametric dependencies through proxy reads, `_links`),
   fates its share of the transactions (logical dependencies) and counts what the
   decision model reads;
2. *decides* the three dimensions (`decision`: explore bfs|dfs|ns, granularity
   fine|coarse, abort eager|lazy), each fixed by an option or chosen per batch;
3. builds the units (coarse: rows, with cycles merged), strata or dependency counts
   the chosen exploration needs (`_tpg`);
4. *explores* (`_explore`), resolving failures through the Coordinator as soon as
   they happen (eager) or once the batch is explored (lazy) (`aborts`).

When operations cost less than linking and exploring them costs the team (`decision.
executors_for`, from the time per operation measured so far), `auto` walks a whole chunk
in order instead: executor 0 runs its batches one by one with serial's kernel, the others
only pre- and post-process their shares; no graph is built. On threads executor 0 gets
every chunk whole (`whole_chunks`) and walks it from the statements, as serial does, and
the next chunks go to it alone (`alone_next`; the first, small, always:
`first_walk_events`): its peers step aside, idle in their calls'
queues, so the feeders get the other core; it keeps measuring, and the history it folds
alone is handed to them in shared memory when the team is called back. Exploring, the
team links and explores the operations executor 0 built. The time per operation is
measured there too, so that costlier operations bring the graph back.

The team's placement decides who may run a unit: its row's pool's executors.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.monitor.metrics import Breakdown
from txstream.schedulers import _explore as ex
from txstream.schedulers._kernels import WAITED_SLOTS, run_transactions
from txstream.schedulers._tpg import (
    UNIT_ARRAYS,
    Units,
    construct_batch,
    count_pending,
    cycle_scratch,
    fine_levels,
    merge_cycles,
    work_strata,
)
from txstream.schedulers.decision import (
    HISTORY_WORDS,
    BatchStats,
    Choice,
    DecisionLog,
    History,
    Thresholds,
    WalkedBatches,
    decide,
    executors_for,
    no_walk,
)
from txstream.schedulers.speculative import SpeculativeScheduler
from txstream.schedulers.team._links import CROSS, HEADS, HOT, LINK_STATS, PD, TD
from txstream.schedulers.team._versions import Scratch, scratch
from txstream.schedulers.team.aborts import EAGER, LAZY, Speculation
from txstream.schedulers.team.member import Member
from txstream.state._kernels import SET_FULL, SET_FULL_MESSAGE, compile_for, undo_log
from txstream.state.chunk import ChunkArrays, ChunkDims, RunDims
from txstream.state.operations import OperationShare
from txstream.state.segments import ArraySpec
from txstream.state.sync import PAUSE, STRIDE, add_to
from txstream.state.tables import SharedState
from txstream.topologies.api import Topology

if TYPE_CHECKING:
    from txstream.config import RunConfig
    from txstream.schedulers.statements import Statements

LD, STRATA, MERGED, CYCLIC, EXPLORE_NS, ABORTED, WALKED, WALKED_OPS = range(
    LINK_STATS, LINK_STATS + 8
)
"""Per executor, after the `link_batch` statistics: operations after the first of
their transaction, strata, merged rows, cyclic groups, the ns it spent exploring the
previous batch (or walking chunks in order since), and the transactions that aborted,
the transactions and the operations of that walk."""
STATS = WALKED_OPS + 1
FIRST_WALK_EVENTS = 256
"""Events of the first chunk, walked by executor 0 alone with ``--explore auto`` on threads
(`first_walk_events`): enough to time an operation, few enough that at costly operations
(10 us, three per event) the walk costs the team a few milliseconds more than a graph."""


class ChunkView(NamedTuple):
    """What every batch of a chunk passes its kernels, built once per chunk (`prepare`):
    the named tuples of the chunk segment's arrays, this executor's seat, its scratch."""

    spec: Speculation
    units: Units
    tpg: ex.Tpg
    seat: ex.PoolSeat
    scratch: Scratch
    dealt: np.ndarray


class MorphStreamScheduler(SpeculativeScheduler):
    """TPG per batch, adaptive exploration, granularity and abort handling."""

    name = "morphstream"
    thresholds = Thresholds()

    @classmethod
    def coordinator_policies(cls, config: RunConfig) -> tuple[str, ...]:
        """The abort policies it may choose."""
        return {"eager": (EAGER,), "lazy": (LAZY,)}.get(config.abort, (EAGER, LAZY))

    @classmethod
    def chunk_arrays(cls, config: RunConfig, dims: ChunkDims) -> list[ArraySpec]:
        """Links, versions, fates; units; a ready queue per pool; the operations each
        executor lists by stratum."""
        n = dims.operations
        return [
            *super().chunk_arrays(config, dims),
            *[ArraySpec(name, "int64", (n + (name == "merged_ptr"),)) for name in UNIT_ARRAYS],
            ArraySpec("ready", "int64", (dims.pools * n,)),
            ArraySpec("listed", "int64", (dims.parties * n,)),
        ]

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """Position words (redo, strata), exploration words, the words of the lists
        executors take entries from, statistics per executor."""
        return [
            *super().run_arrays(config, dims),
            ArraySpec("words", "int64", (ex.word_count(dims.pools),)),
            ArraySpec("claims", "int64", (ex.claim_words(dims.parties),)),
            ArraySpec("stats", "int64", (dims.parties, STATS)),
            ArraySpec("history", "float64", (1 + HISTORY_WORDS,)),
        ]

    def __init__(self, config: RunConfig, topology: Topology, state: SharedState, team: Member):
        super().__init__(config, topology, state, team)
        self._fixed = Choice(config.explore, config.granularity, config.abort)
        self._history = History()
        self._log = DecisionLog()
        self._explore_ns = 0
        self._last: BatchStats | None = None
        self._level_ptr = np.zeros(2, np.int64)
        self._neighbours = np.array(team.seat.socket_ranks, np.int64)
        self._cycles = cycle_scratch(0, 0)
        self._own = np.zeros(0, np.int64)
        """The operations this executor linked in the current batch, in ts order."""
        self._view: ChunkView | None = None
        self._ordered = False
        """This chunk is walked in order by executor 0 (module docstring)."""
        self._alone_seen = 0.0
        """Chunks executor 0 ran alone, as of the history this executor holds."""
        self._walked = no_walk()
        """What executor 0 walked in order since the last chunk's decision."""
        self._walked_batches: list[tuple[int, int, int, int]] = []
        """The chunk's batches executor 0 walked: (begin, end, ns, aborted transactions),
        counted at its end."""

    @classmethod
    def whole_chunks(cls, config: RunConfig) -> bool:
        """With ``--explore auto``: a chunk walked in order then runs from its statements
        on executor 0, as serial's (`Scheduler.whole_chunks`); exploring, the team links
        and explores the chunk's operations wherever they were built."""
        return config.explore == "auto"

    @classmethod
    def first_walk_events(cls, config: RunConfig) -> int:
        """With ``--explore auto``: until an operation is timed, the team cannot tell
        whether a graph pays, and a first graph costs several times the walk of its chunk
        at cheap operations; so executor 0 walks a small first chunk alone."""
        return FIRST_WALK_EVENTS if config.explore == "auto" else 0

    def takes_statements(self, statements: Statements, whole: bool) -> bool:
        """Whether the chunk is walked in order (the whole team decides, `_walk_in_order`);
        if so, executor 0 runs it from the statements when it holds them all."""
        self._ordered = self._walk_in_order() or self.team.alone
        # the warm-up's empty chunk makes the walk's kernel too, which `warm_up` loads
        warming = statements.events.n == 0 and self._fixed.explore == "auto"
        taken = self.from_statements(statements, (self._ordered or warming) and whole)
        return taken and self._ordered

    def alone_next(self) -> bool:
        """Executor 0, after a chunk: whether the decision model gives the next one to one
        executor, from the history with this chunk's measurements in, as far as executor 0
        knows them (the team folds them at the next chunk's decision: `_walk_in_order`),
        so that the ProgressController's next dispatch already follows this chunk."""
        if self.team.rank != 0 or self._fixed.explore != "auto":
            return False
        history = replace(self._history)
        self._fold(history, self._explore_ns, self.team.parties)
        return executors_for(history, self.thresholds, self.team.parties) == 1

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """A chunk not walked in order: dealt to the executors that link it
        (`SpeculativeScheduler.prepare`), and what its batches pass their kernels."""
        if not self._ordered:
            super().prepare(chunk, ops, breakdown)
            self._view = self._chunk_view(chunk)

    def publish(self) -> None:
        """What this executor measured since the last decision (`_walk_in_order`)."""
        if self._fixed.explore == "auto" and self.run:  # (mapped with the first chunk)
            walked, row = self._walked, self.run["stats"][self.team.rank]
            row[EXPLORE_NS], row[ABORTED] = self._explore_ns, walked.failed
            row[WALKED], row[WALKED_OPS] = walked.transactions, walked.operations

    def _walk_in_order(self) -> bool:
        """Fold what the team measured since the last decision (the previous batch
        explored, or the chunks walked in order; `publish`, read after the barrier that
        follows it) into the history, on every executor alike, and decide whether this
        chunk is walked in order. Alone, executor 0 folds its own and saves the history
        for its peers, which take it when they are called back."""
        if self._fixed.explore != "auto":
            return False
        team, walked, shared = self.team, self._walked, self.run["history"]
        if team.alone:
            totals = self.run["stats"][team.rank]
        else:
            totals = self.run["stats"].sum(axis=0)  # written again only after the next barrier
            if shared[0] != self._alone_seen:  # executor 0 ran chunks alone since
                self._history, self._alone_seen = History.load(shared[1:]), float(shared[0])
                self._last = None
        walked.failed, walked.transactions = int(totals[ABORTED]), int(totals[WALKED])
        walked.operations = int(totals[WALKED_OPS])
        self._fold(self._history, float(totals[EXPLORE_NS]), team.parties if team.alone else 1)
        self._last, self._explore_ns = None, 0
        self._walked = no_walk()
        if team.alone:
            shared[0] += 1
            self._alone_seen = float(shared[0])
            self._history.save(shared[1:])
        return executors_for(self._history, self.thresholds, team.parties) == 1

    def _fold(self, history: History, explore_ns: float, parties: int) -> None:
        """Fold what was measured since the last decision into ``history``: the batch last
        explored (``explore_ns`` x ``parties``: the team's sum, where only one executor's
        share of it is known) or the chunks executor 0 walked in order (``explore_ns``)."""
        for last, scale in ((self._last, parties), (self._walked, 1)):
            if last is not None and last.transactions:
                last.explore_s = explore_ns * scale / 1e9
                history.update(last, self.thresholds.memory)

    def batches_in_step(self) -> bool:
        """A chunk walked in order needs no waits between its batches."""
        return not self._ordered

    def finish(
        self, chunk: ChunkArrays, ops: OperationShare, first: int, end: int, breakdown: Breakdown
    ) -> None:
        """A chunk walked in order has its results already: executor 0 counts its batches
        (`_count_walk`); `SpeculativeScheduler.finish` otherwise."""
        if not self._ordered:
            super().finish(chunk, ops, first, end, breakdown)
        elif self.team.rank == 0:
            self._count_walk(ops)

    def _chunk_view(self, chunk: ChunkArrays) -> ChunkView:
        """The chunk's arrays, seat and scratch as `execute` and `warm_up` pass them."""
        spec = Speculation.of(chunk)
        units = Units(*(chunk.arrays[name] for name in UNIT_ARRAYS))
        share = chunk.operations()
        return ChunkView(
            spec,
            units,
            ex.Tpg(spec.ops, spec.links, spec.versions, spec.fates, units),
            self._seat(chunk),
            scratch(share.max_reads, share.max_txn_ops),
            chunk.arrays["dealt"],
        )

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """Construct, decide, explore and resolve the batch of transactions begin..end-1;
        or, in a chunk walked in order, executor 0 runs them one by one."""
        if self._ordered:
            if self.team.rank == 0:
                self._walk(chunk, ops, begin, end, breakdown)
            return
        view = self._view
        first, stop = int(ops.txn_ptr[begin]), int(ops.txn_ptr[end])
        redone = self._repairs.redone
        stats = self._construct(view, begin, end, breakdown)
        choice = decide(stats, self._history, self._fixed, self.thresholds)
        stats.explore, stats.granularity, stats.abort = (
            choice.explore,
            choice.granularity,
            choice.abort,
        )
        batch = ex.Exploration(first, stop, choice.granularity == "fine", choice.abort == EAGER)
        strata = self._units(view.tpg, batch, choice.explore, view.seat, stats, breakdown)
        self._explore_ns = self._explore(
            *(choice, batch, view.tpg, view.seat, strata, view.spec, (begin, end)),
            *(view.scratch, stats, breakdown),
        )
        stats.redone = self._repairs.redone - redone
        if self.team.rank == 0 and end > begin:  # (the warm-up runs an empty batch)
            self._log.add(stats)

    def _walk(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """Executor 0: transactions begin..end-1 in ts order with serial's kernel (from
        the statements, if it takes them), timed; counted once the chunk is walked
        (`_count_walk`), so that a batch costs what serial's does."""
        if self.direct is not None:
            spent, aborted = self.run_direct(chunk, begin, end, breakdown)
        else:
            spent, aborted = self.run_in_order(chunk, ops, begin, end, breakdown)
        self._walked_batches.append((begin, end, spent, aborted))

    def _count_walk(self, ops: OperationShare) -> None:
        """Executor 0, a chunk walked: its batches' transactions, operations and failures,
        counted and logged as an exploration's are (the kernels counted the failures)."""
        begins, ends, spent, failed = np.array(self._walked_batches, np.int64).reshape(-1, 4).T
        self._walked_batches.clear()
        if self.direct is not None:
            operations = self.direct.statements.operations_between(begins, ends)
        else:
            operations = ops.txn_ptr[ends] - ops.txn_ptr[begins]
        sizes = ends - begins
        walked = self._walked
        walked.transactions += int(sizes.sum())
        walked.operations += int(operations.sum())
        walked.failed += int(failed.sum())
        self._explore_ns += int(spent.sum())
        ran = sizes > 0
        columns = (sizes, operations, failed, spent / 1e9)
        self._log.add_walked(WalkedBatches(*(column[ran] for column in columns)))

    def _seat(self, chunk: ChunkArrays) -> ex.PoolSeat:
        seat, team = self.team.seat, self.team
        return ex.PoolSeat(
            team.rank,
            seat.pool,
            seat.pool_ranks.index(team.rank),
            len(seat.pool_ranks),
            team.parties,
            seat.pools,
            self._spans,
            self.run["words"],
            chunk.ready,
            chunk.dims.operations,
            chunk.arrays["listed"],
            self.run["claims"],
            self._neighbours,
            team.sync,
            team.timeout_ns,
        )

    @staticmethod
    def _listed(seat: ex.PoolSeat) -> np.ndarray:
        """This executor's region of the listed operations."""
        return seat.listed[seat.rank * seat.capacity : (seat.rank + 1) * seat.capacity]

    def _construct(self, view: ChunkView, begin: int, end: int, breakdown: Breakdown) -> BatchStats:
        """The whole team: link the batch (what was dealt to this executor: `prepare`),
        fate the transactions, count. Returns the batch's statistics (the same on every
        executor); folds the previous batch's measured exploration time into the
        history."""
        team, ops, spec = self.team, view.spec.ops, view.spec
        rank = team.rank
        first, stop = int(ops.txn_ptr[begin]), int(ops.txn_ptr[end])
        t0 = begin + (end - begin) * rank // team.parties
        t1 = begin + (end - begin) * (rank + 1) // team.parties
        table = self.run["stats"]
        row = table[rank]
        with breakdown.timing("construct"):
            row[:] = 0
            row[EXPLORE_NS] = self._explore_ns
            listed = int(self._part.counts[1])
            row[LD] = construct_batch(
                *(rank, first, stop, t0, t1, ops, self._part, spec.links, view.dealt),
                *(self.state.values, spec.fates, spec.versions.done, view.units),
                row[:LINK_STATS],
            )
            self._own = self._part.mine[listed : self._part.counts[1]]
            self.run["redo_position"][STRIDE * rank] = first
            if rank == 0:
                self.run["words"][:] = 0
                self.run["claims"][:] = 0
        team.barrier(breakdown)
        totals = table.sum(axis=0)
        if self._last is not None and self._last.transactions:  # the previous batch, measured
            self._last.explore_s = float(totals[EXPLORE_NS]) / 1e9
            self._history.update(self._last, self.thresholds.memory)
        self._last = BatchStats(
            transactions=end - begin,
            operations=stop - first,
            td=int(totals[TD]),
            pd=int(totals[PD]),
            ld=int(totals[LD]),
            cross=int(totals[CROSS]),
            rows=int(totals[HEADS]),
            hot=int(table[:, HOT].max()),
        )
        return self._last

    def _units(
        self,
        tpg: ex.Tpg,
        batch: ex.Exploration,
        explore: str,
        seat: ex.PoolSeat,
        stats: BatchStats,
        breakdown: Breakdown,
    ) -> ex.Strata | None:
        """The units' strata (structured exploration) or dependency counts and ready
        queues (non-structured: returns None)."""
        team, ops, links, units = self.team, tpg.ops, tpg.links, tpg.units
        rank, table = team.rank, self.run["stats"]
        strata = 1
        if batch.fine and explore != "ns":
            waited = np.zeros(1, np.int64)
            with breakdown.timing("construct"):
                why, mine = fine_levels(
                    rank,
                    batch.first,
                    batch.end,
                    self._own,
                    ops,
                    links,
                    units,
                    self.run["redo_position"],
                    team.sync,
                    team.timeout_ns,
                    waited,
                )
                table[rank, STRATA] = mine
            breakdown.construct -= waited[0] / 1e9
            breakdown.sync += waited[0] / 1e9
            team.check(why)
            team.barrier(breakdown)
            strata = int(table[:, STRATA].max())
        elif not batch.fine and stats.cross:
            if rank == 0:
                with breakdown.timing("construct"):
                    self._grow_cycles(batch.end - batch.first, len(ops.dep_cell))
                    table[0, MERGED : STRATA + 1] = 0
                    merged, cyclic, strata0 = merge_cycles(
                        batch.first, batch.end, ops, links, units, self._cycles
                    )
                    table[0, MERGED], table[0, CYCLIC], table[0, STRATA] = merged, cyclic, strata0
            team.barrier(breakdown)
            strata, stats.merged = int(table[0, STRATA]), int(table[0, MERGED])
        stats.strata = strata
        if explore == "ns":
            with breakdown.timing("explore"):
                counted = np.zeros(team.seat.pools, np.int64)
                count_pending(
                    rank,
                    batch.first,
                    batch.end,
                    batch.fine,
                    ops,
                    links,
                    units,
                    self._spans,
                    team.seat.pools,
                    counted,
                )
                for pool in np.flatnonzero(counted):
                    add_to(seat.words, ex.total_word(int(pool)), int(counted[pool]))
                ex.queue_ready(batch.first, batch.end, tpg, seat, batch.fine, rank)
            team.barrier(breakdown)
            return None
        with breakdown.timing("explore"):
            if len(self._level_ptr) < strata + 1:
                self._level_ptr = np.zeros(2 * strata + 1, np.int64)
            listed = self._listed(seat)
            n_merged = int(table[0, CYCLIC]) if not batch.fine and stats.cross else 0
            work_strata(
                batch.first,
                batch.end,
                batch.fine,
                self._own,
                team.seat.alone,
                seat,
                strata,
                ops,
                links,
                units,
                n_merged,
                self._level_ptr,
                listed,
            )
        return ex.Strata(strata, self._level_ptr, listed)

    def _grow_cycles(self, operations: int, reads: int) -> None:
        if len(self._cycles.node) < operations or len(self._cycles.edges) < reads:
            self._cycles = cycle_scratch(2 * operations, 2 * reads)

    def _explore(
        self,
        choice: Choice,
        batch: ex.Exploration,
        tpg: ex.Tpg,
        seat: ex.PoolSeat,
        strata: ex.Strata | None,
        spec: Speculation,
        txns: tuple[int, int],
        s: np.ndarray,
        stats: BatchStats,
        breakdown: Breakdown,
    ) -> int:
        """Explore the batch, resolving failures eagerly (at safe points) or lazily (once
        explored); every failure is resolved when it returns. Returns the ns this
        executor spent running operations (exploring, not waiting nor repairing)."""
        team = self.team
        cursor = np.array([-1 if strata is None else 0, 0, 0, 0, 0, 0], np.int64)
        words = seat.words

        def paused() -> None:
            if team.rank == 0:
                team.sync[STRIDE * PAUSE] = 0
            cursor[2] = words[STRIDE * ex.FRESH]

        policy = EAGER if batch.eager else LAZY
        state = self.state.arrays
        working = 0
        while True:
            s.waited[0] = 0
            started = time.perf_counter_ns()
            if strata is None:
                why = ex.explore_ns(batch, tpg, state, self.udf, s, seat, cursor)
            elif choice.explore == "bfs":
                why = ex.explore_bfs(batch, tpg, state, self.udf, s, seat, strata, cursor)
            else:
                why = ex.explore_dfs(batch, tpg, state, self.udf, s, seat, strata, cursor)
            spent = time.perf_counter_ns() - started
            working += spent - int(s.waited[0])
            breakdown.useful += (spent - int(s.waited[0])) / 1e9
            breakdown.sync += s.waited[0] / 1e9
            if why == SET_FULL:
                raise RuntimeFailure(SET_FULL_MESSAGE)
            if why == ex.REPAIR:
                self._repair(policy, spec, txns, s, stats, breakdown, paused)
                continue
            if why != ex.ALL_DONE:
                team.check(why)
            break
        stats.failed = int(words[STRIDE * ex.FRESH])
        if stats.failed > cursor[2]:
            self._repair(policy, spec, txns, s, stats, breakdown, paused)
        return working

    def _repair(self, policy, spec, txns, s, stats, breakdown, paused) -> None:
        stats.repairs += 1
        self._repairs.run(policy, spec, txns[0], txns[1], s, breakdown, paused)

    def warm_up(self, chunk: ChunkArrays) -> None:
        """Every exploration and unit kernel, whichever the empty chunk's batch chose,
        and the repair's (`Scheduler.warm_up`): `auto` may choose another one per batch.
        The arguments are built as `execute` builds them."""
        super().warm_up(chunk)
        team, view = self.team, self._chunk_view(chunk)
        ops, links, state, udf = view.spec.ops, view.spec.links, self.state.arrays, self.udf
        units, tpg, s, seat = view.units, view.tpg, view.scratch, view.seat
        batch = ex.Exploration(0, 0, True, True)
        strata = ex.Strata(1, self._level_ptr, self._listed(seat))
        cursor = np.zeros(6, np.int64)
        for explore in (ex.explore_bfs, ex.explore_dfs):
            compile_for(explore, batch, tpg, state, udf, s, seat, strata, cursor)
        compile_for(ex.explore_ns, batch, tpg, state, udf, s, seat, cursor)
        compile_for(ex.queue_ready, 0, 0, tpg, seat, True, team.rank)
        compile_for(merge_cycles, 0, 0, ops, links, units, self._cycles)
        compile_for(
            fine_levels,
            *(team.rank, 0, 0, self._own, ops, links, units, self.run["redo_position"]),
            *(team.sync, team.timeout_ns, np.zeros(1, np.int64)),
        )
        compile_for(
            count_pending,
            *(team.rank, 0, 0, True, ops, links, units, self._spans, team.seat.pools),
            np.zeros(team.seat.pools, np.int64),
        )
        compile_for(
            work_strata,
            *(0, 0, True, self._own, team.seat.alone, seat, 1, ops, links, units, 0),
            *(self._level_ptr, self._listed(seat)),
        )
        compile_for(add_to, seat.words, 0, 0)
        if self.direct is not None:  # a walk from the statements (`takes_statements`)
            direct, waited = self.direct, np.zeros(WAITED_SLOTS, np.int64)
            compile_for(
                direct.kernel,
                *(0, 0, *direct.tables, state, udf, direct.scratch, chunk.outcomes, waited),
            )
            self.direct = None
        share = chunk.operations()
        compile_for(
            run_transactions,
            *(0, 0, share.arrays, state, udf, np.zeros(1, np.int64)),
            *(undo_log(1), chunk.outcomes, np.zeros(WAITED_SLOTS, np.int64)),
        )

    def decisions(self) -> dict[str, dict[str, int]]:
        """The batches by explore, granularity and abort chosen so far."""
        return self._log.counts

    def report(self) -> dict:
        """`decisions` (contract §5), per-batch statistics, operations redone."""
        if self._last is not None and self._log.entries and self._log.entries[-1] is self._last:
            self._last.explore_s = self._explore_ns * self.team.parties / 1e9  # estimated
        return {**self._log.report(), **super().report()}
