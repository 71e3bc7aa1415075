"""A batch's statements as the engine takes them: what their operations take, the
operations built into a chunk's arrays, and the cells each transaction touches.

A topology's ``state_access`` records statements through the `Transactions` it is
handed; the engine hands it a `Statements`, the same builder with what the executors,
the schedulers and a run's sequencer read from it, kept out of the API an author reads.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from txstream.errors import TopologyError
from txstream.state.keys import LIVE
from txstream.state.layout import Layout
from txstream.state.operations import Ops
from txstream.topologies._kernels import (
    ARG_SHORTER,
    CONSTANT,
    FIRST_READ,
    READ_OUTSIDE,
    READ_TARGET,
    TARGET,
    build_operations,
    count_operations,
)
from txstream.topologies.api import EventShare, Transactions


class Sizes(NamedTuple):
    """What a batch's operations take (`Statements.sizes`)."""

    operations: int
    reads: int
    """Parametric reads (dependency cells)."""
    arg_width: int
    """Widest argument list of an operation."""
    txn_ops: int
    """Most operations of one transaction."""
    op_reads: int
    """Most parametric reads of one operation."""


class Statements(Transactions):
    """The `Transactions` builder the engine hands a topology, read once its statements
    are recorded; what they take is counted once (a new statement counts them again)."""

    def __init__(self, events: EventShare, layout: Layout):
        super().__init__(events, layout)
        self._counts: tuple[int, ...] | None = None
        self._ops_before = np.zeros(1, np.int64)
        """The operations of the events before each event and before the end
        (`operations_between`)."""

    def _emit(self, *args: Any, **kw: Any) -> None:
        super()._emit(*args, **kw)
        self._counts = None

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The statements (one column each), arguments and reads as the kernels take them."""
        return (
            np.array(self._statements, np.int64).reshape(-1, 16).T.copy(),
            np.array(self._args or [(CONSTANT, 0, 0)], np.int64).reshape(-1, 3),
            np.array(self._reads or [(0,) * 6], np.int64).reshape(-1, 6),
        )

    def sizes(self) -> Sizes:
        """What the operations emitted so far take."""
        if self._counts is None:
            statements, _, reads = self.tables()
            before = np.zeros(self.events.n + 1, np.int64)
            counts = count_operations(self.events.reason, statements, reads, before[1:])
            self._counts = tuple(int(c) for c in counts)
            self._ops_before = before
        ops, reads, txn_ops, op_reads = self._counts
        return Sizes(ops, reads, self._width, txn_ops, op_reads)

    def operations_between(self, begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """How many operations events ``begins[i]..ends[i]-1`` emit, for every i, as a
        built chunk's ``txn_ptr`` gives them: the batches of a walk."""
        self.sizes()
        return self._ops_before[ends] - self._ops_before[begins]

    def build_into(self, out: Ops, first_txn: int, first_op: int, first_read: int) -> None:
        """All statements as operations in (txn, statement, list) order, written into
        ``out``: views of a chunk's arrays where this batch's transactions start at
        ``first_txn``, its operations at ``first_op`` and its reads at ``first_read``
        (indices made chunk-global). The first ``txn_ptr`` and ``dep_ptr`` entries are a
        neighbour's last: both write the same value there. A key outside its table is a
        TopologyError (pre_process must reject such events)."""
        ops, reads = self.sizes()[:2]
        share = self.layout.share
        targets = (
            np.empty(ops if share else 0, np.int64),
            np.empty(reads if share else 0, np.int64),
        )
        error = np.zeros(3, np.int64)
        first = (first_txn, first_op, first_read)
        if build_operations(self.events.reason, *self.tables(), out, first, targets, error):
            raise TopologyError(self.error_message(error))
        if share:
            for index, (table, column) in enumerate(self._targets):
                base = self.layout.bases[(table, column)]
                for cells, target in ((out.cell, targets[0]), (out.dep_cell, targets[1])):
                    at = np.flatnonzero(target == index)
                    cells[at] = base + share.rows(table, cells[at])

    def error_message(self, error: np.ndarray) -> str:
        """What an error a kernel reported in ``error`` (`build_operations`) says."""
        code, statement, read = (int(e) for e in error)
        if code == ARG_SHORTER:
            return (
                f"{self.topology.name}: a list argument is shorter than its key list; "
                "pre_process must reject such events"
            )
        target = self._statements[statement][TARGET]
        if code == READ_OUTSIDE:
            target = self._reads[self._statements[statement][FIRST_READ] + read][READ_TARGET]
        return (
            f"{self.topology.name}: state_access used a key outside table "
            f"{self._targets[target][0]!r}; pre_process must reject such events"
        )

    def operations(self) -> Ops:
        """Every statement's operations, built into arrays of their own (no chunk's)."""
        ops, reads, width = self.sizes()[:3]
        built = Ops(
            *(np.empty(ops, dtype) for dtype in (np.int64, np.int64, np.int8)),
            *(np.empty(ops, np.int32) for _ in range(4)),
            args=np.empty((ops, width), np.int64),
            dep_ptr=np.empty(ops + 1, np.int64),
            dep_cell=np.empty(reads, np.int64),
            txn_ptr=np.empty(self.events.n + 1, np.int64),
        )
        self.build_into(built, 0, 0, 0)
        return built

    def touched(self) -> tuple[np.ndarray, np.ndarray]:
        """``(txn, cell)``: every cell each transaction writes or reads (its operations'
        targets and parametric reads, and the existence of the keys it creates), grouped
        by transaction in ascending order; what a sequencer needs to know where a
        transaction's state lives (`txstream.nodes`)."""
        built = self.operations()
        txn = [built.txn, np.repeat(built.txn, np.diff(built.dep_ptr))]
        cell = [built.cell, built.dep_cell]
        for table, key, where in self._creates:  # the existence a commit marks (`create`)
            at = np.flatnonzero((key >= 0) if where is None else (key >= 0) & where)
            txn.append(at)
            cell.append(self.layout.cells_of(table, LIVE, key[at]))
        txn, cell = np.concatenate(txn), np.concatenate(cell)
        order = np.argsort(txn, kind="stable")
        return txn[order], cell[order]
