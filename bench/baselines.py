"""The baselines against TStream and MorphStream in one engine (TStream ICDE'20 Fig. 8-9,
MorphStream §6.2), on this host.

serial, tstream, morphstream (auto), lock, mvlk, sstore and nolock on SL, GS, OB and TP
at 1 and 2 executors (serial: 1; it runs state access on one executor whatever the
team), UDF cost C in {0, 10} us and Zipf theta in {0.2, 0.8} (1% aborts, punctuation
every 10240 events). Runs at C = 0 use --events events, at C = 10 the first
--costly-events of them. Every ratio divides by serial on the same workload, measured
in the same invocation just before; each figure is the median of --repeat runs (this
host's 2 cores are shared with other tenants). For nolock, the distance from serial's results: the
share of state cells and of event statuses that differ.

``--engine threads`` (default) runs the whole engine as threads of this process
(`ThreadTransport`: the same ProgressController, executors, Coordinator and Sink, no Ray):
a Ray run also costs ~10 s of actor start-up, which would take the whole matrix past 40
minutes on this 2-core host.
``--engine ray`` measures through Job (the figures then exclude start-up).

Results: bench/results/baselines.{json,png}.

    python bench/baselines.py [--engine threads|ray] [--events 100000]
        [--costly-events 10000] [--repeat 3] [--topologies sl gs ob tp] [--schedulers ...]
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from common import RESULTS, bench_ray, write_results
from txstream import Job
from txstream.topologies.generators import WorkloadSpec, generate

SCHEDULERS = ("serial", "tstream", "morphstream", "lock", "mvlk", "sstore", "nolock")
ACTIVITIES = ("useful", "sync", "lock", "construct", "explore", "abort")
INTERVAL = 10240


def run(
    engine: str,
    topology: str,
    events: pa.Table,
    init: dict,
    scheduler: str,
    executors: int,
    cost: float,
) -> tuple[dict, tuple]:
    """Events/s and time breakdown (summed over executors) of one configuration, and its
    (events, state)."""
    result = Job(
        topology,
        transport=engine,
        scheduler=scheduler,
        executors=executors,
        udf_cost_us=cost,
        punctuation_interval=INTERVAL,
        source="arrow",
        progress=False,
        timeout_s=600,
    ).run(events, init)
    out = (result.events, result.state)
    seconds = result.metrics["seconds"]
    per_executor = result.metrics["breakdown_per_executor_s"]
    summed = {k: round(sum(b[k] for b in per_executor), 4) for k in ACTIVITIES}
    return {
        "throughput_eps": round(events.num_rows / seconds),
        "seconds": round(seconds, 4),
        "breakdown_s": summed,
    }, out


def distance(got: tuple, want: tuple) -> dict:
    """Shares of state cells and of event statuses that differ from ``want``'s."""
    cells = differing = 0
    for name, table in want[1].items():
        for column in table.column_names[1:]:
            cells += table.num_rows
            differing += pc.sum(pc.not_equal(got[1][name][column], table[column])).as_py() or 0
    statuses = pc.sum(pc.not_equal(got[0]["status"], want[0]["status"])).as_py() or 0
    return {
        "state_cells_differing": round(differing / max(1, cells), 6),
        "statuses_differing": round(statuses / max(1, want[0].num_rows), 6),
    }


