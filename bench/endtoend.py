"""What a user waits for: `txstream run` on 4M SL events, from the command to its exit, and
Flink 2.3 (Java, mini-cluster, parallelism 1, keyed state) on the same events beside it.

Every txstream run is a new process (Ray, Spark when it reads, the team: started and
stopped), timed from outside; metrics.json gives the engine's rate (events over the
seconds from the first event read to the last output written), `startup_s` and its phases
(and Spark's start and staging). Configurations: Parquet read by pyarrow (``arrow``) or
by Spark, with serial, tstream ×2 and morphstream ×2. The events are the peers' (see
../shared/peers/README.md, ``PEERS_DIR``): txstream's outputs are checked against their
numba reference, and Flink Java runs on the same events as CSV when Java and the peers
are set up. Rounds interleave every configuration, so ratios are taken within one run.
Results: bench/results/endtoend.{json,png}.

    PEERS_DIR=/tmp/peers ../shared/peers/ensure.sh
    PEERS_DIR=/tmp/peers ../shared/tools/heavy --bench python bench/endtoend.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from common import RESULTS, workload_dirs, write_results
from startup import HERE, class_archive, run_once

CONFIGS = {
    "arrow serial": ("arrow", "--scheduler", "serial"),
    "arrow serial, Ray actors": ("arrow", "--scheduler", "serial", "--transport", "ray"),
    "arrow tstream x2": ("arrow", "--scheduler", "tstream", "--executors", "2"),
    "arrow morphstream x2": ("arrow", "--scheduler", "morphstream", "--executors", "2"),
    "spark serial": ("spark", "--scheduler", "serial"),
    "spark tstream x2": ("spark", "--scheduler", "tstream", "--executors", "2"),
    "spark morphstream x2": ("spark", "--scheduler", "morphstream", "--executors", "2"),
}
FLINK_VARIANTS = ("valuearray", "mapstate")
"""The peers' Flink job keeps both tables in one ValueState<long[]>, or in MapStates."""
FLINK_OPENS = (
    "java.lang",
    "java.util",
    "java.lang.reflect",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
    "java.io",
    "java.nio",
    "sun.nio.ch",
    "java.net",
    "java.text",
    "java.time",
)


def peers_data(peers: Path | None, events: int) -> Path | None:
    """The peers' events in txstream's schema, if set up for this many events."""
    if peers is None:
        return None
    data = peers / f"tx_0.2_{events}"
    return data if (data / "events.parquet").exists() else None


def correct(out: Path, peers: Path) -> bool:
    """Final balances and every event's commit flag equal the peers' reference."""
    accounts = pq.read_table(out / "state" / "accounts.parquet").column("balance").to_numpy()
    assets = pq.read_table(out / "state" / "assets.parquet").column("balance").to_numpy()
    status = pq.read_table(out / "events.parquet", columns=["status"]).column("status")
    committed = (np.asarray(status.to_pylist()) == "committed").astype(np.uint8)
    return bool(
        np.array_equal(accounts, np.load(peers / "ref_acc.npy"))
        and np.array_equal(assets, np.load(peers / "ref_ast.npy"))
        and np.array_equal(committed, np.load(peers / "ref_ok.npy"))
    )


def flink_command(peers: Path, variant: str, events: int) -> list[str] | None:
    """The peers' Flink Java job on their CSV events, if Java and the job are there."""
    jars = sorted((peers / "venv_flink/lib/python3.11/site-packages/pyflink/lib").glob("*.jar"))
    csv = peers / f"flink_in_0.2_{events}.csv"
    if not shutil.which("java") or not jars or not csv.exists():
        return None
    if not (peers / "flink_java" / "SLJob.class").exists():
        return None
    classpath = ":".join([str(peers / "flink_java"), *map(str, jars)])
    opens = [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in FLINK_OPENS]
    return [
        "java",
        "-Xmx4g",
        *opens,
        "-Dlog4j2.level=WARN",
        "-cp",
        classpath,
        "SLJob",
        str(csv),
        str(events),
        variant,
        str(peers / "fj_out"),
    ]


