"""The columnar form of state transactions: operation kinds, event outcomes, and the
operation batch every scheduler executes.

This is the bottom of the engine: topologies produce operation batches, the state
kernels apply them, schedulers order them. Kernels take the batch as one `Ops` tuple
(numba passes a named tuple of arrays as one argument), never as a dozen arrays.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

READ, WRITE, READ_MODIFY, SET_ADD = 0, 1, 2, 3
"""Operation kinds (`kind` column)."""

COMMITTED, ABORTED, REJECTED = 0, 1, 2
"""Event status codes, in the order of `STATUS_NAMES`."""
STATUS_NAMES = ("committed", "aborted", "rejected")


class Ops(NamedTuple):
    """A chunk's operations as kernels see them (see `OperationShare`)."""

    txn: np.ndarray
    cell: np.ndarray
    kind: np.ndarray
    fun: np.ndarray
    cond: np.ndarray
    reason: np.ndarray
    out: np.ndarray
    args: np.ndarray
    dep_ptr: np.ndarray
    dep_cell: np.ndarray
    txn_ptr: np.ndarray


class OperationShare:
    """The operations of a batch of transactions, as parallel arrays in (txn, statement)
    order (`Ops`: ``batch.cell`` is ``batch.arrays.cell``), with their widest
    transaction and operation.

    Operation ``o`` targets cell ``cell[o]`` of the flat state array; its parametric
    reads are the cells ``dep_cell[dep_ptr[o]:dep_ptr[o+1]]``; the operations of
    transaction ``t`` are ``txn_ptr[t]:txn_ptr[t+1]``.
    """

    def __init__(self, arrays: Ops, max_txn_ops: int | None = None, max_reads: int | None = None):
        self.arrays = arrays
        if max_txn_ops is None:
            max_txn_ops = int(np.diff(arrays.txn_ptr).max(initial=0))
        if max_reads is None:
            max_reads = int(np.diff(arrays.dep_ptr).max(initial=0))
        self.max_txn_ops = max_txn_ops
        """Most operations of one transaction (counted while building them, or here)."""
        self.max_reads = max_reads
        """Most parametric reads of one operation."""

    def __getattr__(self, name: str) -> np.ndarray:
        if name == "arrays":
            raise AttributeError(name)
        return getattr(self.arrays, name)

    def __len__(self) -> int:
        return len(self.arrays.txn)
