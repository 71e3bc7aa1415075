"""Events/s per scheduler, executors and placement, at --udf-cost-us 0 and 10 (with a figure).

Workloads are the generator's defaults (Zipf theta 0.2, 1% aborts, passed explicitly);
punctuation every 10240 events (40960 for TP). Each figure is the median of --repeat runs;
Ray start-up (``--engine ray``; the team is threads of this process by default, as a
local run's is) and executor warm-up are excluded (see bench/serial.py). `speedup_vs_serial_1`
divides by serial at 1 executor on the same topology and UDF cost, measured first in the
same invocation (added if not asked for), so every ratio comes from one process on one
machine; every configuration first runs once untimed on the first topology at C = 0 (the
first runs in a fresh process are the slowest, by far). Placement does not apply to
serial, which runs shared-nothing only.

Runs without a UDF cost use --events events; runs with one use the first
--costly-events of them (each event then costs about 10 us per operation).

    python bench/scaling.py [--events 1000000] [--costly-events 300000] [--repeat 1]
        [--topologies sl gs ob tp]
        [--schedulers serial tstream] [--executors 1 2] [--placements ...] [--udf-costs 0 10]
        [--engine threads|ray] [--out bench/results/scaling.json]
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

import pyarrow.parquet as pq
from common import RESULTS, bench_ray, workload_dirs, write_results
from txstream import Job
from txstream.config import PLACEMENTS

ACTIVITIES = ("useful", "sync", "lock", "construct", "explore", "abort")
BASELINE = ("serial", 1, "shared-nothing")


def _configs(args) -> list[tuple[str, int, str]]:
    """(scheduler, executors, placement) in run order, serial at 1 executor first."""
    configs = [
        (scheduler, executors, placement)
        for scheduler in args.schedulers
        for executors in args.executors
        for placement in (["shared-nothing"] if scheduler == "serial" else args.placements)
    ]
    return [BASELINE] + [c for c in configs if c != BASELINE]


def _measure(name, events, init, scheduler, executors, placement, cost, repeat, engine) -> dict:
    runs = [
        Job(
            name,
            transport=engine,
            scheduler=scheduler,
            executors=executors,
            placement=None if scheduler == "serial" else placement,
            udf_cost_us=cost,
            punctuation_interval=40960 if name == "tp" else 10240,
            source="arrow",
            progress=False,
        )
        .run(events, init)
        .metrics
        for _ in range(repeat)
    ]
    m = sorted(runs, key=lambda r: r["throughput_eps"] or 0)[len(runs) // 2]
    return {
        "topology": name,
        "scheduler": scheduler,
        "executors": executors,
        "placement": placement,
        "udf_cost_us": cost,
        "events": m["events"],
        "throughput_eps": m["throughput_eps"],
        "throughput_runs": [r["throughput_eps"] for r in runs],
        "latency_ms": m["latency_ms"],
        "breakdown_s": m["breakdown_s"],
        "breakdown_per_executor_s": m["breakdown_per_executor_s"],
        "feeders_cpu_s": m["cpu_s"],
        "coordinator": m["coordinator"],
    }


def _series(row: dict) -> str:
    """Scheduler, with its placement unless it is serial (where placement does not apply)."""
    return row["scheduler"] + ("" if row["scheduler"] == "serial" else f" {row['placement']}")


def plot(rows: list[dict], path: Path) -> None:
    """Per UDF cost: (a) events/s against executors, (b) time breakdown at 2 executors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = sorted({r["udf_cost_us"] for r in rows})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-o", "--s", "-.^", ":v", "-D", "--x", "-.P"]
    topologies = list(dict.fromkeys(r["topology"] for r in rows))
    series = list(dict.fromkeys(map(_series, rows)))
    fig, axes = plt.subplots(len(costs), 2, figsize=(14, 4.5 * len(costs)), squeeze=False)
    for (line_ax, bar_ax), cost in zip(axes, costs, strict=True):
        at_cost = [r for r in rows if r["udf_cost_us"] == cost]
        for i, name in enumerate(topologies):
            for j, label in enumerate(series):
                points = sorted(
                    (r["executors"], r["throughput_eps"] or 0)
                    for r in at_cost
                    if r["topology"] == name and _series(r) == label
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    style, colour = styles[j % len(styles)], colours[i % len(colours)]
                    line_ax.plot(xs, ys, style, color=colour, label=f"{name} {label}")
        line_ax.set(xlabel="executors", ylabel="events/s", yscale="log")
        line_ax.set_title(f"(a) throughput, C = {cost:g} us")
        line_ax.set_xticks(sorted({r["executors"] for r in rows}))
        line_ax.legend(fontsize=7)
        bars = [r for r in at_cost if r["executors"] == 2]
        bottom = [0.0] * len(bars)
        for activity in ACTIVITIES:
            heights = [r["breakdown_s"][activity] for r in bars]
            bar_ax.bar(range(len(bars)), heights, bottom=bottom, label=activity)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        labels = [f"{r['topology']}\n{_series(r)}" for r in bars]
        bar_ax.set_xticks(range(len(bars)), labels, fontsize=7, rotation=30)
        bar_ax.set(ylabel="seconds (summed over executors)")
        bar_ax.set_title(f"(b) breakdown at 2 executors, C = {cost:g} us")
        bar_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--costly-events",
        type=int,
        default=300_000,
        help="events for runs with a UDF cost (the first ones of the same workload)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (median)")
    parser.add_argument("--topologies", nargs="+", default=["sl", "gs", "ob", "tp"])
    parser.add_argument("--schedulers", nargs="+", default=["serial", "tstream"])
    parser.add_argument("--executors", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS))
    parser.add_argument("--udf-costs", nargs="+", type=float, default=[0.0, 10.0])
    parser.add_argument(
        "--engine",
        choices=("threads", "ray"),
        default="threads",
        help="the team as threads of this process (the default of a local run) or Ray actors",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "scaling.json")
    args = parser.parse_args()
    rows = []
    knobs = {"theta": 0.2, "abort_ratio": 0.01}
    ray = bench_ray() if args.engine == "ray" else nullcontext()
    with ray, workload_dirs(args.topologies, args.events, **knobs) as dirs:
        name, folder = next(iter(dirs.items()))
        events = pq.read_table(folder / "events.parquet")
        for scheduler, executors, placement in _configs(args):  # untimed warm-up
            _measure(
                name, events, folder / "init", scheduler, executors, placement, 0.0, 1, args.engine
            )
        for name, folder in dirs.items():
            for cost in args.udf_costs:
                n = args.costly_events if cost else args.events
                events = pq.read_table(folder / "events.parquet").slice(0, n)
                baseline = None  # serial at 1 executor, always the first config
                for scheduler, executors, placement in _configs(args):
                    row = _measure(
                        name,
                        events,
                        folder / "init",
                        scheduler,
                        executors,
                        placement,
                        cost,
                        args.repeat,
                        args.engine,
                    )
                    baseline = baseline or row["throughput_eps"]
                    row["speedup_vs_serial_1"] = round((row["throughput_eps"] or 0) / baseline, 3)
                    rows.append(row)
                    print(
                        f"{name:3} C={cost:<3g} {scheduler:8} x{executors} {placement:18}"
                        f" {row['throughput_eps'] or 0:>12,.0f} ev/s"
                        f"  {row['speedup_vs_serial_1']:5.2f}x serial-1"
                    )
    results = {"engine": args.engine, "repeat": args.repeat, "workload": knobs, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    path = write_results(args.out.stem, results, args.out.parent)
    plot(rows, path.with_suffix(".png"))
    print("->", path, "and", path.with_suffix(".png"))


if __name__ == "__main__":
    main()
