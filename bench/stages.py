"""Nanoseconds per event in each stage of the engine's data path, one stage at a time.

The stages a serial run's events go through, driven directly in this process with the
engine's own code (no Ray, no threads, one executor, chunks of --chunk events): reading
the Parquet input, assigning ts and cutting punctuations (conform + Punctuator), the
dispatch (an executor's share as one record batch), pre-processing (EventShare +
``pre_process``), construction (``state_access``'s statements and counting their
operations), state access (a lone serial executor's kernel, which runs the statements
without building operations: `statement_kernel`), post-processing to output rows, and the
Sink (Parquet writing, latency, counts). Each stage is timed over the whole
input after one untimed pass (numba caches loaded, pages touched); the figure is the
median of --repeat passes. Results go to bench/results/stages.json (``--name`` another
file; ``--label`` names the entry, so that two checkouts' entries sit side by side).

    python bench/stages.py [--events 4000000] [--repeat 3] [--label now] [--name stages]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from common import RESULTS, lone_chunk_segment, workload_dirs, write_results
from txstream.actors.executor import _output_rows, rows_schema
from txstream.actors.punctuation import Punctuator
from txstream.actors.sink import Sink
from txstream.cluster.topology import keep_freed_memory
from txstream.config import CHUNK_EVENTS, RunConfig
from txstream.connectors.sources import ArrowSource
from txstream.engine.plan import Plan, plan
from txstream.schedulers._kernels import WAITED_SLOTS, statement_scratch
from txstream.schedulers._statement_kernels import statement_kernel
from txstream.schedulers.statements import Statements
from txstream.state.chunk import Outcomes
from txstream.state.shared import new_run_id
from txstream.state.tables import SharedState
from txstream.state.watermark import Watermark
from txstream.topologies.api import EventShare, conform_events, one_batch

STAGES = (
    "read",
    "punctuate",
    "dispatch",
    "pre_process",
    "construct",
    "state_access",
    "post_process",
    "sink",
)


def one_pass(events_file: Path, run: Plan, state: SharedState, chunk_events: int) -> dict:
    """Seconds per stage over the whole input (see module docstring)."""
    topology, layout = run.topology, run.layout
    seconds = dict.fromkeys(STAGES, 0.0)
    watermark = Watermark.create(new_run_id())
    sink = Sink(run.output, rows_schema(topology), watermark.handle)
    udf = topology.udf()
    punctuator = Punctuator(run.config.punctuation_interval, None)
    segment = None
    clock = time.perf_counter
    batches = ArrowSource(events_file).iter_batches(chunk_events)
    try:
        while True:
            t1 = clock()
            while punctuator.pending < chunk_events:  # the source reads smaller batches
                t0 = clock()
                batch = next(batches, None)
                t1 = clock()
                seconds["read"] += t1 - t0
                if batch is None:
                    break
                for piece in conform_events(batch, topology.event_schema).to_batches():
                    punctuator.add(piece, time.time())
                seconds["punctuate"] += clock() - t1
                t1 = clock()
            if not punctuator.pending:
                break
            punctuator.punctuate()
            chunk = punctuator.take(chunk_events)
            t2 = clock()
            share = one_batch(chunk.events)
            t3 = clock()
            events = EventShare(share, topology, layout.sizes)
            topology.pre_process(events)
            t4 = clock()
            txn = Statements(events, layout)
            topology.state_access(events, txn)
            txn.sizes()
            t4b = clock()
            segment = lone_chunk_segment(segment, txn, events, topology, layout, "stages")
            t5 = clock()
            segment.start_share(slice(0, events.n), events.reason)
            sizes = txn.sizes()
            waited = np.zeros(WAITED_SLOTS, np.int64)
            tables = txn.tables()
            statement_kernel(tables[0], tables[1])(
                *(0, events.n, *tables, state.arrays, udf),
                statement_scratch(sizes.arg_width, sizes.op_reads, sizes.txn_ops),
                *(segment.outcomes, waited),
            )
            t8 = clock()
            outcomes = Outcomes(*(column.copy() for column in segment.outcomes))
            rows = _output_rows(topology, events, outcomes, chunk.ts0)
            t9 = clock()
            sink.write(rows, chunk.ts0, chunk.arrival)
            t10 = clock()
            spans = [(t1, t2), (t2, t3), (t3, t4), (t4, t4b), (t5, t8), (t8, t9), (t9, t10)]
            for stage, (a, b) in zip(STAGES[1:], spans, strict=True):
                seconds[stage] += b - a
        t0 = clock()
        sink.finish()
        seconds["sink"] += clock() - t0
    finally:
        if segment is not None:
            segment.close()
        watermark.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed passes (median)")
    parser.add_argument("--chunk", type=int, default=CHUNK_EVENTS, help="events per chunk")
    parser.add_argument("--label", default="now", help="name of this entry in the results")
    parser.add_argument("--name", default="stages", help="results file name")
    args = parser.parse_args()
    keep_freed_memory()  # as every process of a team does (its transport's first step)
    config = RunConfig(topology="sl", source="arrow", progress=False)
    passes = []
    with workload_dirs(["sl"], args.events) as dirs:
        folder = dirs["sl"]
        for i in range(args.repeat + 1):
            with tempfile.TemporaryDirectory(prefix="txstream_stages_") as out:
                run = plan(config, folder / "init", Path(out) / "o", progressive=False)
                with SharedState.create(new_run_id(), run.layout, run.set_capacity) as state:
                    state.load(run.topology, run.init)
                    seconds = one_pass(folder / "events.parquet", run, state, args.chunk)
            if i:
                passes.append(seconds)
            total = sum(seconds.values())
            print(
                f"pass {i}: {total:.3f} s, {total / args.events * 1e9:.0f} ns/event"
                + (" (untimed)" if not i else "")
            )
    ns = {s: round(float(np.median([p[s] for p in passes])) / args.events * 1e9, 1) for s in STAGES}
    ns["total"] = round(sum(ns.values()), 1)
    for stage, value in ns.items():
        print(f"{stage:>13}: {value:7.1f} ns/event")
    path = RESULTS / f"{args.name}.json"
    entries = json.loads(path.read_text()).get("entries", {}) if path.exists() else {}
    entries[args.label] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "events": args.events,
        "chunk_events": args.chunk,
        "passes": args.repeat,
        "load_average": os.environ.get("TXSTREAM_BENCH_LOAD", f"{os.getloadavg()[0]:.2f}"),
        "ns_per_event": ns,
    }
    print("->", write_results(args.name, {"entries": entries}))


if __name__ == "__main__":
    main()
