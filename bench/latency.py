"""Push-to-output latency of a session under a steady load, query latency while ingesting,
and one-shot throughput against an earlier commit (with a figure).

For each workload (SL at C = 0 and GS at C = 10 us, tstream on 2 executors by default):

1. **One-shot throughput** of this tree and of ``--baseline`` (a commit, extracted with
   ``git archive`` into a temporary folder and imported through PYTHONPATH), measured in
   turns: ``--rounds`` rounds, each running this tree then the baseline in a fresh
   process (its own Ray; start-up and warm-up are not in the figure), median per side.
   The processing time of one punctuation batch is taken from this tree's one-shot
   metrics: its state access (``batches.state_access_ms`` p50, the acceptance's figure)
   and, for comparison, the whole pipeline's time per batch (``punctuation_interval /
   throughput``).
2. **Steady load**: a session fed from a thread at ``load`` x the one-shot throughput of
   this tree, a small Arrow table every ``--tick-ms`` (as many events as are due by then),
   for ``--seconds``, after a first push of ``--warm-up`` seconds' worth of events, flushed
   (the first non-empty chunk pays one-time costs, which would otherwise land on the first
   measured events). Another thread watches the session's ``watermark`` (outputs written,
   contract §6) and ``committed`` (outputs readable through ``outputs()``) every
   millisecond; an event's latency is the time from the ``push`` call that carried it to
   the first moment the watermark (or the committed end) is past it. Events pushed during
   the first ``--warm-up`` seconds of the steady feed are left out too (the session learns
   the team's rate from its first chunks). At the load ``--query-load``, a third thread
   queries the state every ``--query-ms`` (alternately the whole table and 16 random keys)
   and times each call.

Three latency targets are checked and reported: at 50% load, p99 push-to-output
<= 2 x (processing time of one punctuation batch) + 50 ms, query p99 <= 20 ms, and
one-shot throughput >= 95% of the baseline. JSON and PNG go to bench/results.

    python bench/latency.py [--workloads sl:0 gs:10] [--loads 0.25 0.5 0.9]
        [--seconds 8] [--rounds 3] [--baseline COMMIT] [--out bench/results/latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
QUERY_TABLE = {"sl": "accounts", "gs": "records"}
"""The table each workload's queries read."""
WORKLOAD_EVENTS = {0.0: 1_000_000, 10.0: 300_000}
"""Events per one-shot run by UDF cost (as bench/scaling.py: 1M, or 300k with a cost)."""


# ---------------------------------------------------------------- one-shot throughput
def one_shot(folder: Path, topology: str, cost: float, events: int, executors: int) -> dict:
    """One `Job.run` of the first ``events`` events of ``folder`` with whichever txstream is
    imported (this tree or the baseline's): the figures this benchmark uses."""
    import pyarrow.parquet as pq
    from txstream import Job

    table = pq.read_table(folder / "events.parquet").slice(0, events)
    metrics = (
        Job(
            topology,
            scheduler="tstream",
            executors=executors,
            udf_cost_us=cost,
            source="arrow",
            progress=False,
        )
        .run(table, folder / "init")
        .metrics
    )
    batches = metrics["batches"]
    return {
        "throughput_eps": metrics["throughput_eps"],
        "seconds": metrics["seconds"],
        "batches": batches["count"],
        "state_access_ms": batches["state_access_ms"],
        "latency_ms": metrics["latency_ms"],
        "cpu_s": metrics["cpu_s"],
        "chunks": metrics.get("chunks") if isinstance(metrics.get("chunks"), dict) else None,
        "punctuations": metrics.get("punctuations"),
    }


def _one_shot_main(args: argparse.Namespace) -> None:
    """Child process: the one-shot runs of every workload, one JSON line per run."""
    from common import bench_ray

    with bench_ray():
        for spec in args.workloads:
            topology, cost = _workload(spec)
            folder = Path(args.one_shot) / topology
            row = one_shot(folder, topology, cost, WORKLOAD_EVENTS[cost], args.executors)
            print(json.dumps({"workload": spec, **row}), flush=True)


@contextmanager
def baseline_tree(commit: str):
    """The baseline commit's tree, importable as ``txstream`` (a PYTHONPATH entry)."""
    with tempfile.TemporaryDirectory(prefix="txstream_baseline_") as tmp:
        package = Path(tmp) / "txstream"
        package.mkdir()
        archive = subprocess.run(
            ["git", "archive", commit], cwd=HERE.parent, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(package)], input=archive, check=True)
        yield tmp


