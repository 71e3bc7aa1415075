"""tstream: operation chains evaluated in parallel by the team (TStream, ICDE'20).

``prepare`` restructures the chunk into operation chains (one per state cell, ts
order) and gives the chains of every key one owner: the executor the key hashes to
(shared-nothing), or the executor that claims the key from a shared pool, busiest
keys first (shared-per-socket: a pool per socket; shared-everything: one pool).
``execute`` evaluates the owned operations of a batch, with the run's Coordinator
resolving aborts; see `txstream.schedulers._chains` for versions and the lazy abort
protocol.
"""

from __future__ import annotations

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.metrics import Breakdown
from txstream.schedulers._chains import (
    build_chains,
    claim_keys,
    fill_owners,
    hash_owners,
    pool_keys,
    roll_back_affected,
    run_chains,
    undo_aborted_tails,
)
from txstream.schedulers._kernels import collect_results
from txstream.schedulers.base import SET_FULL_MESSAGE, Scheduler
from txstream.state._kernels import SET_FULL
from txstream.state.chunk import ChunkArrays
from txstream.state.sync import RESOLVE_BATCH, Team, pool_slot
from txstream.state.tables import SharedState
from txstream.topologies.api import OperationBatch, Topology

N_CHAINS, N_KEYS = 0, 1
"""Slots of ``chunk.meta``: how many chains and keys the chunk has."""
UNCAPPED = np.iinfo(np.int64).max


