"""serial: one executor runs each batch's transactions one by one in ts order.

The correctness reference every other scheduler is tested against. With several
executors, they share pre- and post-processing; executor 0 alone touches state. A
lone executor runs its transactions straight from the topology's statements, without
writing the chunk's operations out and reading them back, with a kernel made for them
(`txstream.schedulers._statement_kernels`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from txstream.errors import TopologyError
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._kernels import StatementScratch, statement_scratch
from txstream.schedulers._statement_kernels import statement_kernel
from txstream.schedulers.base import Scheduler
from txstream.state.chunk import ChunkArrays
from txstream.state.operations import OperationShare

if TYPE_CHECKING:
    from txstream.topologies.api import Transactions


class _Direct(NamedTuple):
    """A chunk a lone executor runs from its statements: their kernel, and what every
    batch passes it."""

    kernel: Callable[..., int]
    statements: Transactions
    tables: tuple[np.ndarray, np.ndarray, np.ndarray]
    scratch: StatementScratch


class SerialScheduler(Scheduler):
    """Transactions in ts order, operations in statement order, rollback on abort."""

    name = "serial"
    _direct: _Direct | None = None

    def takes_statements(self, statements: Transactions) -> bool:
        """A lone executor does, but not on one of several nodes (whose operations'
        cells are mapped to the node's rows once built)."""
        self._direct = None
        if self.team.parties > 1 or statements.layout.share:
            return False
        sizes = statements.sizes()
        scratch = statement_scratch(sizes.arg_width, sizes.op_reads, sizes.txn_ops)
        tables = statements.tables()
        kernel = statement_kernel(tables[0], tables[1])
        self._direct = _Direct(kernel, statements, tables, scratch)
        return True

    def batches_in_step(self) -> bool:
        """Executor 0 runs every batch alone: the others wait once, after the chunk."""
        return False

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """Run the batch in one kernel call (executor 0)."""
        if self._direct is not None:
            self._run_statements(self._direct, chunk, begin, end, breakdown)
        elif self.team.rank == 0:
            self.run_in_order(chunk, ops, begin, end, breakdown)

    def _run_statements(
        self, direct: _Direct, chunk: ChunkArrays, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """`run_in_order` from the statements, with their kernel."""
        args = (begin, end, *direct.tables, self.state.arrays, self.udf)
        if self.timed_in_order(direct.kernel, args, (direct.scratch,), chunk, breakdown)[0]:
            raise TopologyError(direct.statements.error_message(direct.scratch[-1]))