def compare_one_shot(args: argparse.Namespace, data: Path, baseline_path: str) -> dict:
    """This tree against the baseline, ``args.rounds`` rounds in turns; per workload the
    runs of each side, their median and the ratio of medians."""
    runs: dict[str, dict[str, list[dict]]] = {
        w: {"this": [], "baseline": []} for w in args.workloads
    }
    for round_ in range(args.rounds):
        for side in ("this", "baseline"):
            env = dict(os.environ)
            if side == "baseline":
                env["PYTHONPATH"] = baseline_path
            command = [
                *(sys.executable, str(HERE / "latency.py"), "--one-shot", str(data)),
                *("--executors", str(args.executors), "--workloads", *args.workloads),
            ]
            done = subprocess.run(
                command, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True
            )
            if done.returncode != 0:
                raise SystemExit(f"one-shot run ({side}) failed:\n{done.stderr[-3000:]}")
            for line in done.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    runs[row.pop("workload")][side].append(row)
                    print(f"  round {round_ + 1} {side:8} {line[:120]}", flush=True)
    out = {}
    for workload, sides in runs.items():
        median = {
            s: float(np.median([r["throughput_eps"] for r in rows])) for s, rows in sides.items()
        }
        out[workload] = {
            "runs": sides,
            "throughput_eps": median,
            "ratio": round(median["this"] / median["baseline"], 3),
        }
    return out


