"""serial: one executor runs each batch's transactions one by one in ts order.

The correctness reference every other scheduler is tested against. With several
executors, they share pre- and post-processing; executor 0 alone touches state.
"""

from __future__ import annotations

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.metrics import Breakdown
from txstream.schedulers._kernels import run_transactions
from txstream.schedulers.base import SET_FULL_MESSAGE, Scheduler
from txstream.state.chunk import ChunkArrays
from txstream.topologies.api import OperationBatch


class SerialScheduler(Scheduler):
    """Transactions in ts order, operations in statement order, rollback on abort."""

    name = "serial"

    def execute(
        self, chunk: ChunkArrays, ops: OperationBatch, begin: int, end: int, time: Breakdown
    ) -> None:
        """Run the batch in one kernel call (executor 0)."""
        if self.team.rank != 0:
            return
        width = max(1, ops.max_txn_ops)
        st = self.state
        with time.timing("useful"):
            error = run_transactions(
                begin,
                end,
                ops.txn_ptr,
                st.values,
                st.set_cells,
                st.set_members,
                ops.kind,
                ops.cell,
                ops.fun,
                ops.cond,
                ops.reason,
                ops.out,
                ops.args,
                ops.dep_ptr,
                ops.dep_cell,
                self.fun_addr,
                self.cond_addr,
                self.spin_ns,
                np.empty(max(1, ops.max_reads), np.int64),
                np.empty(width, np.int64),
                np.empty(width, np.int64),
                np.empty(width, np.int64),
                chunk.status,
                chunk.status_reason,
                chunk.out_values,
                chunk.out_set,
            )
        if error:
            raise RuntimeFailure(SET_FULL_MESSAGE)
