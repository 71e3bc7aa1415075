"""serial: one executor runs each batch's transactions one by one in ts order.

The correctness reference every other scheduler is tested against. With several
executors, they share pre- and post-processing; executor 0 alone touches state.
"""

from __future__ import annotations

from txstream.monitor.metrics import Breakdown
from txstream.schedulers.base import Scheduler
from txstream.state.chunk import ChunkArrays
from txstream.state.operations import OperationShare


class SerialScheduler(Scheduler):
    """Transactions in ts order, operations in statement order, rollback on abort."""

    name = "serial"

    def batches_in_step(self) -> bool:
        """Executor 0 runs every batch alone: the others wait once, after the chunk."""
        return False

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """Run the batch in one kernel call (executor 0)."""
        if self.team.rank == 0:
            self.run_in_order(chunk, ops, begin, end, breakdown)
