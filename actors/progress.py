"""ProgressController: assigns ts, cuts the stream into punctuation batches, feeds executors.

ts is the input position. Events are handed over in chunks of whole punctuation
batches (one Ray call per chunk, not per event or per batch), with a bounded
number of chunks in flight: back-pressure on the source. Each chunk runs on one
executor over the shared state, so with several executors a chunk is dispatched
only after the previous one finished: chunks never overlap, and the result stays
that of ts order (the next chunk is read while the previous one runs).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import pyarrow as pa
from txstream.config import RunConfig
from txstream.sources import Source

IN_FLIGHT_PER_EXECUTOR = 2


class ProgressController:
    """Reads the source in order and dispatches chunks round-robin to executors."""

    def __init__(self, config: RunConfig, source: Source, executors: list):
        self.config = config
        self.source = source
        self.executors = executors

    def run(self) -> dict:
        """Stream the whole source through the executors; returns what each reports."""
        import ray

        chunk_events = self.config.chunk_events
        pending: list[pa.RecordBatch] = []
        arrivals: list[np.ndarray] = []
        buffered = 0
        ts = 0
        in_flight: deque = deque()
        limit = IN_FLIGHT_PER_EXECUTOR * len(self.executors)

        def dispatch(n: int) -> None:
            nonlocal pending, arrivals, buffered, ts
            table = pa.Table.from_batches(pending).combine_chunks()
            arrival = np.concatenate(arrivals)
            chunk = table.slice(0, n).to_batches()
            rows = chunk[0] if chunk else pa.RecordBatch.from_pylist([], schema=table.schema)
            rest = table.slice(n)
            pending = rest.to_batches() if rest.num_rows else []
            arrivals = [arrival[n:]] if rest.num_rows else []
            buffered -= n
            executor = self.executors[(ts // chunk_events) % len(self.executors)]
            if len(self.executors) > 1:
                ray.get(list(in_flight), timeout=self.config.timeout_s)
                in_flight.clear()
            in_flight.append(executor.process.remote(rows, ts, arrival[:n]))
            ts += n
            while len(in_flight) >= limit:
                ray.get(in_flight.popleft(), timeout=self.config.timeout_s)

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
        ray.get(list(in_flight), timeout=self.config.timeout_s)
        executors = ray.get(
            [e.flush.remote() for e in self.executors], timeout=self.config.timeout_s
        )
        return {"events": ts, "executors": executors}
