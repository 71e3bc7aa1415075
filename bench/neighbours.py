"""What a busy other core costs this one: the serial kernel's nanoseconds per event with the
second CPU idle, running a spinning process, or decoding Parquet as a ProgressController does.

The SL events (4M generated, or the peers' with ``PEERS_DIR``) are read, cut into chunks
and punctuation batches and pre-processed once, as a lone serial executor gets them;
then each pass runs the statements' kernel over every batch (the state loaded afresh), pinned to
CPU 1, while CPU 0 is idle, spins (``while True: pass``) or reads the events' Parquet file
in a loop. Modes alternate within each round, so that the machine's drift falls on all of
them alike. A team of two, or a serial run and its feeders, always has both CPUs busy: the
figure beside a neighbour is what a kernel costs there.

    python bench/neighbours.py [--rounds 5] [--events 4000000]
        -> bench/results/neighbours.json and .png
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from common import RESULTS, lone_chunk_segment, workload_dirs, write_results
from txstream.actors.punctuation import Punctuator
from txstream.config import CHUNK_EVENTS, RunConfig
from txstream.connectors.sources import ArrowSource
from txstream.engine.plan import Plan, plan
from txstream.schedulers._kernels import WAITED_SLOTS, statement_scratch
from txstream.schedulers._statement_kernels import statement_kernel
from txstream.schedulers.statements import Statements
from txstream.state.shared import new_run_id
from txstream.state.tables import SharedState
from txstream.topologies.api import EventShare, conform_events, one_batch

NEIGHBOURS = {
    "idle": None,
    "spinning": "while True: pass",
    "decoding Parquet": (
        "import sys, pyarrow.parquet as pq\n"
        "while True:\n"
        "    f = pq.ParquetFile(sys.argv[1], read_dictionary=['kind'], pre_buffer=False)\n"
        "    for _ in f.iter_batches(batch_size=16384, use_threads=False): pass"
    ),
}
KERNEL_CPU, NEIGHBOUR_CPU = 1, 0


def prepared_chunks(events: Path, run: Plan) -> list[tuple[EventShare, Statements, np.ndarray]]:
    """The input as a lone serial executor gets it: chunks of `CHUNK_EVENTS` (their
    punctuation batches' ends), pre-processed, their statements made."""
    topology, layout = run.topology, run.layout
    punctuator = Punctuator(run.config.punctuation_interval, None)
    chunks = []
    batches = ArrowSource(events).iter_batches(CHUNK_EVENTS)
    while True:
        while punctuator.pending < CHUNK_EVENTS and (batch := next(batches, None)) is not None:
            for piece in conform_events(batch, topology.event_schema).to_batches():
                punctuator.add(piece, time.time())
        if not punctuator.pending:
            return chunks
        punctuator.punctuate()
        chunk = punctuator.take(CHUNK_EVENTS)
        share = EventShare(one_batch(chunk.events), topology, layout.sizes)
        topology.pre_process(share)
        txn = Statements(share, layout)
        topology.state_access(share, txn)
        chunks.append((share, txn, chunk.batch_ends))


def kernel_pass(chunks: list, run: Plan) -> float:
    """Nanoseconds per event of the statements' kernel over every batch, on a fresh state."""
    topology, layout = run.topology, run.layout
    udf = topology.udf()
    spent, events, segment = 0, 0, None
    with SharedState.create(new_run_id(), layout, run.set_capacity) as state:
        state.load(topology, run.init)
        try:
            for share, txn, ends in chunks:
                sizes = txn.sizes()
                segment = lone_chunk_segment(segment, txn, share, topology, layout, "neighbours")
                segment.start_share(slice(0, share.n), share.reason)
                scratch = statement_scratch(sizes.arg_width, sizes.op_reads, sizes.txn_ops)
                tables, begin = txn.tables(), 0
                kernel = statement_kernel(tables[0], tables[1])
                for end in ends:
                    waited = np.zeros(WAITED_SLOTS, np.int64)
                    started = time.perf_counter_ns()
                    kernel(
                        begin, int(end), *tables, state.arrays, udf, scratch,
                        segment.outcomes, waited,
                    )  # fmt: skip
                    spent += time.perf_counter_ns() - started
                    events += int(end) - begin
                    begin = int(end)
        finally:
            if segment is not None:
                segment.close()
    return spent / events


@contextmanager
def neighbour(code: str | None, events: Path):
    """``code`` running in a process of its own on `NEIGHBOUR_CPU` (none if None)."""
    if code is None:
        yield
        return
    process = subprocess.Popen([sys.executable, "-c", code, str(events)])
    try:
        os.sched_setaffinity(process.pid, {NEIGHBOUR_CPU})
        time.sleep(0.5)  # started, imports done
        yield
    finally:
        process.kill()
        process.wait()


def plot(figures: dict[str, list[float]], path: Path) -> None:
    """Each mode's passes, ns per event."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, values in enumerate(figures.values()):
        ax.scatter(values, [i] * len(values), color="#4477aa")
        ax.plot([statistics.median(values)] * 2, [i - 0.3, i + 0.3], color="black")
    ax.set_yticks(range(len(figures)), [f"CPU 0 {m}" for m in figures])
    ax.set_xlabel("serial kernel on CPU 1, ns per event (bar: median)")
    ax.set_xlim(0, max(max(v) for v in figures.values()) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--name", default="neighbours", help="results file name")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("neighbours: needs two CPUs")
    os.sched_setaffinity(0, {KERNEL_CPU})
    peers = os.environ.get("PEERS_DIR")
    given = Path(peers) / f"tx_0.2_{args.events}" if peers else None
    with tempfile.TemporaryDirectory(prefix="txstream_neighbours_") as out:
        with workload_dirs([] if given else ["sl"], args.events) as dirs:
            folder = given or dirs["sl"]
            config = RunConfig(topology="sl", source="arrow", progress=False)
            run = plan(config, folder / "init", Path(out) / "o", progressive=False)
            chunks = prepared_chunks(folder / "events.parquet", run)
            kernel_pass(chunks, run)  # numba's caches loaded, pages touched
            figures: dict[str, list[float]] = {mode: [] for mode in NEIGHBOURS}
            for round_ in range(args.rounds):
                for mode, code in NEIGHBOURS.items():
                    with neighbour(code, folder / "events.parquet"):
                        figures[mode].append(round(kernel_pass(chunks, run), 1))
                    print(f"round {round_ + 1}, CPU 0 {mode}: {figures[mode][-1]} ns/event")
    medians = {mode: statistics.median(values) for mode, values in figures.items()}
    for mode, value in medians.items():
        print(f"{mode:>17}: median {value:.1f} ns/event, x{value / medians['idle']:.2f}")
    results = {
        "events": args.events,
        "input": "peers" if given else "generated (θ 0.2)",
        "rounds": args.rounds,
        "ns_per_event": figures,
        "median_vs_idle": {m: round(v / medians["idle"], 3) for m, v in medians.items()},
    }
    print("->", write_results(args.name, results))
    plot(figures, RESULTS / f"{args.name}.png")


if __name__ == "__main__":
    main()