class TStreamScheduler(Scheduler):
    """Parallel evaluation of operation chains, lazy aborts (module docstring)."""

    name = "tstream"
    coordinated = True

    def __init__(self, topology: Topology, state: SharedState, spin_ns: int, team: Team):
        super().__init__(topology, state, spin_ns, team)
        layout = state.layout
        self._key_of_cell = np.arange(layout.cells, dtype=np.int64)
        for (table, _), base in layout.bases.items():
            self._key_of_cell[base : base + layout.sizes[table]] -= base
        self._last = np.full(layout.cells, -1, np.int64)
        self._hashed = np.empty(max(layout.sizes.values(), default=0), np.int64)
        hash_owners(team.parties, self._hashed)
        if team.seat.pools:
            self._key_ops = np.zeros(len(self._hashed), np.int64)
            self._fill = np.empty(team.seat.pools, np.int64)

    def prepare(self, chunk: ChunkArrays, ops: OperationBatch, time: Breakdown) -> None:
        """Build the chains (executor 0) and hand every key's chains to an owner."""
        team, seat = self.team, self.team.seat
        if team.rank == 0:
            with time.timing("construct"):
                chunk.meta[N_CHAINS] = build_chains(
                    ops.txn, ops.cell, ops.cond, ops.dep_ptr, ops.dep_cell, self.state.values,
                    self._last, chunk.chain_prev, chunk.dep_prev, chunk.dep_initial,
                    chunk.last_cond, chunk.tails,
                )  # fmt: skip
                if not seat.pools:
                    fill_owners(0, len(ops), ops.cell, self._key_of_cell, self._hashed,
                                chunk.owner)  # fmt: skip
                else:
                    chunk.meta[N_KEYS] = pool_keys(
                        ops.cell, self._key_of_cell, seat.pools, self._key_ops, self._fill,
                        chunk.claims, chunk.claim_ops, chunk.pool_ptr,
                    )  # fmt: skip
                    team.reset_pools()
        self.team.barrier(time)
        if not seat.pools:
            return
        begin, end = int(chunk.pool_ptr[seat.pool]), int(chunk.pool_ptr[seat.pool + 1])
        with time.timing("explore"):
            quota = -(-int(chunk.claim_ops[begin:end].sum()) // len(seat.pool_ranks))
            self._claim(chunk, begin, end, quota)
        self.team.barrier(time)
        if team.rank == seat.pool_ranks[0]:
            with time.timing("explore"):
                self._claim(chunk, begin, end, UNCAPPED)  # whatever the others left
        self.team.barrier(time)
        with time.timing("explore"):
            first, stop = (len(ops) * r // team.parties for r in (team.rank, team.rank + 1))
            fill_owners(first, stop, ops.cell, self._key_of_cell, chunk.key_owner, chunk.owner)
        self.team.barrier(time)

    def _claim(self, chunk: ChunkArrays, begin: int, end: int, quota: int) -> None:
        claim_keys(
            self.team.rank, begin, end, chunk.claims, chunk.claim_ops, chunk.key_owner,
            self.team.sync, pool_slot(self.team.parties, self.team.seat.pool), quota,
        )  # fmt: skip

    def execute(
        self, chunk: ChunkArrays, ops: OperationBatch, begin: int, end: int, time: Breakdown
    ) -> None:
        """Explore this executor's operations of the batch in ts order; if any failed,
        the Coordinator resolves the batch and the affected transactions are redone."""
        first_op, stop = int(ops.txn_ptr[begin]), int(ops.txn_ptr[end])
        failed = self._run(chunk, ops, False, first_op, stop, time, "useful")
        self.team.add_failures(failed)
        self.team.barrier(time)
        if not self.team.failures_since_last_check():
            return
        request = [*chunk.shape.words(), begin, end]
        if not self.team.ask_coordinator(RESOLVE_BATCH, request, time, "abort"):
            return
        with time.timing("abort"):
            roll_back_affected(
                self.team.rank, first_op, stop, chunk.owner, ops.txn, ops.cell,
                self.state.values, self.state.set_cells, chunk.before, chunk.slot,
                chunk.affected,
            )  # fmt: skip
        self._run(chunk, ops, True, first_op, stop, time, "abort")

    def _run(self, chunk: ChunkArrays, ops: OperationBatch, redo: bool, first_op: int,
             stop: int, time: Breakdown, activity: str) -> int:  # fmt: skip
        """One pass of `run_chains` over operations first_op..stop-1, its time charged to
        ``activity`` (waits to sync, roll-backs to abort); how many operations failed."""
        width = max(1, ops.max_txn_ops)
        stats = np.zeros(3, np.int64)
        with time.timing(activity):
            why = run_chains(
                self.team.rank, redo, first_op, stop, chunk.owner, ops.txn,
                ops.txn_ptr, self.state.values,
                self.state.set_cells, self.state.set_members, ops.kind, ops.cell, ops.fun,
                ops.cond, ops.args, ops.dep_ptr, self.fun_addr, self.cond_addr, self.spin_ns,
                chunk.chain_prev, chunk.dep_prev, chunk.dep_initial, chunk.last_cond,
                chunk.before, chunk.after, chunk.result, chunk.slot, chunk.ok, chunk.failed,
                chunk.affected, np.empty(max(1, ops.max_reads), np.int64),
                np.empty(width, np.int64), np.empty(width, np.int64), np.empty(width, np.int64),
                self.team.sync, self.team.timeout_ns, stats,
            )  # fmt: skip
        waited, undone = float(stats[0]) / 1e9, float(stats[1]) / 1e9
        setattr(time, activity, getattr(time, activity) - waited - undone)
        time.sync += waited
        time.abort += undone
        if why == SET_FULL:
            raise RuntimeFailure(SET_FULL_MESSAGE)
        self.team.check(why)
        return int(stats[2])

    def finish(
        self, chunk: ChunkArrays, ops: OperationBatch, first: int, end: int, time: Breakdown
    ) -> None:
        """Roll back aborted transactions at the ends of owned chains; collect results."""
        with time.timing("abort"):
            undo_aborted_tails(
                self.team.rank, chunk.tails, int(chunk.meta[N_CHAINS]), chunk.owner, ops.txn,
                ops.cell, self.state.values, self.state.set_cells,
                chunk.chain_prev, chunk.before, chunk.slot, chunk.failed,
            )  # fmt: skip
        with time.timing("useful"):
            collect_results(
                first, end, ops.txn_ptr, chunk.ok, chunk.failed, ops.reason, ops.out,
                chunk.result, chunk.status, chunk.status_reason, chunk.out_values, chunk.out_set,
            )  # fmt: skip
