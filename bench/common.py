"""Shared pieces of the benchmarks: workloads on disk, one Ray, JSON results."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from txstream.topologies.generators import WorkloadSpec, generate, write_workload

RESULTS = Path(__file__).parent / "results"


@contextmanager
def bench_ray(job_config: object | None = None) -> Iterator[None]:
    """One lean Ray for a whole benchmark (its start-up is never in a figure)."""
    from txstream.cluster.ray_runtime import ray_session

    with ray_session(job_config=job_config, log_to_driver=False):
        yield


@contextmanager
def workload_dirs(topologies: list[str], events: int, **knobs) -> Iterator[dict[str, Path]]:
    """Generated workloads on disk, one folder per topology, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="txstream_bench_") as tmp:
        dirs = {}
        for name in topologies:
            events_table, init = generate(name, WorkloadSpec(events=events, **knobs))
            write_workload(Path(tmp) / name, events_table, init)
            dirs[name] = Path(tmp) / name
        yield dirs


def write_results(name: str, results: dict, folder: Path = RESULTS) -> Path:
    """<folder>/<name>.json (bench/results by default) with the machine and commit the
    figures belong to, and the 1-minute load average the benchmark started at (set by
    `shared/tools/heavy --bench` in TXSTREAM_BENCH_LOAD; null: not taken that way, so
    not a measurement)."""
    folder.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": commit,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_at_start": float(os.environ["TXSTREAM_BENCH_LOAD"])
        if "TXSTREAM_BENCH_LOAD" in os.environ
        else None,
        **results,
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
