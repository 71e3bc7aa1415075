"""Executor: pre-processes chunks of events, executes their batches, post-processes.

A plain class (tested without Ray); `txstream.runtime` wraps it in a Ray actor.
Compute mode decomposes a whole chunk into operations (nothing is executed); at
each punctuation the scheduler executes that batch's operations on shared state.
"""

from __future__ import annotations

import os
from collections import deque

import numpy as np
import pyarrow as pa
from txstream import schedulers, topologies
from txstream.cluster.topology import pin_process
from txstream.config import RunConfig
from txstream.metrics import Breakdown
from txstream.schedulers._kernels import STATUS_NAMES
from txstream.schedulers.base import Results, Scheduler
from txstream.state.tables import SharedState, StateHandle
from txstream.topologies.api import EventBatch, Outputs, Topology, Transactions

MAX_PENDING_WRITES = 2
"""Chunks an executor may have in flight to the sink before it waits (back-pressure)."""


def output_schema(topology: Topology) -> pa.Schema:
    """events.parquet columns (SPEC §4)."""
    fields = [
        ("ts", pa.int64()),
        ("event_id", pa.int64()),
        ("status", pa.string()),
        ("reason", pa.string()),
    ]
    fields += [(name, pa.int64()) for name in topology.output_columns]
    return pa.schema(fields)


def process_chunk(
    topology: Topology,
    scheduler: Scheduler,
    chunk: pa.RecordBatch,
    ts0: int,
    punctuation_interval: int,
    time: Breakdown,
) -> tuple[pa.RecordBatch, int]:
    """Run a chunk (a whole number of punctuation batches); its output rows and the
    number of operations it executed."""
    layout = scheduler.state.layout
    with time.timing("useful"):
        events = EventBatch(chunk, topology, layout.sizes)
        topology.pre_process(events)
    with time.timing("construct"):
        txn = Transactions(events, layout)
        topology.state_access(events, txn)
        ops = txn.build()
    results = Results.start(events.reason, len(topology.outputs))
    for begin in range(0, events.n, punctuation_interval):
        end = min(begin + punctuation_interval, events.n)
        scheduler.execute(ops, begin, end, results, time)
    with time.timing("useful"):
        return _output_rows(topology, events, results, ts0), len(ops)


def _output_rows(
    topology: Topology, events: EventBatch, results: Results, ts0: int
) -> pa.RecordBatch:
    committed = results.status == 0
    outputs = Outputs(
        status=results.status,
        values={name: results.out_values[:, i] for i, name in enumerate(topology.outputs)},
        valid={name: results.out_set[:, i] & committed for i, name in enumerate(topology.outputs)},
    )
    extra = topology.post_process(events, outputs)
    reasons = pa.array(topology.reason_strings(), pa.string())
    reason_codes = pa.array(results.reason, pa.int32(), mask=results.reason == 0)
    columns = [
        pa.array(np.arange(ts0, ts0 + events.n, dtype=np.int64)),
        events.arrow.column("event_id").cast(pa.int64()),
        pa.DictionaryArray.from_arrays(
            pa.array(results.status, pa.int8()), pa.array(STATUS_NAMES)
        ).cast(pa.string()),
        pa.DictionaryArray.from_arrays(reason_codes, reasons).cast(pa.string()),
    ]
    for name in topology.output_columns:
        values, valid = extra[name]
        columns.append(pa.array(np.asarray(values, np.int64), pa.int64(), mask=~valid))
    return pa.RecordBatch.from_arrays(columns, schema=output_schema(topology))


class Executor:
    """One executor: its own scheduler over the shared state; sends outputs to the sink.

    With ``cpu``, every thread of the process is pinned to that core first (before any
    kernel runs, so a numba thread pool would size itself to it).
    """

    def __init__(
        self,
        config: RunConfig,
        state: StateHandle,
        sink: object | None = None,
        cpu: int | None = None,
    ):
        if cpu is not None:
            pin_process(cpu)
        self.config = config
        self.topology = topologies.get(config.topology)
        self.state = SharedState.attach(state)
        spin_ns = int(round(config.udf_cost_us * 1000))
        self.scheduler = schedulers.get(config.scheduler)(self.topology, self.state, spin_ns)
        self.sink = sink
        self.time = Breakdown()
        self.operations = 0
        self._pending: deque = deque()

    def warm_up(self, schema: pa.Schema) -> None:
        """Load every kernel (numba cache) on an empty chunk, before timing starts."""
        empty = pa.RecordBatch.from_pylist([], schema=schema)
        process_chunk(self.topology, self.scheduler, empty, 0, 1, Breakdown())
        events = EventBatch(empty, self.topology, self.state.layout.sizes)
        txn = Transactions(events, self.state.layout)
        self.topology.state_access(events, txn)
        results = Results.start(events.reason, len(self.topology.outputs))
        self.scheduler.execute(txn.build(), 0, 0, results, Breakdown())

    def process(self, chunk: pa.RecordBatch, ts0: int, arrival: np.ndarray) -> None:
        """Run a chunk and hand its rows to the sink, keeping at most a few writes in flight."""
        rows, operations = process_chunk(
            self.topology, self.scheduler, chunk, ts0, self.config.punctuation_interval, self.time
        )
        self.operations += operations
        self._pending.append(self.sink.write.remote(rows, ts0, arrival))
        if len(self._pending) > MAX_PENDING_WRITES:
            self._wait(self._pending.popleft())

    def flush(self) -> dict:
        """Wait for all writes to the sink; returns this executor's time breakdown, the
        number of operations it executed and the CPUs it runs on."""
        while self._pending:
            self._wait(self._pending.popleft())
        return {
            "breakdown_s": self.time.as_dict(),
            "operations": self.operations,
            "cpus": sorted(os.sched_getaffinity(0)),
        }

    def _wait(self, ref: object) -> None:
        import ray

        with self.time.timing("sync"):
            ray.get(ref, timeout=self.config.timeout_s)

    def close(self) -> None:
        """Detach from shared state."""
        self.state.close()
