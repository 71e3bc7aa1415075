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
from typing import TYPE_CHECKING

from txstream.state.chunk import ChunkArrays, ChunkDims, chunk_layout
from txstream.state.shared import new_run_id, run_prefix
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

if TYPE_CHECKING:
    from txstream.schedulers.statements import Statements
    from txstream.state.layout import Layout
    from txstream.topologies.api import EventShare, Topology

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


def lone_chunk_segment(
    segment: ChunkArrays | None,
    txn: Statements,
    events: EventShare,
    topology: Topology,
    layout: Layout,
    label: str,
) -> ChunkArrays:
    """The chunk segment of a lone executor's chunk (``events``, its statements ``txn``)
    laid out for it: ``segment`` if it fits, else a larger one (``segment`` closed)."""
    sizes = txn.sizes()
    outputs = max(1, len(topology.outputs))
    dims = ChunkDims(
        sizes.operations, sizes.reads, events.n, sizes.arg_width, outputs, 1, 1, layout.rows
    )
    needed = chunk_layout(dims, [])
    if segment is None or not needed.fits(segment.capacity):
        if segment is not None:
            segment.close()
        segment = ChunkArrays.create(f"{run_prefix(new_run_id())}_{label}", needed.grown())
        segment.unlink()
    segment.use_chunk(dims, needed)
    return segment
