"""The scheduler interface: how a team of executors executes a chunk's operations.

A scheduler class *declares* what it needs, so that the engine around it stays
generic: whether its results equal serial execution, the Coordinator policies it asks
for, and the shared arrays it uses - per chunk (sized from the chunk's operations, reads
and transactions) and per run (sized from the state's cells and rows; its position words,
locks, ... live there). The options it honours are declared with the run's options
(`txstream.config.HONOURED`); it reads their effective values. The executor lays those arrays
out in shared memory and hands them over.

Every executor of the team calls the same methods in the same order (they may
synchronise inside them): ``publish`` before the barrier that follows the shares'
counts, ``takes_statements`` before its share's operations are built (or not),
``prepare`` once the chunk's operations are in shared memory, ``execute`` for each
punctuation batch (a barrier follows each, unless `batches_in_step` says none is
needed), ``finish`` after the last batch. Results end up in the chunk's per-transaction
arrays.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np
from txstream.errors import RuntimeFailure, TopologyError
from txstream.monitor.metrics import Breakdown
from txstream.schedulers._kernels import (
    ABORT_NS,
    ABORTS,
    WAITED_SLOTS,
    StatementScratch,
    run_transactions,
    statement_scratch,
)
from txstream.schedulers._statement_kernels import statement_kernel
from txstream.schedulers.team.member import Member
from txstream.state._kernels import SET_FULL, SET_FULL_MESSAGE, undo_log
from txstream.state.chunk import ChunkArrays, ChunkDims, RunDims, chunk_layout
from txstream.state.operations import OperationShare
from txstream.state.segments import GROWTH, RESERVED_BYTES, ArraySpec, SegmentLayout
from txstream.state.tables import SharedState

if TYPE_CHECKING:
    from txstream.config import RunConfig
    from txstream.schedulers.statements import Statements
    from txstream.topologies.api import Topology


class Direct(NamedTuple):
    """A chunk one executor runs from its statements (`Scheduler.from_statements`): their
    kernel, and what every batch passes it."""

    kernel: Callable[..., int]
    statements: Statements
    tables: tuple[np.ndarray, np.ndarray, np.ndarray]
    scratch: StatementScratch


def reserved_capacity(config: RunConfig, dims: ChunkDims, layout: SegmentLayout) -> SegmentLayout:
    """The room a new chunk segment laid out as ``layout`` reserves: the run's largest
    chunk (``--max-chunk-events``) at this chunk's sizes per event, up to `RESERVED_BYTES`
    (`Scheduler.chunk_capacity`)."""
    factor = config.max_chunk_events / max(dims.transactions, 1)
    factor = min(factor, RESERVED_BYTES / max(layout.nbytes, 1))
    return layout.grown(max(GROWTH, factor))


class Scheduler(ABC):
    """Executes batches of operations on the shared state (see module docstring)."""

    name: ClassVar[str]
    serial_equivalent: ClassVar[bool] = True
    """Whether its outputs and state equal `serial`'s (contract §5)."""

    @classmethod
    def whole_chunks(cls, config: RunConfig) -> bool:
        """Whether executor 0 gets every chunk whole (the others an empty share) when the
        team shares one interpreter (threads): a share's pre- and post-processing costs
        about as much wall as the whole chunk's under one GIL, so splitting them only
        pays to a scheduler that builds operations on every executor (default: False)."""
        return False

    @classmethod
    def coordinator_policies(cls, config: RunConfig) -> tuple[str, ...]:
        """The abort policies (`txstream.schedulers.team.aborts`) the run's Coordinator must
        serve for it; none: no Coordinator."""
        return ()

    @classmethod
    def chunk_arrays(cls, config: RunConfig, dims: ChunkDims) -> list[ArraySpec]:
        """Arrays it shares per chunk, besides the operations and results."""
        return []

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """Arrays it shares for the whole run."""
        return []

    @classmethod
    def chunk_layout(cls, config: RunConfig, dims: ChunkDims) -> SegmentLayout:
        """The chunk segment: operations and results, then `chunk_arrays`."""
        return chunk_layout(dims, cls.chunk_arrays(config, dims))

    @classmethod
    def chunk_capacity(cls, config: RunConfig, dims: ChunkDims) -> SegmentLayout:
        """The room a new chunk segment reserves: the run's largest chunk
        (``--max-chunk-events``) at this chunk's sizes per event, up to `RESERVED_BYTES`.
        Chunks grow to that size over a run's first few; each new segment costs the
        team a creation, a Coordinator round trip and a page fault per page it touches,
        while room never touched costs nothing (shared memory is allocated on touch)."""
        return reserved_capacity(config, dims, cls.chunk_layout(config, dims))

    def __init__(self, config: RunConfig, topology: Topology, state: SharedState, team: Member):
        self.config = config
        self.topology = topology
        self.state = state
        self.team = team
        self.udf = topology.udf(int(round(config.udf_cost_us * 1000)))
        self.run: dict[str, np.ndarray] = {}

    def map_run(self, arrays: dict[str, np.ndarray]) -> None:
        """Receive the run segment's arrays (before the first chunk)."""
        self.run = arrays

    def publish(self) -> None:
        """Write, into the run's arrays, what the team reads after the barrier that
        follows the executors' share counts (default: nothing)."""
        return None

    def takes_statements(self, statements: Statements, whole: bool) -> bool:
        """Whether this executor runs the chunk straight from its share's ``statements``
        (`from_statements`) instead of from operations built into the chunk, which are
        then not built; ``whole``: the share is the whole chunk (default: False)."""
        return False

    direct: Direct | None = None
    """The chunk this executor runs from its statements (`from_statements`), if any."""

    def from_statements(self, statements: Statements, wanted: bool) -> bool:
        """Whether this executor runs the chunk from ``statements`` with a kernel made
        for them (`run_direct`): if ``wanted`` and it is executor 0 (which runs a chunk
        in order), and not on one of several nodes, whose operations' cells are mapped to
        the node's rows once built."""
        self.direct = None
        if not wanted or self.team.rank != 0 or statements.layout.share:
            return False
        sizes = statements.sizes()
        scratch = statement_scratch(sizes.arg_width, sizes.op_reads, sizes.txn_ops)
        tables = statements.tables()
        self.direct = Direct(statement_kernel(tables[0], tables[1]), statements, tables, scratch)
        return True

    def run_direct(
        self, chunk: ChunkArrays, begin: int, end: int, breakdown: Breakdown
    ) -> tuple[int, int]:
        """`run_in_order` from the statements (`from_statements`): the nanoseconds it
        took and the transactions that aborted."""
        direct = self.direct
        args = (begin, end, *direct.tables, self.state.arrays, self.udf)
        returned, spent, aborted = self.timed_in_order(
            direct.kernel, args, (direct.scratch,), chunk, breakdown
        )
        if returned:
            raise TopologyError(direct.statements.error_message(direct.scratch[-1]))
        return spent, aborted

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """Restructure the chunk's operations before its first batch (default: nothing)."""
        return None

    @abstractmethod
    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """This executor's part of transactions ``begin..end-1`` (one punctuation batch)."""

    def run_in_order(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> tuple[int, int]:
        """Transactions ``begin..end-1`` one by one in ts order with serial's kernel, on
        this executor alone; the nanoseconds it took, counted in ``breakdown`` as useful
        but for the aborts' rollbacks, and the transactions that aborted."""
        return self.timed_in_order(
            run_transactions,
            (begin, end, ops.arrays, self.state.arrays, self.udf),
            (np.empty(max(1, ops.max_reads), np.int64), undo_log(ops.max_txn_ops)),
            chunk,
            breakdown,
        )[1:]

    @staticmethod
    def timed_in_order(
        kernel: Callable[..., int],
        args: tuple,
        scratch: tuple,
        chunk: ChunkArrays,
        breakdown: Breakdown,
    ) -> tuple[int, int, int]:
        """``kernel(*args, *scratch, chunk.outcomes, waited)``, a kernel that runs
        transactions in order: (what it returned, the nanoseconds it took, the
        transactions that aborted), the time counted in ``breakdown`` as useful but for the
        aborts' rollbacks (``waited[ABORT_NS]``). RuntimeFailure if a distinct set ran out
        of slots."""
        waited = np.zeros(WAITED_SLOTS, np.int64)
        started = time.perf_counter_ns()
        returned = kernel(*args, *scratch, chunk.outcomes, waited)
        spent = time.perf_counter_ns() - started
        if returned == SET_FULL:
            raise RuntimeFailure(SET_FULL_MESSAGE)
        breakdown.useful += (spent - waited[ABORT_NS]) / 1e9
        breakdown.abort += waited[ABORT_NS] / 1e9
        return returned, spent, int(waited[ABORTS])

    @classmethod
    def first_walk_events(cls, config: RunConfig) -> int:
        """Events of a first chunk that executor 0 walks alone where chunks go whole to it
        (`whole_chunks`), its peers stepped aside, so that its operations are timed before
        the team decides how many executors work (`alone_next`); 0 (default): the first
        chunk goes to the whole team."""
        return 0

    def alone_next(self) -> bool:
        """Whether the next chunks may go to executor 0 alone, its peers stepping aside
        (`Member.alone`): asked of executor 0 after each chunk, where chunks go whole to
        it (`whole_chunks`); a chunk run alone is walked in order (default: never)."""
        return False

    def batches_in_step(self) -> bool:
        """Whether the team waits for one another after every punctuation batch of the
        chunk being executed (default), or only after the chunk's last: when one
        executor alone runs its batches, the others have nothing to wait for in between."""
        return True

    def finish(
        self, chunk: ChunkArrays, ops: OperationShare, first: int, end: int, breakdown: Breakdown
    ) -> None:
        """After the last batch: complete the results of transactions ``first..end-1``
        (this executor's share) in the chunk (default: nothing left to do)."""
        return None

    def warm_up(self, chunk: ChunkArrays) -> None:
        """Before the first event, once the team ran an empty ``chunk``: compile (or load
        from numba's cache) the kernels the empty chunk did not reach but a run may (a
        repair, another exploration), so that none is loaded in the middle of the run with
        the whole team waiting for it (default: nothing)."""
        return None

    def report(self) -> dict:
        """What it adds to metrics.json (executor 0's is used; default: nothing)."""
        return {}

    def decisions(self) -> dict[str, dict[str, int]]:
        """Its choices so far, counted by dimension: read after every chunk for the live
        metrics, so it must cost little (default: it makes none)."""
        return {}
