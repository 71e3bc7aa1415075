"""The operations of a chunk, and what executors record about them, in one segment.

Every executor pre-processes its share of the chunk's events and copies its
operations into its part of this segment; after a barrier each sees the whole
chunk as plain numpy arrays in (transaction, statement) order, with no copy. The
same segment holds the per-operation versions and per-transaction results the
executors write while they execute the chunk together.

The segment is reused from chunk to chunk (fresh pages would cost a page fault
each) and replaced by a larger one when a chunk does not fit; every executor
decides that alike from the published counts. Executor 0 creates each segment and
unlinks its name as soon as every peer has mapped it: the memory lives exactly as
long as the last mapping, even if an executor dies.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
from txstream.schedulers._kernels import COMMITTED, REJECTED
from txstream.state.shared import attach_segment, create_segment, unlink_segment
from txstream.topologies.api import OperationBatch

GROWTH = 1.5
"""A new segment has room for this many times the chunk that did not fit."""
ALIGN = 64


def segment_name(run_prefix: str, seq: int | str) -> str:
    """Name of the segment of chunk ``seq`` of a run."""
    return f"{run_prefix}_chunk{seq}"


def sweep_segments(run_prefix: str, shm_dir: str = "/dev/shm") -> None:
    """Remove chunk segments of a run whose creator died before unlinking them."""
    for path in Path(shm_dir).glob(segment_name(run_prefix, "*")):
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class ChunkShape:
    """Sizes that fix the segment's layout; every executor derives the same."""

    operations: int
    reads: int
    transactions: int
    arg_width: int
    outputs: int
    pools: int
    keys: int

    WORDS = 7
    """How many ints `words` gives."""

    def words(self) -> list[int]:
        """The shape as ints (to pass it through shared memory)."""
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_words(cls, words: list[int]) -> ChunkShape:
        """The shape whose `words` begin ``words``."""
        return cls(*words[: cls.WORDS])

    def arrays(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of every array in the segment, in layout order."""
        n, r, t = self.operations, self.reads, self.transactions
        per_op = ["txn", "cell", "owner", "chain_prev", "before", "after", "result", "slot"]
        per_op += ["tails"]
        per_op += ["claims", "claim_ops"]
        return [
            *[(name, "int64", (n,)) for name in per_op],
            ("args", "int64", (n, self.arg_width)),
            ("dep_ptr", "int64", (n + 1,)),
            ("dep_cell", "int64", (r,)),
            ("dep_prev", "int64", (r,)),
            ("dep_initial", "int64", (r,)),
            ("txn_ptr", "int64", (t + 1,)),
            ("out_values", "int64", (t, self.outputs)),
            ("last_cond", "int64", (t,)),
            ("pool_ptr", "int64", (self.pools + 1,)),
            ("key_owner", "int64", (self.keys if self.pools else 0,)),
            ("meta", "int64", (8,)),
            *[(name, "int32", (n,)) for name in ("fun", "cond", "reason", "out")],
            ("status_reason", "int32", (t,)),
            ("kind", "int8", (n,)),
            ("ok", "int8", (n,)),
            ("failed", "int8", (t,)),
            ("affected", "int8", (t,)),
            ("status", "int8", (t,)),
            ("out_set", "bool", (t, self.outputs)),
        ]

    def fits(self, capacity: ChunkShape) -> bool:
        """Whether every array of this shape fits the arrays of ``capacity``."""
        return all(
            int(np.prod(mine)) <= int(np.prod(room))
            for (_, _, mine), (_, _, room) in zip(self.arrays(), capacity.arrays(), strict=True)
        )

    def grown(self) -> ChunkShape:
        """A capacity with room to spare beyond this shape."""
        return ChunkShape(**{f.name: int(getattr(self, f.name) * GROWTH) + 1 for f in fields(self)})

    def nbytes(self) -> int:
        """Bytes of a segment with this capacity."""
        return self._offsets()[-1]

    def _offsets(self) -> list[int]:
        offsets = [0]
        for _, dtype, shape in self.arrays():
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            offsets.append(offsets[-1] + -(-size // ALIGN) * ALIGN)
        return offsets

    def views(self, buffer: memoryview, capacity: ChunkShape) -> dict[str, np.ndarray]:
        """The arrays of this shape in a segment laid out for ``capacity`` (each array a
        C-contiguous prefix of its region)."""
        return {
            name: np.ndarray(shape, dtype, buffer=buffer, offset=offset)
            for (name, dtype, shape), offset in zip(
                self.arrays(), capacity._offsets(), strict=False
            )
        }


class ChunkArrays:
    """The chunk segment as mapped into this process (see module docstring)."""

    def __init__(self, shm: shared_memory.SharedMemory, capacity: ChunkShape):
        self._shm = shm
        self.capacity = capacity
        self.shape = capacity
        self.arrays: dict[str, np.ndarray] = {}

    @classmethod
    def create(cls, name: str, capacity: ChunkShape) -> ChunkArrays:
        """Create a segment (executor 0)."""
        return cls(create_segment(name, capacity.nbytes()), capacity)

    @classmethod
    def attach(cls, name: str, capacity: ChunkShape) -> ChunkArrays:
        """Map the segment executor 0 created."""
        return cls(attach_segment(name), capacity)

    def unlink(self) -> None:
        """Remove the name (the memory stays until every mapping is closed)."""
        unlink_segment(self._shm)

    def use(self, shape: ChunkShape) -> None:
        """Lay out the next chunk (it must fit)."""
        self.shape = shape
        self.arrays = shape.views(self._shm.buf, self.capacity)
        self.__dict__.update(self.arrays)

    def start_share(self, share: slice, rejection_reason: np.ndarray) -> None:
        """Initial results of a share's transactions: rejected ones are final, all
        others committed until they abort."""
        self.status[share] = np.where(rejection_reason != 0, REJECTED, COMMITTED)
        self.status_reason[share] = rejection_reason
        self.failed[share] = 0
        self.affected[share] = 0
        self.out_values[share] = 0
        self.out_set[share] = False

    def operations(self) -> OperationBatch:
        """The chunk's operations, as views."""
        a = self.arrays
        return OperationBatch(
            txn=a["txn"], cell=a["cell"], kind=a["kind"], fun=a["fun"], cond=a["cond"],
            reason=a["reason"], out=a["out"], args=a["args"], dep_ptr=a["dep_ptr"],
            dep_cell=a["dep_cell"], txn_ptr=a["txn_ptr"],
            max_txn_ops=int(np.diff(a["txn_ptr"]).max(initial=0)),
            max_reads=int(np.diff(a["dep_ptr"]).max(initial=0)),
        )  # fmt: skip

    def copy_in(self, ops: OperationBatch, first_txn: int, first_op: int, first_read: int) -> None:
        """Copy one share's operations to their place (indices made chunk-global)."""
        n, r, t = len(ops), len(ops.dep_cell), len(ops.txn_ptr) - 1
        ops_range, reads_range = slice(first_op, first_op + n), slice(first_read, first_read + r)
        a = self.arrays
        a["txn"][ops_range] = ops.txn + first_txn
        a["cell"][ops_range] = ops.cell
        for name in ("kind", "fun", "cond", "reason", "out"):
            a[name][ops_range] = getattr(ops, name)
        a["args"][ops_range, : ops.args.shape[1]] = ops.args
        a["dep_ptr"][first_op : first_op + n + 1] = ops.dep_ptr + first_read
        a["dep_cell"][reads_range] = ops.dep_cell
        a["txn_ptr"][first_txn : first_txn + t + 1] = ops.txn_ptr + first_op

    def close(self) -> None:
        """Unmap (views into the segment must not be used afterwards)."""
        for name in self.arrays:
            del self.__dict__[name]
        self.arrays = {}
        try:
            self._shm.close()
        except BufferError:
            pass
