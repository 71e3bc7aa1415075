"""What serving live metrics costs a run: CPU-seconds per event of `txstream run` with and
without ``--metrics-port``, scraped every second meanwhile (Prometheus' default is 15 s).

Each configuration runs in pairs, one run with metrics and one without, in alternating
order; a pair's ratio compares their CPU-seconds (the whole process's: user and system,
start-up included, the team's threads included: the configurations run without Ray, so
every thread of the run is in that process). The figure is the median ratio of 5 pairs.
Results: bench/results/metrics_overhead.json.

    ../shared/tools/heavy --bench python bench/metrics_overhead.py [--events 4000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from common import workload_dirs, write_results

CONFIGS = {
    "arrow serial": ("--scheduler", "serial"),
    "arrow morphstream x2": ("--scheduler", "morphstream", "--executors", "2"),
}
SCRAPE_EVERY_S = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape_until(port: int, done: threading.Event, scrapes: list[int]) -> None:
    """Read ``/metrics`` every `SCRAPE_EVERY_S` until ``done``, counting the answers."""
    while not done.wait(SCRAPE_EVERY_S):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                answer.read()
            scrapes.append(1)
        except OSError:  # not serving yet, or no longer
            pass


def run_once(data: Path, out: Path, options: tuple[str, ...], metrics: bool) -> dict:
    """One `txstream run` of ``data``: its CPU-seconds (from the kernel's accounting of the
    finished child), events and scrapes answered."""
    shutil.rmtree(out, ignore_errors=True)
    command = [str(Path(sys.executable).parent / "txstream"), "run", "sl"]
    command += ["--input", str(data / "events.parquet"), "--init-state", str(data / "init")]
    command += ["--output", str(out), "--source", "arrow", "--no-progress", *options]
    done, scrapes, scraper = threading.Event(), [], None
    if metrics:
        port = free_port()
        command += ["--metrics-port", str(port)]
        scraper = threading.Thread(target=scrape_until, args=(port, done, scrapes))
        scraper.start()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    if scraper is not None:
        scraper.join()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{process.stderr.read().decode()}")
    cpu_s = usage.ru_utime + usage.ru_stime
    events = json.loads((out / "metrics.json").read_text())["events"]
    return {"cpu_s": round(cpu_s, 3), "events": events, "scrapes": len(scrapes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    results: dict = {"events": args.events, "scrape_every_s": SCRAPE_EVERY_S, "configs": {}}
    with workload_dirs(["sl"], args.events, keys=100_000, seed=7) as dirs:
        data, out = dirs["sl"], dirs["sl"].parent / "out"
        run_once(data, out, CONFIGS["arrow serial"], False)  # numba's cache, the page cache
        for name, options in CONFIGS.items():
            pairs = []
            for i in range(args.pairs):
                order = (True, False) if i % 2 else (False, True)
                runs = {metrics: run_once(data, out, options, metrics) for metrics in order}
                with_, without = runs[True], runs[False]
                ratio = with_["cpu_s"] / without["cpu_s"]
                pairs.append({"with": with_, "without": without, "ratio": round(ratio, 4)})
                print(f"{name} pair {i}: {with_['cpu_s']} / {without['cpu_s']} CPU-s", flush=True)
            per_event = {
                key: statistics.median(p[key]["cpu_s"] / p[key]["events"] for p in pairs) * 1e6
                for key in ("with", "without")
            }
            median = statistics.median(p["ratio"] for p in pairs)
            results["configs"][name] = {
                "pairs": pairs,
                "cpu_us_per_event": {k: round(v, 4) for k, v in per_event.items()},
                "overhead": round(median - 1, 4),
            }
            print(f"{name}: overhead {median - 1:+.2%} CPU-seconds per event", flush=True)
    print(write_results("metrics_overhead", results))


if __name__ == "__main__":
    main()
