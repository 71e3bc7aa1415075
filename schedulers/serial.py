"""serial: one executor runs each batch's transactions one by one in ts order.

The correctness reference every other scheduler is tested against. Executor 0 alone
touches state. When it holds the whole chunk (a lone executor, or a team of threads,
which deals it every chunk whole: `whole_chunks`), it runs the transactions straight
from the topology's statements, without writing the chunk's operations out and reading
them back, with a kernel made for them (`txstream.schedulers._statement_kernels`). A
team of processes shares pre- and post-processing, and executor 0 runs the operations
they built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txstream.monitor.metrics import Breakdown
from txstream.schedulers.base import Scheduler
from txstream.state.chunk import ChunkArrays
from txstream.state.operations import OperationShare

if TYPE_CHECKING:
    from txstream.config import RunConfig
    from txstream.schedulers.statements import Statements


class SerialScheduler(Scheduler):
    """Transactions in ts order, operations in statement order, rollback on abort."""

    name = "serial"

    @classmethod
    def whole_chunks(cls, config: RunConfig) -> bool:
        """Executor 0 runs every chunk; the others' share of its Python steps would cost
        as much wall as its own under one GIL (`Scheduler.whole_chunks`)."""
        return True

    def takes_statements(self, statements: Statements, whole: bool) -> bool:
        """Executor 0 does when it holds the whole chunk (`Scheduler.from_statements`)."""
        return self.from_statements(statements, whole)

    def batches_in_step(self) -> bool:
        """Executor 0 runs every batch alone: the others wait once, after the chunk."""
        return False

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """Run the batch in one kernel call (executor 0)."""
        if self.direct is not None:
            self.run_direct(chunk, begin, end, breakdown)
        elif self.team.rank == 0:
            self.run_in_order(chunk, ops, begin, end, breakdown)
