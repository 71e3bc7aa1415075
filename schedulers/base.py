"""The scheduler interface: execute the operations of one punctuation batch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from txstream.metrics import Breakdown
from txstream.schedulers._kernels import COMMITTED, REJECTED
from txstream.state.tables import SharedState
from txstream.topologies.api import OperationBatch, Topology


@dataclass
class Results:
    """Per-event results of a chunk of events, filled batch by batch by a scheduler."""

    status: np.ndarray
    reason: np.ndarray
    out_values: np.ndarray
    out_set: np.ndarray

    @staticmethod
    def start(rejection_reason: np.ndarray, n_outputs: int) -> Results:
        """Rejected events are final; all others start as committed until they abort."""
        n = len(rejection_reason)
        return Results(
            status=np.where(rejection_reason != 0, REJECTED, COMMITTED).astype(np.int8),
            reason=rejection_reason.astype(np.int32),
            out_values=np.zeros((n, max(1, n_outputs)), np.int64),
            out_set=np.zeros((n, max(1, n_outputs)), np.bool_),
        )


class Scheduler(ABC):
    """Executes batches of operations on the shared state, serial-equivalently."""

    name: str

    def __init__(self, topology: Topology, state: SharedState, spin_ns: int):
        self.topology = topology
        self.state = state
        self.spin_ns = spin_ns
        self.fun_addr = topology.function_addresses
        self.cond_addr = topology.condition_addresses

    @abstractmethod
    def execute(
        self, ops: OperationBatch, begin: int, end: int, results: Results, time: Breakdown
    ) -> None:
        """Execute transactions ``begin..end-1`` of ``ops`` (one punctuation batch)."""
