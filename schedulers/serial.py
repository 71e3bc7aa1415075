"""serial: one executor runs each batch's transactions one by one in ts order.

The correctness reference every other scheduler is tested against. With several
executors, they share pre- and post-processing; executor 0 alone touches state.
"""

from __future__ import annotations

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._kernels import ABORT_NS, run_transactions
from txstream.schedulers.base import Scheduler
from txstream.state._kernels import SET_FULL_MESSAGE, undo_log
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
        if self.team.rank != 0:
            return
        reads = np.empty(max(1, ops.max_reads), np.int64)
        waited = np.zeros(ABORT_NS + 1, np.int64)
        with breakdown.timing("useful"):
            error = run_transactions(
                begin,
                end,
                ops.arrays,
                self.state.arrays,
                self.udf,
                reads,
                undo_log(ops.max_txn_ops),
                chunk.outcomes,
                waited,
            )
        breakdown.useful -= waited[ABORT_NS] / 1e9
        breakdown.abort += waited[ABORT_NS] / 1e9
        if error:
            raise RuntimeFailure(SET_FULL_MESSAGE)
