"""tstream: operation chains evaluated in parallel by the team (TStream, ICDE'20).

``prepare`` links the chunk into operation chains (one per state cell, ts order; the
team links in parallel, each executor the rows it owns: `txstream.schedulers.team._links`)
and gives the chains of every row one owner: the executor the row hashes to
(shared-nothing), or the executor that claims the row from its pool, busiest rows
first (shared-per-socket: a pool per socket; shared-everything: one pool).
``execute`` explores the owned operations of a batch in ts order; aborts are lazy,
resolved by the run's Coordinator (`txstream.schedulers.team.aborts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._chains import claim_rows, explore_chains, fill_owners, pool_rows
from txstream.schedulers.speculative import SpeculativeScheduler
from txstream.schedulers.team._links import LINK_STATS, link_batch, txn_fates
from txstream.schedulers.team._versions import scratch
from txstream.schedulers.team.aborts import LAZY, Speculation
from txstream.schedulers.team.member import Member
from txstream.state._kernels import SET_FULL, SET_FULL_MESSAGE
from txstream.state.chunk import ChunkArrays, ChunkDims, RunDims
from txstream.state.operations import OperationShare
from txstream.state.segments import ArraySpec
from txstream.state.sync import STRIDE
from txstream.state.tables import SharedState
from txstream.topologies.api import Topology

if TYPE_CHECKING:
    from txstream.config import RunConfig

UNCAPPED = np.iinfo(np.int64).max


class TStreamScheduler(SpeculativeScheduler):
    """Parallel evaluation of operation chains, lazy aborts (module docstring)."""

    name = "tstream"

    @classmethod
    def coordinator_policies(cls, config: RunConfig) -> tuple[str, ...]:
        """Lazy aborts."""
        return (LAZY,)

    @classmethod
    def chunk_arrays(cls, config: RunConfig, dims: ChunkDims) -> list[ArraySpec]:
        """Links, versions, fates, and the pools' rows (claims, busiest first)."""
        return [
            *super().chunk_arrays(config, dims),
            ArraySpec("claims", "int64", (dims.operations,)),
            ArraySpec("claim_ops", "int64", (dims.operations,)),
            ArraySpec("pool_ptr", "int64", (dims.pools + 1,)),
            ArraySpec("row_owner", "int64", (dims.rows,)),
        ]

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """A position word per executor, a claim counter per pool."""
        return [
            *super().run_arrays(config, dims),
            ArraySpec("claimed", "int64", (STRIDE * dims.pools,)),
        ]

    def __init__(self, config: RunConfig, topology: Topology, state: SharedState, team: Member):
        super().__init__(config, topology, state, team)
        self._stats = np.zeros(LINK_STATS, np.int64)
        if not team.seat.alone:
            self._row_ops = np.zeros(state.layout.rows, np.int64)
            self._fill = np.empty(team.seat.pools, np.int64)

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """Link the chains (the whole team) and hand every row's chains to an owner."""
        super().prepare(chunk, ops, breakdown)
        team, seat = self.team, self.team.seat
        spec = Speculation.of(chunk)
        first_txn, end_txn = _share(len(ops.txn_ptr) - 1, team.rank, team.parties)
        self.run["redo_position"][STRIDE * team.rank] = 0  # nothing of this chunk is done yet
        with breakdown.timing("construct"):
            link_batch(
                team.rank,
                0,
                len(ops),
                spec.ops,
                self._part,
                spec.links,
                chunk.arrays["dealt"],
                self.state.values,
                self._stats,
            )
            txn_fates(first_txn, end_txn, spec.ops, spec.fates)
            if not seat.alone and team.rank == 0:
                pool_rows(
                    0,
                    len(ops),
                    spec.ops,
                    self._spans,
                    seat.pools,
                    self._row_ops,
                    self._fill,
                    chunk.claims,
                    chunk.claim_ops,
                    chunk.pool_ptr,
                )
                self.run["claimed"][:] = 0
        team.barrier(breakdown)
        if seat.alone:
            return  # every executor owns the rows it linked
        begin, end = int(chunk.pool_ptr[seat.pool]), int(chunk.pool_ptr[seat.pool + 1])
        with breakdown.timing("explore"):
            quota = -(-int(chunk.claim_ops[begin:end].sum()) // len(seat.pool_ranks))
            self._claim(chunk, begin, end, quota)
        team.barrier(breakdown)
        if team.rank == seat.pool_ranks[0]:
            with breakdown.timing("explore"):
                self._claim(chunk, begin, end, UNCAPPED)  # whatever the others left
        team.barrier(breakdown)
        with breakdown.timing("explore"):
            first, stop = _share(len(ops), team.rank, team.parties)
            fill_owners(first, stop, spec.ops, self._spans, chunk.row_owner, spec.links.owner)
        team.barrier(breakdown)

    def _claim(self, chunk: ChunkArrays, begin: int, end: int, quota: int) -> None:
        claim_rows(
            self.team.rank,
            begin,
            end,
            chunk.claims,
            chunk.claim_ops,
            chunk.row_owner,
            self.run["claimed"],
            STRIDE * self.team.seat.pool,
            quota,
        )

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """Explore this executor's operations of the batch in ts order; if any failed,
        the Coordinator resolves the batch and the marked operations are redone."""
        team = self.team
        spec = Speculation.of(chunk)
        first_op, stop = int(ops.txn_ptr[begin]), int(ops.txn_ptr[end])
        s = scratch(ops.max_reads, ops.max_txn_ops)
        with breakdown.timing("useful"):
            why = explore_chains(
                team.rank,
                first_op,
                stop,
                spec.ops,
                spec.links,
                spec.versions,
                spec.fates,
                self.state.arrays,
                self.udf,
                self.run["redo_position"],
                team.sync,
                team.timeout_ns,
                s,
            )
        breakdown.useful -= s.waited[0] / 1e9
        breakdown.sync += s.waited[0] / 1e9
        if why == SET_FULL:
            raise RuntimeFailure(SET_FULL_MESSAGE)
        team.check(why)
        team.add_failures(int(s.waited[2]))
        team.barrier(breakdown)
        if team.failures_since_last_check():
            self._repairs.run(LAZY, spec, begin, end, s, breakdown)


def _share(total: int, rank: int, parties: int) -> tuple[int, int]:
    """Executor ``rank``'s contiguous share of ``total`` items."""
    return total * rank // parties, total * (rank + 1) // parties
