"""serial: one executor runs the batch's transactions one by one in ts order.

The correctness reference every other scheduler is tested against.
"""

from __future__ import annotations

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.metrics import Breakdown
from txstream.schedulers._kernels import run_transactions
from txstream.schedulers.base import Results, Scheduler
from txstream.topologies.api import OperationBatch


class SerialScheduler(Scheduler):
    """Transactions in ts order, operations in statement order, rollback on abort."""

    name = "serial"

    def execute(
        self, ops: OperationBatch, begin: int, end: int, results: Results, time: Breakdown
    ) -> None:
        """Run the batch in one kernel call."""
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
                results.status,
                results.reason,
                results.out_values,
                results.out_set,
            )
        if error:
            raise RuntimeFailure("a distinct-set table is full; its capacity is sized per event")
