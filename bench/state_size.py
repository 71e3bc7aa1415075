"""What the size of the state costs: SL with small and very large tables, the same events.

A run's cost should grow with its work, not with its state (snapshots for queries and
checkpoints copy what chunks wrote, `txstream.state.dirty`). Each workload is written by
`txstream generate sl --keys K` and run by `txstream run sl --source arrow`, serial and
morphstream on two executors, each run a process of its own (the default local transport:
the team as threads of that process), whose peak RSS the kernel reports when it exits.
The engine's rate is metrics.json's ``throughput_eps``: events over the seconds from the
team's start to the run's end, without start-up (loading the init state) or writing the
output, which ``process_s`` (the whole command) includes; both ratios are reported. The
raw state is 8 bytes per value.

    python bench/state_size.py [--keys 1000000 30000000] [--events 4000000] [--checkpoint]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_results

CONFIGS = {
    "serial": ["--scheduler", "serial"],
    "morphstream x2": ["--scheduler", "morphstream", "--executors", "2"],
}
"""The configurations measured, by name: their options of `txstream run`."""
TABLES = 2
"""SL's tables (accounts, assets), one value column each."""
MiB = 1024**2


def txstream(*args: str) -> list[str]:
    """The command line of the txstream of this interpreter."""
    return [sys.executable, "-m", "txstream", *args]


def run(workload: Path, output: Path, options: list[str]) -> dict:
    """One `txstream run`: its rate, seconds and peak RSS."""
    command = txstream(
        "run", "sl", "--input", str(workload / "events.parquet"),
        "--init-state", str(workload / "init"), "--output", str(output), "--source", "arrow",
        "--overwrite", "--no-progress", *options,
    )  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise SystemExit(f"state_size: {' '.join(command)} failed ({status})")
    metrics = json.loads((output / "metrics.json").read_text())
    return {
        "throughput_eps": metrics["throughput_eps"],
        "engine_s": metrics["seconds"],
        "startup_s": round(metrics["startup_s"], 2),
        "process_s": round(time.perf_counter() - started, 2),
        "peak_rss_mib": round(usage.ru_maxrss * 1024 / MiB, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 30_000_000])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument(
        "--checkpoint", action="store_true", help="with checkpoints (--checkpoint-dir)"
    )
    parser.add_argument("--name", default="state_size")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="txstream_state_size_") as tmp:
        for keys in args.keys:
            workload = Path(tmp) / f"sl-{keys}"
            generate = txstream("generate", "sl", "--out", str(workload), "--keys", str(keys))
            subprocess.run([*generate, "--events", str(args.events)], check=True)
            for name in args.configs:
                options = CONFIGS[name]
                if args.checkpoint:
                    options = [*options, "--checkpoint-dir", str(Path(tmp) / "ckpt")]
                got = run(workload, Path(tmp) / "out", options)
                raw_mib = keys * TABLES * 8 / MiB
                row = {
                    "keys": keys,
                    "config": name,
                    **got,
                    "raw_state_mib": round(raw_mib, 1),
                    "rss_bound_mib": round(2 * raw_mib + 1024, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            subprocess.run(["rm", "-rf", str(workload)], check=True)
    small, large = min(args.keys), max(args.keys)
    rate = {(r["keys"], r["config"]): r["throughput_eps"] for r in rows}
    process = {(r["keys"], r["config"]): r["process_s"] for r in rows}
    summary = {
        name: {
            "rate_ratio": round(rate[(large, name)] / rate[(small, name)], 3),
            "process_rate_ratio": round(process[(small, name)] / process[(large, name)], 3),
            "peak_rss_mib": next(
                r["peak_rss_mib"] for r in rows if r["keys"] == large and r["config"] == name
            ),
            "rss_bound_mib": round(2 * large * TABLES * 8 / MiB + 1024, 1),
        }
        for name in args.configs
    }
    print(json.dumps(summary, indent=1))
    write_results(
        args.name,
        {"events": args.events, "checkpoint": args.checkpoint, "summary": summary, "runs": rows},
    )


if __name__ == "__main__":
    main()