# ---------------------------------------------------------------- steady load
class Watcher(threading.Thread):
    """Samples the session's watermark and committed end every millisecond, keeping the
    moments they changed."""

    def __init__(self, session):
        super().__init__(name="watcher", daemon=True)
        self.session = session
        self.trace: list[tuple[float, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            now = time.perf_counter()
            seen = (self.session.watermark, self.session.committed)
            if seen != last:
                self.trace.append((now, *seen))
                last = seen
            time.sleep(0.001)


class Querier(threading.Thread):
    """Queries a table every ``period_s`` (alternately all rows and 16 random keys) and
    times every call."""

    def __init__(self, session, table: str, keys: int, period_s: float):
        super().__init__(name="querier", daemon=True)
        self.session, self.table, self.keys, self.period_s = session, table, keys, period_s
        self.seconds: dict[str, list[float]] = {"all": [], "keys": []}
        self.stop = threading.Event()

    def run(self) -> None:
        rng = np.random.default_rng(0)
        n = 0
        while not self.stop.wait(self.period_s):
            kind = "all" if n % 2 == 0 else "keys"
            keys = None if kind == "all" else rng.integers(0, self.keys, 16).tolist()
            begin = time.perf_counter()
            self.session.query(self.table, keys)
            self.seconds[kind].append(time.perf_counter() - begin)
            n += 1


def feed(
    session, table, first: int, rate: float, seconds: float, tick_s: float
) -> list[tuple[float, int]]:
    """Push ``rate`` events/s for ``seconds``, one table every ``tick_s`` with the events
    due by then (cycling through ``table``, from event ``first``: the ts of the first event
    pushed); ``(time of the push call, end ts)`` per push."""
    import pyarrow as pa

    size = table.num_rows
    pushes: list[tuple[float, int]] = []
    pushed = first
    start = time.perf_counter()
    next_tick = start
    while (now := time.perf_counter()) < start + seconds:
        due = first + int(rate * (now - start)) - pushed
        if due > 0:
            at = pushed % size
            pieces = [table.slice(at, min(due, size - at))]
            if due > size - at:
                pieces.append(table.slice(0, due - (size - at)))
            session.push(pa.concat_tables(pieces))
            pushed += due
            pushes.append((now, pushed))
        next_tick += tick_s
        time.sleep(max(0.0, next_tick - time.perf_counter()))
    return pushes


def latencies(
    pushes: list[tuple[float, int]], first: int, trace: np.ndarray, column: int, from_ts: int
) -> np.ndarray:
    """Per event from ``from_ts`` on (pushes began at ts ``first``): seconds from its push
    until the traced ``column`` (1: watermark, 2: committed end) first exceeded its ts."""
    times = np.asarray([t for t, _ in pushes])
    ends = np.asarray([e for _, e in pushes], np.int64)
    starts = np.concatenate([[first], ends[:-1]])
    pushed_at = np.repeat(times, ends - starts)[from_ts - first :]
    ts = np.arange(from_ts, ends[-1], dtype=np.int64)
    reached = np.maximum.accumulate(trace[:, column].astype(np.int64))
    first_past = np.searchsorted(reached, ts, side="right")
    return trace[first_past, 0] - pushed_at


def percentiles_ms(seconds: np.ndarray | list) -> dict:
    """p50 / p99 / max in milliseconds."""
    values = np.asarray(seconds) * 1e3
    if not len(values):
        return {"p50": None, "p99": None, "max": None}
    p50, p99, top = np.percentile(values, [50, 99, 100])
    return {"p50": round(float(p50), 2), "p99": round(float(p99), 2), "max": round(float(top), 2)}


def steady(args, folder: Path, topology: str, cost: float, rate: float, query: bool) -> dict:
    """One session at ``rate`` events/s (see module docstring)."""
    import pyarrow.parquet as pq
    from txstream import Job

    events = pq.read_table(folder / "events.parquet").slice(0, WORKLOAD_EVENTS[cost])
    job = Job(
        topology,
        scheduler="tstream",
        executors=args.executors,
        udf_cost_us=cost,
        source="arrow",
        progress=False,
    )
    with job.start(folder / "init") as session:
        warm = max(1, int(rate * args.warm_up))  # the first chunk's one-time costs
        session.push(events.slice(0, warm))
        session.flush()
        watcher = Watcher(session)
        watcher.start()
        querier = None
        if query:
            keys = session.plan.layout.sizes[QUERY_TABLE[topology]]
            querier = Querier(session, QUERY_TABLE[topology], keys, args.query_ms / 1e3)
            querier.start()
        pushes = feed(session, events, warm, rate, args.seconds, args.tick_ms / 1e3)
        if querier is not None:
            querier.stop.set()
            querier.join()
        session.flush()
        time.sleep(0.01)
        watcher.stop.set()
        watcher.join()
        metrics = session.close().metrics
    trace = np.asarray(watcher.trace, np.float64)
    start = pushes[0][0]
    from_ts = next(end for t, end in pushes if t >= start + args.warm_up)
    written = latencies(pushes, warm, trace, 1, from_ts)
    committed = latencies(pushes, warm, trace, 2, from_ts)
    fed = pushes[-1][1] - warm
    row = {
        "rate_eps": round(rate, 1),
        "achieved_eps": round(fed / (pushes[-1][0] - start), 1),
        "events": fed,
        "measured_events": pushes[-1][1] - from_ts,
        "pushes": len(pushes),
        "latency_written_ms": percentiles_ms(written),
        "latency_committed_ms": percentiles_ms(committed),
        "engine_latency_ms": metrics["latency_ms"],
        "state_access_ms": metrics["batches"]["state_access_ms"],
        "batches": metrics["batches"]["count"],
        "chunks": metrics["chunks"],
        "punctuations": metrics["punctuations"],
        "cpu_s": metrics["cpu_s"],
        "seconds": metrics["seconds"],
    }
    if querier is not None:
        row["query_ms"] = {kind: percentiles_ms(s) for kind, s in querier.seconds.items()}
        row["query_ms"]["both"] = percentiles_ms(sum(querier.seconds.values(), []))
        row["queries"] = sum(len(s) for s in querier.seconds.values())
    return row


# ---------------------------------------------------------------- report
def acceptance(workload: dict) -> dict:
    """The three latency targets (module docstring) for one workload."""
    half = next(r for r in workload["loads"] if r["load"] == 0.5)
    bound = 2 * workload["batch_ms"]["state_access"] + 50
    p99 = half["latency_written_ms"]["p99"]
    query_p99 = half["query_ms"]["both"]["p99"]
    ratio = workload["one_shot"]["ratio"]
    return {
        "latency_p99_ms": p99,
        "latency_bound_ms": round(bound, 1),
        "latency_met": p99 <= bound,
        "latency_bound_pipeline_ms": round(2 * workload["batch_ms"]["pipeline"] + 50, 1),
        "committed_p99_ms": half["latency_committed_ms"]["p99"],
        "query_p99_ms": query_p99,
        "query_met": query_p99 <= 20,
        "throughput_ratio": ratio,
        "throughput_met": ratio >= 0.95,
    }


def plot(workloads: dict, path: Path) -> None:
    """Latency (written and committed, p50 and p99) against load, one panel per workload,
    with the latency bound of the acceptance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(workloads), figsize=(6.5 * len(workloads), 4.5), squeeze=False)
    for ax, (name, w) in zip(axes[0], workloads.items(), strict=True):
        loads = [r["load"] for r in w["loads"]]
        for key, label, style in (
            ("latency_written_ms", "written", "-"),
            ("latency_committed_ms", "committed", ":"),
        ):
            for q, marker in (("p50", "o"), ("p99", "s")):
                ax.plot(
                    loads, [r[key][q] for r in w["loads"]], style + marker, label=f"{label} {q}"
                )
        ax.axhline(
            w["acceptance"]["latency_bound_ms"],
            color="grey",
            lw=0.8,
            ls="--",
            label="bound at 50% (2 x batch + 50 ms)",
        )
        best = w["one_shot"]["throughput_eps"]["this"]
        ax.set(
            xlabel="load (share of one-shot throughput)",
            ylabel="push-to-output ms",
            yscale="log",
            title=f"{name}: one-shot {best:,.0f} ev/s",
        )
        ax.set_xticks(loads)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _workload(spec: str) -> tuple[str, float]:
    topology, cost = spec.split(":")
    return topology, float(cost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", nargs="+", default=["sl:0", "gs:10"], help="topology:udf_cost_us"
    )
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--loads", nargs="+", type=float, default=[0.25, 0.5, 0.9])
    parser.add_argument("--seconds", type=float, default=8.0, help="feeding time per load")
    parser.add_argument("--warm-up", type=float, default=1.0, help="seconds not measured")
    parser.add_argument("--tick-ms", type=float, default=10.0, help="time between pushes")
    parser.add_argument("--query-load", type=float, default=0.5)
    parser.add_argument("--query-ms", type=float, default=20.0, help="time between queries")
    parser.add_argument("--rounds", type=int, default=3, help="one-shot rounds (in turns)")
    parser.add_argument("--baseline", default="d089013", help="commit to compare with")
    parser.add_argument("--out", type=Path, default=RESULTS / "latency.json")
    parser.add_argument("--one-shot", help=argparse.SUPPRESS)  # child process mode
    args = parser.parse_args()
    if args.one_shot:
        _one_shot_main(args)
        return
    for spec in args.workloads:
        if _workload(spec)[0] not in QUERY_TABLE:
            parser.error(f"workload {spec}: topology must be one of {', '.join(QUERY_TABLE)}")
    if 0.5 not in args.loads:
        parser.error("--loads must include 0.5 (the acceptance is at 50% load)")
    from common import bench_ray, workload_dirs, write_results
    from txstream.config import RunConfig

    topologies = list(dict.fromkeys(_workload(s)[0] for s in args.workloads))
    load_before = os.getloadavg()
    with workload_dirs(topologies, max(WORKLOAD_EVENTS.values())) as dirs:
        data = next(iter(dirs.values())).parent
        print("one-shot throughput, this tree against", args.baseline, flush=True)
        with baseline_tree(args.baseline) as baseline_path:
            one_shots = compare_one_shot(args, data, baseline_path)
        workloads = {}
        with bench_ray():
            for spec in args.workloads:
                topology, cost = _workload(spec)
                shot = one_shots[spec]
                best = shot["throughput_eps"]["this"]
                this_runs = shot["runs"]["this"]
                state_ms = float(np.median([r["state_access_ms"]["p50"] for r in this_runs]))
                interval = RunConfig().punctuation_interval
                w = {
                    "topology": topology,
                    "udf_cost_us": cost,
                    "one_shot": shot,
                    "batch_ms": {
                        "state_access": round(state_ms, 2),
                        "pipeline": round(interval / best * 1e3, 2),
                    },
                    "loads": [],
                }
                for load in args.loads:
                    row = steady(
                        args,
                        dirs[topology],
                        topology,
                        cost,
                        load * best,
                        query=load == args.query_load,
                    )
                    row["load"] = load
                    row["uptime_load"] = os.getloadavg()[0]
                    w["loads"].append(row)
                    print(f"{spec} at {load:.0%}: {json.dumps(row)}", flush=True)
                w["acceptance"] = acceptance(w)
                print(f"{spec} acceptance: {json.dumps(w['acceptance'])}", flush=True)
                workloads[spec] = w
    results = {
        "executors": args.executors,
        "baseline": args.baseline,
        "seconds_per_load": args.seconds,
        "tick_ms": args.tick_ms,
        "host_load": {"before": load_before, "after": os.getloadavg()},
        "workloads": workloads,
    }
    path = write_results(args.out.stem, results, args.out.parent)
    plot(workloads, path.with_suffix(".png"))
    print("->", path, "and", path.with_suffix(".png"))


if __name__ == "__main__":
    main()