def run_flink(command: list[str]) -> dict:
    """One Flink run: wall seconds of the java process, its own total and exec seconds."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    found = re.search(r"RESULT n=(\d+) cnt=(\d+) total_s=([\d.]+) exec_s=([\d.]+)", done.stdout)
    if not found:
        raise SystemExit(f"flink failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return {"wall_s": round(wall, 3), "total_s": float(found[3]), "exec_s": float(found[4])}


def plot(results: dict, path: Path) -> None:
    """Median wall time per configuration: start-up and the rest, Flink beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    wall = [results[n]["median"]["wall_s"] for n in names]
    startup = [results[n]["median"].get("startup_s", 0.0) for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.barh(names, startup, color="#bbbbbb", label="start-up (metrics.json)")
    rest = [w - s for w, s in zip(wall, startup, strict=True)]
    ax.barh(names, rest, left=startup, color="#4477aa", label="the rest of the wall time")
    for i, n in enumerate(names):
        rate = results[n]["median"].get("throughput_eps")
        label = f"{wall[i]:.1f} s" + (f", engine {rate / 1e6:.2f} M ev/s" if rate else "")
        ax.text(wall[i], i, " " + label, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall seconds (median)")
    ax.set_title("4M SL events (θ 0.2), command to exit")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max(wall) * 1.45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="rounds (median)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--venv", type=Path, default=HERE / ".venv")
    parser.add_argument("--name", default="endtoend", help="results file name")
    args = parser.parse_args()
    peers_dir = os.environ.get("PEERS_DIR")
    peers = Path(peers_dir) if peers_dir else None
    flink = {v: flink_command(peers, v, args.events) for v in FLINK_VARIANTS} if peers else {}
    flink = {f"flink java {v}": c for v, c in flink.items() if c}
    runs: dict[str, list[dict]] = {name: [] for name in [*args.configs, *flink]}
    with tempfile.TemporaryDirectory(prefix="txstream_e2e_") as tmp:
        data = peers_data(peers, args.events)
        generated = None if data else workload_dirs(["sl"], args.events)
        if generated is not None:
            data = generated.__enter__()["sl"]
        try:
            for round_ in range(args.repeat):
                for name in args.configs:
                    source, *options = CONFIGS[name]
                    out = Path(tmp) / "out"
                    run = run_once(args.venv, data, source, out, tuple(options))
                    if peers_data(peers, args.events):
                        run["correct"] = correct(out, peers)
                    runs[name].append(run)
                    print(f"round {round_ + 1} {name}: {run}", flush=True)
                for name, command in flink.items():
                    runs[name].append(run_flink(command))
                    print(f"round {round_ + 1} {name}: {runs[name][-1]}", flush=True)
        finally:
            if generated is not None:
                generated.__exit__(None, None, None)
    results = {name: {"median": _medians(rs), "runs": rs} for name, rs in runs.items()}
    flink_walls = [results[n]["median"]["wall_s"] for n in flink]
    if flink_walls:
        best = min(flink_walls)
        for name in args.configs:
            results[name]["wall_vs_flink"] = round(results[name]["median"]["wall_s"] / best, 3)
    for name, figures in results.items():
        print(
            f"{name}: {figures['median']}"
            + (f" ×flink {figures['wall_vs_flink']}" if "wall_vs_flink" in figures else "")
        )
    payload = {
        "events": args.events,
        "input": "peers" if peers_data(peers, args.events) else "generated (θ 0.2)",
        "load_average": os.environ.get("TXSTREAM_BENCH_LOAD", f"{os.getloadavg()[0]:.2f}"),
        "spark_class_archive": class_archive(args.venv),
        "results": results,
    }
    path = write_results(args.name, payload)
    plot(results, RESULTS / f"{args.name}.png")
    print("->", path)


def _medians(runs: list[dict]) -> dict:
    """Median of every numeric figure over runs (nested dicts by key); correct if all were."""
    out: dict = {}
    for key, value in runs[0].items():
        if isinstance(value, bool):
            out[key] = all(r.get(key) for r in runs)
        elif isinstance(value, int | float):
            out[key] = round(statistics.median(r[key] for r in runs), 3)
        elif isinstance(value, dict):
            out[key] = _medians([r[key] or {} for r in runs]) if value else value
    return out


if __name__ == "__main__":
    main()
