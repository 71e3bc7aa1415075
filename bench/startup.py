"""Wall time and start-up of `txstream run` as a user runs it, for one or more checkouts.

Each run is a new `txstream run` process (Ray, Spark and the team started, then stopped),
timed from outside; metrics.json gives `startup_s` (before the first event: Ray, Spark
and staging, the team's start and warm-up), its phases where the checkout records them
(`phases_s`), Spark's parts and the engine's `seconds`. Checkouts are run in turn, one run
of each per round, so that their figures share the machine's load (compare within one
results file).

    python bench/startup.py [--events 1000000] [--repeat 3] [--sources spark arrow]
        [--checkout NAME=VENV ...]    (default: this checkout's .venv)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import workload_dirs, write_results

HERE = Path(__file__).resolve().parent.parent


def run_once(venv: Path, data: Path, source: str, out: Path, options: tuple[str, ...] = ()) -> dict:
    """One `txstream run` of ``data`` through ``source`` (more command-line ``options``):
    wall seconds and metrics."""
    shutil.rmtree(out, ignore_errors=True)
    command = [
        str(venv / "bin" / "txstream"),
        "run",
        "sl",
        "--input",
        str(data / "events.parquet"),
        "--init-state",
        str(data / "init"),
        "--output",
        str(out),
        "--source",
        source,
        "--no-progress",
        *options,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {
        "wall_s": round(wall, 3),
        "startup_s": metrics["startup_s"],
        "seconds": round(metrics["seconds"], 3),
        "throughput_eps": metrics["throughput_eps"],
        "cpu_s": metrics.get("cpu_s"),
        "phases_s": metrics.get("phases_s"),
        "spark": metrics.get("spark"),
    }


def class_archive(venv: Path) -> bool:
    """Whether the checkout's installation has Spark's class archive (./setup makes it)."""
    return (venv / "share" / "txstream" / "spark-classes.jsa").is_file()


def medians(runs: list[dict]) -> dict:
    """Median of every figure over runs (phases by name)."""
    figures = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "startup_s", "seconds")}
    phases = {name for r in runs for name in r["phases_s"] or {}}
    if phases:
        figures["phases_s"] = {
            name: statistics.median(r["phases_s"].get(name, 0.0) for r in runs) for name in phases
        }
    spark = runs[0]["spark"]
    if spark:
        figures["spark"] = {k: statistics.median(r["spark"][k] for r in runs) for k in spark}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median)")
    parser.add_argument("--sources", nargs="+", default=["spark", "arrow"])
    parser.add_argument(
        "--checkout",
        action="append",
        metavar="NAME=VENV",
        help="a checkout's virtualenv to run (repeatable; default: this checkout's .venv)",
    )
    parser.add_argument("--name", default="startup", help="results file name")
    args = parser.parse_args()
    checkouts = dict(c.split("=", 1) for c in args.checkout or [f"this={HERE / '.venv'}"])
    runs: dict[str, dict[str, list[dict]]] = {s: {c: [] for c in checkouts} for s in args.sources}
    with workload_dirs(["sl"], args.events) as dirs, tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeat):
            for source in args.sources:
                for name, venv in checkouts.items():
                    run = run_once(Path(venv), dirs["sl"], source, Path(tmp) / "out")
                    runs[source][name].append(run)
                    print(f"round {round_ + 1} {source} {name}: {run}", flush=True)
    results = {
        source: {name: {"median": medians(rs), "runs": rs} for name, rs in by_checkout.items()}
        for source, by_checkout in runs.items()
    }
    for source, by_checkout in results.items():
        for name, figures in by_checkout.items():
            print(f"{source} {name}: {figures['median']}")
    print(
        "->",
        write_results(
            args.name,
            {
                "events": args.events,
                "checkouts": checkouts,
                "spark_class_archive": {n: class_archive(Path(v)) for n, v in checkouts.items()},
                "results": results,
            },
        ),
    )


if __name__ == "__main__":
    main()
