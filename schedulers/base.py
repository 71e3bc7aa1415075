"""The scheduler interface: how a team of executors executes a chunk's operations.

Every executor of the team calls the same methods in the same order (they may
synchronise inside them): ``prepare`` once the chunk's operations are in shared
memory, ``execute`` for each punctuation batch (a barrier follows each), ``finish``
after the last batch. Results end up in the chunk's per-transaction arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from txstream.metrics import Breakdown
from txstream.state.chunk import ChunkArrays
from txstream.state.sync import Team
from txstream.state.tables import SharedState
from txstream.topologies.api import OperationBatch, Topology

SET_FULL_MESSAGE = "a distinct-set table is full; its capacity is sized per event"


class Scheduler(ABC):
    """Executes batches of operations on the shared state, serial-equivalently."""

    name: str
    coordinated: bool = False
    """Whether it needs the run's Coordinator (abort handling across the team)."""

    def __init__(self, topology: Topology, state: SharedState, spin_ns: int, team: Team):
        self.topology = topology
        self.state = state
        self.spin_ns = spin_ns
        self.team = team
        self.fun_addr = topology.function_addresses
        self.cond_addr = topology.condition_addresses

    def prepare(self, chunk: ChunkArrays, ops: OperationBatch, time: Breakdown) -> None:
        """Restructure the chunk's operations before its first batch (default: nothing)."""
        return None

    @abstractmethod
    def execute(
        self, chunk: ChunkArrays, ops: OperationBatch, begin: int, end: int, time: Breakdown
    ) -> None:
        """This executor's part of transactions ``begin..end-1`` (one punctuation batch)."""

    def finish(
        self, chunk: ChunkArrays, ops: OperationBatch, first: int, end: int, time: Breakdown
    ) -> None:
        """After the last batch: complete the results of transactions ``first..end-1``
        (this executor's share) in the chunk (default: nothing left to do)."""
        return None
