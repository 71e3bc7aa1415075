"""sstore: PAT, S-Store's partitioned execution (TStream's PAT baseline).

The state is partitioned by row into `PARTITIONS_PER_POOL` partitions per pool of
``--placement`` (shared-nothing, the default: a pool per executor); a transaction
belongs to the partition of its first operation, whose pool's executors run its
transactions in ts order (a pool of several executors spreads them round-robin). Each
partition counts its transactions done (a word in shared memory); a transaction waits
until every partition it touches reached it, taken in ascending order, runs holding them
all, and advances them (`txstream.schedulers._whole`). It only ever waits for earlier
transactions, so the team never deadlocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._whole import PartitionPlan, plan_partitions, run_partitioned
from txstream.schedulers.team.member import Member
from txstream.schedulers.team.placement import row_pools
from txstream.schedulers.whole import WholeTransactionScheduler
from txstream.state.chunk import ChunkArrays, RunDims
from txstream.state.operations import OperationShare
from txstream.state.segments import ArraySpec
from txstream.state.sync import STRIDE
from txstream.state.tables import SharedState
from txstream.topologies.api import Topology

if TYPE_CHECKING:
    from txstream.config import RunConfig


PARTITIONS_PER_POOL = 1024
"""Partitions per pool. With one partition per executor nearly every multi-key
transaction touches both of 2 partitions and waits for every earlier transaction that
touched either: the team ran about one transaction at a time. With more, a transaction
waits only for earlier ones on the same partitions. Two executors' speed-up grows with the
count up to a few hundred partitions per pool and then levels off (bench/baselines.py);
1024 is on that level for SL, GS, TP and OB, whose bids touch several items. A row's pool
is the same whatever the count (a hash modulo a multiple of the pools)."""


class SStoreScheduler(WholeTransactionScheduler):
    """Per-partition order counters (module docstring)."""

    name = "sstore"

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """A counter per partition, each on its own cache line."""
        partitions = PARTITIONS_PER_POOL * dims.pools
        return [ArraySpec("partition_done", "int64", (STRIDE * partitions,))]

    def __init__(self, config: RunConfig, topology: Topology, state: SharedState, team: Member):
        super().__init__(config, topology, state, team)
        seat = team.seat
        partitions = PARTITIONS_PER_POOL * seat.pools
        self._part_of_cell = row_pools(state.layout.rows, partitions)[state.layout.row_of_cell()]
        self._next_seq = np.zeros(partitions, np.int64)
        self._last = np.empty(partitions, np.int64)

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """Plan the chunk: every executor alike, keeping the transactions it runs."""
        seat = self.team.seat
        entries = len(ops) + len(ops.dep_cell)
        n_txn = len(ops.txn_ptr) - 1
        self._plan = PartitionPlan(
            np.empty(n_txn + 1, np.int64),
            np.empty(entries, np.int64),
            np.empty(entries, np.int64),
            np.empty(n_txn, np.int8),
        )
        with breakdown.timing("construct"):
            plan_partitions(
                ops.arrays,
                self._part_of_cell,
                self._next_seq,
                self._last,
                seat.pools,
                seat.pool,
                len(seat.pool_ranks),
                seat.pool_ranks.index(seat.rank),
                self._plan,
            )

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """This executor's transactions of the batch, in ts order."""
        s = self.scratch(ops)
        with breakdown.timing("useful"):
            why = run_partitioned(
                begin,
                end,
                ops.arrays,
                self.state.arrays,
                self.udf,
                chunk.outcomes,
                self._plan,
                self.run["partition_done"],
                self.peer,
                s,
            )
        self.charge(why, s, breakdown)
