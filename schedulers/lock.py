"""lock: ordered locking, TStream's LOCK baseline.

Transactions are spread over the team by their place in ts order; each takes all of its
locks (shared for reads, parametric reads included; exclusive for writes) when the
run's order counter admits it - only once the previous transaction holds its own -
executes, and releases them at commit or abort (`txstream.schedulers._whole`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txstream.monitor.metrics import Breakdown
from txstream.schedulers._whole import LockWords, run_locked
from txstream.schedulers.whole import WholeTransactionScheduler
from txstream.state.chunk import ChunkArrays, RunDims
from txstream.state.operations import OperationShare
from txstream.state.segments import ArraySpec
from txstream.state.sync import STRIDE

if TYPE_CHECKING:
    from txstream.config import RunConfig


class LockScheduler(WholeTransactionScheduler):
    """Ordered lock acquisition, locks held to commit (module docstring)."""

    name = "lock"

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """The order counter (a cache line) and a lock word per cell."""
        return [ArraySpec("order", "int64", (STRIDE,)), ArraySpec("locks", "int64", (dims.cells,))]

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """The chunk's tickets (every executor alike)."""
        self._tickets = self.tickets(ops)

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """This executor's transactions of the batch, in ts order."""
        s = self.scratch(ops)
        words = LockWords(self.run["order"], self.run["locks"])
        with breakdown.timing("useful"):
            why = run_locked(
                begin,
                end,
                ops.arrays,
                self.state.arrays,
                self.udf,
                chunk.outcomes,
                self._tickets,
                words,
                self.peer,
                s,
            )
        self.charge(why, s, breakdown)
