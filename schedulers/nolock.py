"""nolock: the upper bound without consistency (TStream's No-Lock).

Transactions are spread over the team round-robin by ts; each executor applies their
operations as they come, with no ordering between executors and no atomic aborts (a
failed condition stops its transaction, whose earlier writes stay). Its outputs are not
serial's; every event is still written exactly once, in ts order.
"""

from __future__ import annotations

from txstream.monitor.metrics import Breakdown
from txstream.schedulers._whole import run_unordered
from txstream.schedulers.whole import WholeTransactionScheduler
from txstream.state.chunk import ChunkArrays
from txstream.state.operations import OperationShare


class NoLockScheduler(WholeTransactionScheduler):
    """No ordering, no locks, no rollback (module docstring)."""

    name = "nolock"
    serial_equivalent = False

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """This executor's transactions of the batch."""
        s = self.scratch(ops)
        with breakdown.timing("useful"):
            why = run_unordered(
                begin, end, ops.arrays, self.state.arrays, self.udf, chunk.outcomes, self.peer, s
            )
        self.charge(why, s, breakdown)
