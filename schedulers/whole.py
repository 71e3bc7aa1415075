"""The common ground of the baselines that give whole transactions to executors (LOCK,
MVLK, PAT, No-Lock; kernels in `txstream.schedulers._whole`): their scratch, the
tickets that spread transactions over the team in ts order, and the time breakdown
their kernels measure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._kernels import ABORT_NS, WAITED_SLOTS
from txstream.schedulers._whole import LOCK_NS, SYNC_NS, Peer, TxnScratch
from txstream.schedulers.base import Scheduler
from txstream.schedulers.team.member import Member
from txstream.state._kernels import SET_FULL, SET_FULL_MESSAGE, undo_log
from txstream.state.operations import OperationShare
from txstream.state.tables import SharedState
from txstream.topologies.api import Topology

if TYPE_CHECKING:
    from txstream.config import RunConfig


class WholeTransactionScheduler(Scheduler):
    """Whole transactions per executor (module docstring)."""

    def __init__(self, config: RunConfig, topology: Topology, state: SharedState, team: Member):
        super().__init__(config, topology, state, team)
        self.peer = Peer(team.sync, team.timeout_ns, team.rank, team.parties)
        self._admitted = 0

    def tickets(self, ops: OperationShare) -> np.ndarray:
        """Every transaction's place in the run's order of transactions that have
        operations (-1: none, nothing to order); call once per chunk, on every executor."""
        has_ops = np.diff(ops.txn_ptr) > 0
        tickets = np.where(has_ops, self._admitted + np.cumsum(has_ops) - 1, -1)
        self._admitted += int(has_ops.sum())
        return tickets

    @staticmethod
    def scratch(ops: OperationShare) -> TxnScratch:
        """Scratch for the chunk's widest transaction (all its cells distinct)."""
        width = max(1, ops.max_txn_ops * (1 + ops.max_reads))
        return TxnScratch(
            np.empty(max(1, ops.max_reads), np.int64),
            undo_log(ops.max_txn_ops),
            *(np.empty(width, np.int64) for _ in range(5)),
            np.zeros(WAITED_SLOTS, np.int64),
        )

    def charge(self, why: int, s: TxnScratch, breakdown: Breakdown) -> None:
        """Move what the kernel (timed as useful) spent waiting, locking and rolling back
        to those activities; raise for a wait that did not end normally."""
        for which, activity in ((SYNC_NS, "sync"), (LOCK_NS, "lock"), (ABORT_NS, "abort")):
            seconds = s.waited[which] / 1e9
            breakdown.useful -= seconds
            setattr(breakdown, activity, getattr(breakdown, activity) + seconds)
        if why == SET_FULL:
            raise RuntimeFailure(SET_FULL_MESSAGE)
        self.team.check(why)
