"""Runs the engine's plain classes in this process, without Ray.

The kernels, topologies and chunking are exactly those the Executor actor runs;
only the transport is missing. Fast enough for hundreds of hypothesis examples.
"""

from __future__ import annotations

import pyarrow as pa
from txstream import schedulers, topologies
from txstream.actors.executor import output_schema, process_chunk
from txstream.metrics import Breakdown
from txstream.state.init import read_init_state
from txstream.state.shared import new_run_id
from txstream.state.tables import SharedState
from txstream.topologies.api import Layout


def run_local(
    topology: str,
    events: pa.Table,
    init: dict[str, pa.Table],
    *,
    scheduler: str = "serial",
    punctuation_interval: int = 10240,
    batches_per_chunk: int = 3,
) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Outputs and final state of ``events``, chunked as the ProgressController does."""
    topo = topologies.get(topology)
    topo.check_event_schema(events.schema)
    tables = read_init_state(topo, init)
    layout = Layout.of(topo.tables, topo.sizes_from({k: t.num_rows for k, t in tables.items()}))
    chunk = punctuation_interval * batches_per_chunk
    with SharedState.create(new_run_id(), layout, 2 * events.num_rows + 16) as state:
        state.load(topo, tables)
        sched = schedulers.get(scheduler)(topo, state, 0)
        rows = [
            process_chunk(topo, sched, batch, ts0, punctuation_interval, Breakdown())[0]
            for ts0, batch in _chunks(events, chunk)
        ]
        return pa.Table.from_batches(rows, output_schema(topo)), state.tables(topo)


def _chunks(events: pa.Table, size: int):
    for ts0 in range(0, events.num_rows, size):
        part = events.slice(ts0, size).combine_chunks().to_batches()
        if part:
            yield ts0, part[0]
