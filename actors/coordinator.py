"""Coordinator: resolves the failures of the team's transactions, for a whole run.

Schedulers that explore speculatively (tstream, morphstream) execute operations
without waiting for the outcome of the transactions they read from, recording which
operations failed. The team then pauses - once a batch is explored (lazy policy), or
as soon as an operation failed (eager policy) - and asks this actor to resolve the
fresh failures: it reads them straight from the chunk segment and marks, in one
ts-order pass, the executed operations they (transitively) make wrong
(`txstream.schedulers.team.aborts`); the executors roll back and redo exactly those.

It talks to the executors only through the team's sync block: executor 0 posts a
request, every executor waits for the answer (`txstream.schedulers.team.aborts` lists the
requests). No Ray call per chunk or batch; one call, `serve`, for the whole run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
from txstream import schedulers
from txstream.schedulers.team.aborts import MAP_SEGMENT, POLICIES, RESOLVE, resolve, warm_resolve
from txstream.state.chunk import ChunkArrays, ChunkDims, segment_name
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.sync import (
    OK,
    answer,
    posted,
    raise_for_wait,
    report_failure,
    request,
    wait_request,
)

if TYPE_CHECKING:
    from txstream.config import RunConfig


class Coordinator:
    """Serves the team's abort requests for a whole run (see module docstring).

    ``sync`` is the team's sync block (a shared-memory handle, or an array when the
    executors are threads). It serves the
    policies the run's scheduler declares, and refuses any other request.
    """

    def __init__(self, config: RunConfig, sync: ArrayHandle | np.ndarray, segment_prefix: str):
        self._shared = SharedArray.attach(sync) if isinstance(sync, ArrayHandle) else None
        self.sync = self._shared.array if self._shared else sync
        self.config = config
        self.scheduler = schedulers.get(config.scheduler)
        self.policies = self.scheduler.coordinator_policies(config)
        self.timeout_ns = int(config.timeout_s * 1e9)
        self.segment_prefix = segment_prefix
        self._stack = np.zeros(0, np.int64)
        self._chunk: ChunkArrays | None = None
        self._dims: ChunkDims | None = None
        if self.policies:  # before the run: its first repair would wait for the kernel
            tiny = ChunkDims(*([1] * ChunkDims.word_count()))
            specs = self.scheduler.chunk_layout(config, tiny).specs
            warm_resolve({spec.name: np.zeros(spec.shape, spec.dtype) for spec in specs})
        self.stats = {
            "requests": dict.fromkeys(self.policies, 0),
            "failed": 0,
            "marked": 0,
            "seconds": 0.0,
        }

    def serve(self) -> dict:
        """Answer requests until the driver asks to stop; returns what was resolved:
        requests per policy, fresh failures, operations marked for redo, and the seconds
        spent. A failure here releases the executors' waits."""
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
            self._map(args[0], ChunkDims.from_words(args[1:]))
            return 0
        if kind == RESOLVE and POLICIES[args[0]] in self.policies:
            dims = ChunkDims.from_words(args[1:])
            begin, end = args[1 + ChunkDims.word_count() : 3 + ChunkDims.word_count()]
            return self._resolve(POLICIES[args[0]], dims, begin, end)
        raise ValueError(f"coordinator: request {kind} {args[:1]} is not served for this run")

    def _map(self, seq: int, dims: ChunkDims) -> None:
        """Map the chunk segment executor 0 just created for a chunk of ``dims`` (before
        it unlinks the name)."""
        if self._chunk is not None:
            self._chunk.close()
        capacity = self.scheduler.chunk_capacity(self.config, dims)
        self._chunk = ChunkArrays.attach(segment_name(self.segment_prefix, seq), capacity)
        self._dims = None

    def _resolve(self, policy: str, dims: ChunkDims, begin: int, end: int) -> int:
        """Mark what the fresh failures of transactions ``begin..end-1`` make wrong;
        returns how many operations to redo."""
        start = time.perf_counter()
        chunk = self._chunk
        if dims != self._dims:
            chunk.use_chunk(dims, self.scheduler.chunk_layout(self.config, dims))
            self._dims = dims
            if len(self._stack) < 2 * dims.operations + dims.reads:
                self._stack = np.zeros(2 * dims.operations + dims.reads, np.int64)
        self.stats["failed"] += int(np.count_nonzero(chunk.fresh[begin:end]))
        marked = resolve(chunk, begin, end, self._stack)
        self.stats["requests"][policy] += 1
        self.stats["marked"] += marked
        self.stats["seconds"] += time.perf_counter() - start
        return marked

    def close(self) -> None:
        """Unmap the chunk segment and the sync block."""
        if self._chunk is not None:
            self._chunk.close()
            self._chunk = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
