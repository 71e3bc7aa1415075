"""Coordinator: collects each batch's failed transactions and drives the abort protocol.

TStream handles aborts lazily (MorphStream §4.3.2): the executors explore a whole
punctuation batch without waiting for any transaction's outcome, recording which
operations failed; at the punctuation the aborts are handled together. This actor is
where that happens, once per batch for the whole team: it reads the batch's failures
straight from the chunk segment, marks the transactions that saw or built on an
aborted write (`txstream.schedulers._chains.find_affected`), and rewinds the
executors' progress so that they roll back and redo exactly those. MorphStream's
eager protocol will be another policy of this actor.

It talks to the executors only through the team's sync block: executor 0 posts a
request, every executor waits for the answer. MAP_SEGMENT ``[seq, *capacity]``: map
chunk ``seq``'s new segment; RESOLVE_BATCH ``[*shape, begin, end]``: resolve the
explored transactions ``begin..end-1`` (shapes as `ChunkShape.words`). No Ray call
per chunk or batch; one call, `serve`, for the whole run.
"""

from __future__ import annotations

import time

import numpy as np
from txstream.config import RunConfig
from txstream.schedulers._chains import find_affected
from txstream.state.chunk import ChunkArrays, ChunkShape, segment_name
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.sync import (
    MAP_SEGMENT,
    OK,
    RESOLVE_BATCH,
    answer,
    posted,
    progress_slot,
    publish,
    raise_for_wait,
    report_failure,
    request,
    wait_request,
)


class Coordinator:
    """Serves the team's abort requests for a whole run (see module docstring).

    ``sync`` is the team's sync block (a shared-memory handle, or an array when the
    executors are threads); ``cells`` the number of state cells.
    """

    def __init__(
        self, config: RunConfig, sync: ArrayHandle | np.ndarray, segment_prefix: str, cells: int
    ):
        self._shared = SharedArray.attach(sync) if isinstance(sync, ArrayHandle) else None
        self.sync = self._shared.array if self._shared else sync
        self.executors = config.executors
        self.timeout_ns = int(config.timeout_s * 1e9)
        self.segment_prefix = segment_prefix
        self._dirty = np.zeros(cells, np.int8)
        self._chunk: ChunkArrays | None = None
        self._shape: ChunkShape | None = None
        self.stats = {"batches": 0, "failed": 0, "affected": 0, "seconds": 0.0}

    def serve(self) -> dict:
        """Answer requests until the driver asks to stop; returns what was resolved:
        batches with failures, their failed and affected (redone) transactions, and the
        seconds spent. A failure here releases the executors' waits."""
        try:
            answered = 0
            while True:
                why = wait_request(self.sync, answered)
                if why != OK:
                    raise_for_wait(why, self.timeout_ns)
                if posted(self.sync) == answered:  # then the driver asked to stop
                    break
                kind, args = request(self.sync)
                answered += 1
                answer(self.sync, answered, self._handle(kind, args))
            return {**self.stats, "seconds": round(self.stats["seconds"], 6)}
        except BaseException:
            report_failure(self.sync)
            raise
        finally:
            self.close()

    def _handle(self, kind: int, args: list[int]) -> int:
        if kind == MAP_SEGMENT:
            self._map(args[0], ChunkShape.from_words(args[1:]))
            return 0
        if kind == RESOLVE_BATCH:
            shape = ChunkShape.from_words(args)
            begin, end = args[ChunkShape.WORDS : ChunkShape.WORDS + 2]
            return self._resolve(shape, begin, end)
        raise ValueError(f"unknown coordinator request {kind}")

    def _map(self, seq: int, capacity: ChunkShape) -> None:
        """Map the chunk segment executor 0 just created (before it unlinks the name)."""
        if self._chunk is not None:
            self._chunk.close()
        self._chunk = ChunkArrays.attach(segment_name(self.segment_prefix, seq), capacity)
        self._shape = None

    def _resolve(self, shape: ChunkShape, begin: int, end: int) -> int:
        """Mark the affected transactions of the explored batch ``begin..end-1`` and
        rewind every executor to the batch's first operation; returns how many."""
        start = time.perf_counter()
        chunk = self._chunk
        if shape != self._shape:
            chunk.use(shape)
            self._shape = shape
        failed = int(np.count_nonzero(chunk.failed[begin:end]))
        affected = find_affected(
            begin, end, chunk.txn_ptr, chunk.cell, chunk.dep_ptr, chunk.dep_cell, chunk.before,
            chunk.after, chunk.slot, chunk.failed, self._dirty, chunk.affected,
        )  # fmt: skip
        if affected:  # the redo waits on progress from the batch's start
            for executor in range(self.executors):
                publish(self.sync, progress_slot(executor), int(chunk.txn_ptr[begin]))
        self.stats["batches"] += 1
        self.stats["failed"] += failed
        self.stats["affected"] += affected
        self.stats["seconds"] += time.perf_counter() - start
        return affected

    def close(self) -> None:
        """Unmap the chunk segment and the sync block."""
        if self._chunk is not None:
            self._chunk.close()
            self._chunk = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
