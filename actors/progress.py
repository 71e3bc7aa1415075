"""ProgressController: assigns ts, cuts the stream into chunks, feeds the team.

ts is the input position. Events are handed over in chunks of whole punctuation
batches (one Ray call per executor per chunk, never per event or per batch). Every
executor gets a contiguous share of every chunk to pre-process; the team executes
the chunk together, synchronising in shared memory. A bounded number of chunks is
in flight: back-pressure on the source.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import pyarrow as pa
from txstream.cluster.topology import yield_to_executors
from txstream.config import RunConfig
from txstream.errors import PeerFailed
from txstream.sources import Source

CHUNKS_IN_FLIGHT = 2


def share_bounds(events: int, parties: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal shares ``(first, end)`` of a chunk, in rank order."""
    cuts = [events * rank // parties for rank in range(parties + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class ProgressController:
    """Reads the source in order and dispatches every chunk to the whole team."""

    def __init__(self, config: RunConfig, source: Source, executors: list):
        yield_to_executors()
        self.config = config
        self.source = source
        self.executors = executors

    def run(self) -> dict:
        """Stream the whole source through the executors; returns what each reports."""
        import ray

        cpu_start = time.process_time()
        chunk_events = self.config.chunk_events
        pending: list[pa.RecordBatch] = []
        arrivals: list[np.ndarray] = []
        buffered = 0
        ts = 0
        seq = 0
        in_flight: deque = deque()

        def dispatch(n: int) -> None:
            nonlocal pending, arrivals, buffered, ts, seq
            table = pa.Table.from_batches(pending).combine_chunks()
            arrival = np.concatenate(arrivals)
            chunk = table.slice(0, n)
            rest = table.slice(n)
            pending = rest.to_batches() if rest.num_rows else []
            arrivals = [arrival[n:]] if rest.num_rows else []
            buffered -= n
            calls = []
            for executor, (first, end) in zip(
                self.executors, share_bounds(n, len(self.executors)), strict=True
            ):
                share = _record_batch(chunk.slice(first, end - first))
                calls.append(executor.process.remote(share, seq, first, n, ts, arrival[first:end]))
            in_flight.append(calls)
            ts += n
            seq += 1
            while len(in_flight) > CHUNKS_IN_FLIGHT:
                self._wait(in_flight.popleft())

        for batch in self.source.iter_batches(chunk_events):
            if batch.num_rows == 0:
                continue
            pending.append(batch)
            arrivals.append(np.full(batch.num_rows, time.time()))
            buffered += batch.num_rows
            while buffered >= chunk_events:
                dispatch(chunk_events)
        if buffered:
            dispatch(buffered)
        for calls in in_flight:
            self._wait(calls)
        executors = ray.get(
            [e.flush.remote() for e in self.executors], timeout=self.config.timeout_s
        )
        cpu_s = round(time.process_time() - cpu_start, 3)
        return {"events": ts, "executors": executors, "cpu_s": cpu_s}

    def _wait(self, calls: list) -> None:
        """Wait for one chunk's calls; if one failed, raise the root cause (not the
        peers' `PeerFailed`, which they raise once they learn of it). Calls that ended
        are looked at first: a dead executor cannot tell its peers, which wait for it
        until the driver stops them."""
        import ray

        try:
            ray.get(calls, timeout=self.config.timeout_s)
        except ray.exceptions.RayError as first:
            ended, _ = ray.wait(calls, num_returns=len(calls), timeout=0)
            for call in [*ended, *(c for c in calls if c not in ended)]:
                try:
                    ray.get(call, timeout=self.config.timeout_s)
                except ray.exceptions.RayTaskError as exc:
                    if not isinstance(exc.cause, PeerFailed):
                        raise exc from None
                except ray.exceptions.RayError as exc:
                    raise exc from None
            raise first


def _record_batch(table: pa.Table) -> pa.RecordBatch:
    """One record batch of ``table`` (a copy only if it spans several)."""
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
