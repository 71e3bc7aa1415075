"""The common ground of the schedulers that link each chunk in parallel and execute its
operations speculatively, repairing failures through the Coordinator (tstream,
morphstream): the row partition the team links by, the links and versions of a chunk
and a redo-position word per executor, the repairs, the end of a chunk."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._kernels import collect_results
from txstream.schedulers.base import Scheduler
from txstream.schedulers.team._links import (
    deal_arrays,
    deal_share,
    forget_chunk,
    take_dealt,
    with_room,
)
from txstream.schedulers.team._links import partition as link_partition
from txstream.schedulers.team._versions import scratch, undo_aborted_tails
from txstream.schedulers.team.aborts import Repairs, Speculation, chunk_versions, repair_arrays
from txstream.schedulers.team.member import Member
from txstream.state.chunk import ChunkArrays, ChunkDims, RunDims
from txstream.state.operations import OperationShare
from txstream.state.segments import ArraySpec
from txstream.state.tables import SharedState
from txstream.topologies.api import Topology

if TYPE_CHECKING:
    from txstream.config import RunConfig


class SpeculativeScheduler(Scheduler):
    """Links in parallel, speculative execution, exact repairs (module docstring)."""

    @classmethod
    def chunk_arrays(cls, config: RunConfig, dims: ChunkDims) -> list[ArraySpec]:
        """The links, versions and fates of the chunk's operations; the shuffle that
        deals them to the executors that link them."""
        return [*chunk_versions(dims), *deal_arrays(dims)]

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """The words repairs publish in, per executor (`repair_arrays`)."""
        return repair_arrays(dims.parties)

    def __init__(self, config: RunConfig, topology: Topology, state: SharedState, team: Member):
        super().__init__(config, topology, state, team)
        self._spans = state.layout.spans()
        """Where each column's cells and rows begin (`Layout.spans`): a cell's row."""
        self._part = link_partition(self._spans, team.parties)
        self._repairs: Repairs | None = None

    def map_run(self, arrays: dict[str, np.ndarray]) -> None:
        """Receive the run arrays; repairs publish there."""
        super().map_run(arrays)
        self._repairs = Repairs(
            self.team, self.state.arrays, self.udf, arrays["redo_position"], arrays["settled"]
        )

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """Room to link the chunk (`with_room`: what it holds follows the chunk, not the
        state); this executor's share of the chunk's operations and reads dealt to the
        executors that link them, so that each links only its own (`deal_share`; the
        whole team, one barrier)."""
        team, ptr = self.team, chunk.arrays["dealt_ptr"]
        self._part = with_room(self._part, len(ops))
        shares = team.shares()
        first_op = sum(c.operations for c in shares[: team.rank])
        first_item = first_op + sum(c.reads for c in shares[: team.rank])
        row = team.parties + 1
        with breakdown.timing("construct"):
            deal_share(
                first_op,
                first_op + shares[team.rank].operations,
                first_item,
                chunk.ops,
                self._part,
                Speculation.of(chunk).links,
                chunk.arrays["dealt"],
                ptr[team.rank * row : (team.rank + 1) * row],
            )
        team.barrier(breakdown)
        take_dealt(team.rank, self._part, ptr)

    def finish(
        self, chunk: ChunkArrays, ops: OperationShare, first: int, end: int, breakdown: Breakdown
    ) -> None:
        """Roll back aborted transactions at the ends of chains; collect results (this
        executor's share); forget the chunk's links."""
        spec = Speculation.of(chunk)
        first_op, stop = int(ops.txn_ptr[first]), int(ops.txn_ptr[end])
        with breakdown.timing("abort"):
            undo_aborted_tails(
                first_op, stop, spec.ops, spec.links, spec.versions, spec.fates, self.state.arrays
            )
        with breakdown.timing("useful"):
            collect_results(first, end, spec.ops, spec.versions, spec.fates, chunk.outcomes)
        forget_chunk(self._part)

    def warm_up(self, chunk: ChunkArrays) -> None:
        """The kernels of a repair (`Scheduler.warm_up`)."""
        self.team.warm_up()
        ops = chunk.operations()
        self._repairs.warm_up(Speculation.of(chunk), scratch(ops.max_reads, ops.max_txn_ops))

    def report(self) -> dict:
        """Operations redone after failures; failures the team settled without the
        Coordinator (they changed nothing)."""
        repairs = self._repairs
        return {
            "redone_operations": repairs.redone if repairs else 0,
            "settled_failures": repairs.settled_failures if repairs else 0,
        }
