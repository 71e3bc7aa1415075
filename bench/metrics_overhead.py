"""What serving live metrics costs a run: CPU-seconds per event of `txstream run` with and
without ``--metrics-port``, scraped every second meanwhile (Prometheus' default is 15 s).

Each configuration runs in pairs, one run with metrics and one without, in alternating
order; a pair's ratio compares their CPU-seconds per event. A run's CPU-seconds are its
process's (user and system, the team's threads included: the configurations run without
Ray, so every thread of the run is in that process) from the end of its imports to its
exit: the imports are the same modules either way, done before any option is read, and
they take about as long as streaming millions of events, so their jitter would drown
what is measured. The whole process's CPU-seconds are kept beside (``process_cpu_s``).
The figure is the median ratio of 5 pairs. Results: bench/results/metrics_overhead.json.

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
RUN = """
import atexit, json, sys, time
import txstream.job, txstream.session
from txstream.cli.main import command
start, target = time.process_time(), sys.argv[1]
atexit.register(lambda: open(target, "w").write(json.dumps(time.process_time() - start)))
sys.argv = ["txstream", *sys.argv[2:]]
command()
"""
"""`txstream run` as its executable runs it, its CPU-seconds after the imports written to
the file named first."""


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
    """One `txstream run` of ``data``: its CPU-seconds after the imports, and the whole
    process's (from the kernel's accounting of the finished child), events and scrapes
    answered."""
    shutil.rmtree(out, ignore_errors=True)
    cpu_file = out.with_name("run_cpu_s.json")
    command = [sys.executable, "-c", RUN, str(cpu_file), "run", "sl"]
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
    events = json.loads((out / "metrics.json").read_text())["events"]
    return {
        "cpu_s": round(json.loads(cpu_file.read_text()), 3),
        "process_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "events": events,
        "scrapes": len(scrapes),
    }


def _per_event(run: dict, cpu: str) -> float:
    return run[cpu] / run["events"]


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
                ratio = _per_event(with_, "cpu_s") / _per_event(without, "cpu_s")
                whole = _per_event(with_, "process_cpu_s") / _per_event(without, "process_cpu_s")
                pairs.append(
                    {
                        "with": with_,
                        "without": without,
                        "ratio": round(ratio, 4),
                        "process_ratio": round(whole, 4),
                    }
                )
                print(f"{name} pair {i}: {with_['cpu_s']} / {without['cpu_s']} CPU-s", flush=True)
            per_event = {
                key: statistics.median(_per_event(p[key], "cpu_s") for p in pairs) * 1e6
                for key in ("with", "without")
            }
            median = statistics.median(p["ratio"] for p in pairs)
            whole = statistics.median(p["process_ratio"] for p in pairs)
            results["configs"][name] = {
                "pairs": pairs,
                "cpu_us_per_event": {k: round(v, 4) for k, v in per_event.items()},
                "overhead": round(median - 1, 4),
                "process_overhead": round(whole - 1, 4),
            }
            print(f"{name}: overhead {median - 1:+.2%} CPU-seconds per event", flush=True)
    print(write_results("metrics_overhead", results))


if __name__ == "__main__":
    main()