def plot(rows: list[dict], path: Path) -> None:
    """Top: events/s per scheduler at 2 executors, one panel per (C, theta), grouped by
    topology (TStream Fig. 8); bottom: the time breakdown of each run at 2 executors
    (Fig. 9), stacked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["udf_cost_us"], r["theta"]) for r in rows})
    topologies = list(dict.fromkeys(r["topology"] for r in rows))
    schedulers = list(dict.fromkeys(r["scheduler"] for r in rows))
    fig, axes = plt.subplots(2, len(cells), figsize=(6 * len(cells), 10), squeeze=False)
    width = 0.8 / len(schedulers)
    for col, (cost, theta) in enumerate(cells):
        top, bottom_ax = axes[0][col], axes[1][col]
        at = [r for r in rows if (r["udf_cost_us"], r["theta"]) == (cost, theta)]
        for j, scheduler in enumerate(schedulers):
            executors = 1 if scheduler == "serial" else 2
            ys = [
                next(
                    (
                        r["throughput_eps"]
                        for r in at
                        if r["topology"] == t
                        and r["scheduler"] == scheduler
                        and r["executors"] == executors
                    ),
                    0,
                )
                for t in topologies
            ]
            xs = [i + (j - len(schedulers) / 2 + 0.5) * width for i in range(len(topologies))]
            top.bar(xs, ys, width, label=scheduler + (" (1)" if executors == 1 else ""))
        top.set_xticks(range(len(topologies)), topologies)
        top.set(ylabel="events/s", yscale="log", title=f"C = {cost:g} us, theta = {theta:g}")
        top.legend(fontsize=7)
        bars = [r for r in at if r["executors"] == 2]
        base = [0.0] * len(bars)
        for activity in ACTIVITIES:
            heights = [r["breakdown_s"][activity] / r["events"] * 1e6 for r in bars]
            bottom_ax.bar(range(len(bars)), heights, bottom=base, label=activity)
            base = [b + h for b, h in zip(base, heights, strict=True)]
        bottom_ax.set_xticks(
            range(len(bars)),
            [f"{r['topology']} {r['scheduler']}" for r in bars],
            fontsize=6,
            rotation=90,
        )
        bottom_ax.set(ylabel="us per event (summed over 2 executors)")
        bottom_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def median_run(
    args, topology: str, events: pa.Table, init: dict, scheduler: str, executors: int, cost: float
) -> tuple[dict, tuple]:
    """The run of median throughput of --repeat runs (with every run's events/s)."""
    runs = [
        run(args.engine, topology, events, init, scheduler, executors, cost)
        for _ in range(args.repeat)
    ]
    runs.sort(key=lambda r: r[0]["throughput_eps"])
    m, out = runs[len(runs) // 2]
    m["throughput_runs"] = [r[0]["throughput_eps"] for r in runs]
    return m, out


def workload_rows(args, workload: dict, events: pa.Table, init: dict) -> list[dict]:
    """Every scheduler and team size on one workload, serial (1 executor) first."""
    topology, cost = workload["topology"], workload["udf_cost_us"]
    serial, want = median_run(args, topology, events, init, "serial", 1, cost)
    rows = []
    for scheduler in args.schedulers:
        for executors in [1] if scheduler == "serial" else args.executors:
            if scheduler == "serial":
                m = dict(serial)
            else:
                m, got = median_run(args, topology, events, init, scheduler, executors, cost)
                if scheduler == "nolock":
                    m["distance_from_serial"] = distance(got, want)
            ratio = round(m["throughput_eps"] / serial["throughput_eps"], 3)
            m.update(
                workload,
                scheduler=scheduler,
                executors=executors,
                events=events.num_rows,
                vs_serial=ratio,
            )
            rows.append(m)
            b = m["breakdown_s"]
            print(
                f"{topology} theta={workload['theta']:g} C={cost:g} {scheduler:11} "
                f"x{executors} {m['throughput_eps']:>10,} ev/s {ratio:6.2f}x serial  "
                + " ".join(f"{k}={b[k]:.3f}" for k in ACTIVITIES),
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("threads", "ray"), default="threads")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--costly-events", type=int, default=10_000)
    parser.add_argument("--topologies", nargs="+", default=["sl", "gs", "ob", "tp"])
    parser.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=list(SCHEDULERS))
    parser.add_argument("--executors", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--out", type=Path, default=RESULTS / "baselines.json")
    args = parser.parse_args()
    rows = []
    with bench_ray() if args.engine == "ray" else nullcontext():
        for topology in args.topologies:
            for theta in (0.2, 0.8):
                table, init = generate(topology, WorkloadSpec(events=args.events, theta=theta))
                for cost in (0.0, 10.0):
                    events = table.slice(0, args.costly_events if cost else args.events)
                    workload = dict(topology=topology, theta=theta, udf_cost_us=cost)
                    rows += workload_rows(args, workload, events, init)
    results = {"engine": args.engine, "interval": INTERVAL, "repeat": args.repeat, "rows": rows}
    path = write_results(args.out.stem, results, args.out.parent)
    plot(rows, path.with_suffix(".png"))
    print("->", path, "and", path.with_suffix(".png"))


if __name__ == "__main__":
    main()
