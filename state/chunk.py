"""The segments the executors of a team create between them: one per chunk of events
(the chunk's operations, the arrays its scheduler declares per chunk, per-event
results) and one per run (the arrays its scheduler declares per run).

Every executor pre-processes its share of the chunk's events and copies its
operations into its part of the chunk segment; after a barrier each sees the whole
chunk as plain numpy arrays in (transaction, statement) order, with no copy. The
scheduler's arrays (versions, graphs, ...) and the per-transaction results live in
the same segment.

A segment is reused from chunk to chunk and replaced by a larger one when a chunk
does not fit; every executor decides that alike from the published counts.
Executor 0 creates each segment and unlinks its name as soon as every peer has
mapped it: the memory lives exactly as long as the last mapping, even if an executor
dies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from multiprocessing import shared_memory
from pathlib import Path
from typing import NamedTuple

import numpy as np
from txstream.state.operations import COMMITTED, REJECTED, OperationShare, Ops
from txstream.state.segments import ArraySpec, SegmentLayout
from txstream.state.shared import attach_segment, create_segment, unlink_segment


def segment_name(run_prefix: str, what: str | int) -> str:
    """Name of a segment the team creates (``what``: "run" or a chunk number)."""
    return f"{run_prefix}_team{what}"


def sweep_segments(run_prefix: str, shm_dir: str = "/dev/shm") -> None:
    """Remove team segments of a run whose creator died before unlinking them."""
    for path in Path(shm_dir).glob(segment_name(run_prefix, "*")):
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class ChunkDims:
    """The sizes a chunk segment is laid out from; every executor derives the same."""

    operations: int
    reads: int
    transactions: int
    arg_width: int
    outputs: int
    parties: int
    pools: int
    rows: int

    def words(self) -> list[int]:
        """The dims as ints (to pass them through shared memory)."""
        return list(astuple(self))

    @classmethod
    def from_words(cls, words: Sequence[int]) -> ChunkDims:
        """The dims whose `words` begin ``words``."""
        return cls(*(int(w) for w in words[: len(fields(cls))]))

    @classmethod
    def word_count(cls) -> int:
        """How many ints `words` gives."""
        return len(fields(cls))


@dataclass(frozen=True)
class RunDims:
    """The sizes a run segment is laid out from (fixed for a run)."""

    cells: int
    rows: int
    parties: int
    pools: int


def chunk_layout(dims: ChunkDims, declared: Sequence[ArraySpec]) -> SegmentLayout:
    """The chunk's operations and results, then the scheduler's ``declared`` arrays."""
    n, r, t = dims.operations, dims.reads, dims.transactions
    common = [
        *[ArraySpec(name, "int64", (n,)) for name in ("txn", "cell")],
        ArraySpec("args", "int64", (n, dims.arg_width)),
        ArraySpec("dep_ptr", "int64", (n + 1,)),
        ArraySpec("dep_cell", "int64", (r,)),
        ArraySpec("txn_ptr", "int64", (t + 1,)),
        ArraySpec("out_values", "int64", (t, dims.outputs)),
        *[ArraySpec(name, "int32", (n,)) for name in ("fun", "cond", "reason", "out")],
        ArraySpec("status_reason", "int32", (t,)),
        ArraySpec("kind", "int8", (n,)),
        ArraySpec("status", "int8", (t,)),
        ArraySpec("out_set", "bool", (t, dims.outputs)),
    ]
    return SegmentLayout([*common, *declared])


class Outcomes(NamedTuple):
    """Per-transaction results of a chunk, as kernels see them."""

    status: np.ndarray
    status_reason: np.ndarray
    out_values: np.ndarray
    out_set: np.ndarray


class TeamSegment:
    """A segment of named arrays as mapped into this process."""

    def __init__(self, shm: shared_memory.SharedMemory, capacity: SegmentLayout):
        self._shm = shm
        self.capacity = capacity
        self.arrays: dict[str, np.ndarray] = {}

    @classmethod
    def create(cls, name: str, capacity: SegmentLayout) -> TeamSegment:
        """Create a segment (executor 0)."""
        return cls(create_segment(name, capacity.nbytes), capacity)

    @classmethod
    def attach(cls, name: str, capacity: SegmentLayout) -> TeamSegment:
        """Map the segment executor 0 created."""
        return cls(attach_segment(name), capacity)

    def unlink(self) -> None:
        """Remove the name (the memory stays until every mapping is closed)."""
        unlink_segment(self._shm)

    def use(self, layout: SegmentLayout) -> None:
        """Lay the arrays out as ``layout`` (which must fit the capacity)."""
        self.arrays = layout.views(self._shm.buf, self.capacity)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    def close(self) -> None:
        """Unmap (views into the segment must not be used afterwards)."""
        self.arrays = {}
        try:
            self._shm.close()
        except BufferError:
            pass


class ChunkArrays(TeamSegment):
    """The chunk segment (see module docstring)."""

    dims: ChunkDims
    limits: tuple[int, int] | None = None
    """(most operations of a transaction, most reads of an operation) in the chunk, as
    its builders counted them; None: counted from the arrays when needed."""

    def use_chunk(
        self, dims: ChunkDims, layout: SegmentLayout, limits: tuple[int, int] | None = None
    ) -> None:
        """Lay out the next chunk, of ``dims`` (``layout`` must fit the capacity), whose
        operations have these ``limits``."""
        self.dims = dims
        self.limits = limits
        self.use(layout)

    @property
    def ops(self) -> Ops:
        """The chunk's operations as one kernel argument."""
        return Ops(*(self.arrays[name] for name in Ops._fields))

    @property
    def outcomes(self) -> Outcomes:
        """The per-transaction results as one kernel argument."""
        return Outcomes(self.status, self.status_reason, self.out_values, self.out_set)

    def start_share(self, share: slice, rejection_reason: np.ndarray) -> None:
        """Initial results of a share's transactions: rejected ones are final, all
        others committed until they abort."""
        self.status[share] = np.where(rejection_reason != 0, REJECTED, COMMITTED)
        self.status_reason[share] = rejection_reason
        self.out_values[share] = 0
        self.out_set[share] = False

    def operations(self) -> OperationShare:
        """The chunk's operations, as views."""
        return OperationShare(self.ops, *(self.limits or (None, None)))

    def share_ops(
        self,
        first_txn: int,
        transactions: int,
        first_op: int,
        operations: int,
        first_read: int,
        reads: int,
        arg_width: int,
    ) -> Ops:
        """Views of one share's part of the chunk's operations, for it to build them in
        place (`txstream.schedulers.statements.Statements.build_into`)."""
        ops = slice(first_op, first_op + operations)
        a = self.arrays
        return Ops(
            *(a[name][ops] for name in ("txn", "cell", "kind", "fun", "cond", "reason", "out")),
            args=a["args"][ops, :arg_width],
            dep_ptr=a["dep_ptr"][first_op : first_op + operations + 1],
            dep_cell=a["dep_cell"][first_read : first_read + reads],
            txn_ptr=a["txn_ptr"][first_txn : first_txn + transactions + 1],
        )
