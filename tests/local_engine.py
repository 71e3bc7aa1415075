"""Runs the engine's plain classes in this process, executors as threads, without Ray.

The executors, the Coordinator, kernels, topologies, chunking and shared-memory
synchronisation are exactly those of a run; only the transport (Ray calls) is
missing, so hundreds of hypothesis examples stay fast. Kernels release the GIL:
threads do run in parallel.
"""

from __future__ import annotations

import contextlib
import threading
import time
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
from txstream import topologies
from txstream.actors.coordinator import Coordinator
from txstream.actors.executor import Executor, output_schema
from txstream.actors.progress import share_bounds
from txstream.actors.punctuation import CHUNK_EVENTS
from txstream.config import RunConfig
from txstream.errors import PeerFailed
from txstream.monitor.metrics import Breakdown
from txstream.schedulers import get as get_scheduler
from txstream.schedulers.team.placement import seats
from txstream.state.init import read_init_state
from txstream.state.layout import Layout
from txstream.state.shared import new_run_id, run_prefix
from txstream.state.snapshots import SnapshotRing
from txstream.state.sync import ask_to_stop, slots
from txstream.state.tables import SharedState

TIMEOUT_S = 60.0


def run_local(
    topology: str,
    events: pa.Table,
    init: dict[str, pa.Table],
    *,
    scheduler: str = "serial",
    executors: int = 1,
    sockets: list[int] | None = None,
    punctuation_interval: int = 10240,
    batches_per_chunk: int | None = 3,
    reports: list[dict] | None = None,
    timing: dict | None = None,
    **options: str | float | None,
) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Outputs and final state of ``events``, chunked as the ProgressController does
    (``batches_per_chunk`` None: as many as in a run's chunk).

    ``sockets`` gives each executor's socket (default: all on socket 0); ``options``
    are further `RunConfig` fields (placement, explore, ...); executor 0's scheduler
    report (what it adds to metrics.json) is appended to ``reports``. With ``timing``
    (benchmarks), the executors warm up first, then ``timing`` gets the seconds of the
    run and every executor's time breakdown."""
    topo = topologies.get(topology)
    topo.check_event_schema(events.schema)
    tables = read_init_state(topo, init)
    layout = Layout.of(topo.tables, topo.sizes_from({k: t.num_rows for k, t in tables.items()}))
    config = RunConfig(
        topology=topology,
        scheduler=scheduler,
        executors=executors,
        punctuation_interval=punctuation_interval,
        timeout_s=options.pop("timeout_s", TIMEOUT_S),
        **options,
    )
    chunk = CHUNK_EVENTS if batches_per_chunk is None else punctuation_interval * batches_per_chunk
    run_id = new_run_id()
    team = seats(config.placement, sockets or [0] * executors)
    sync = np.zeros(slots(executors), np.int64)
    with (
        SharedState.create(run_id, layout, 2 * events.num_rows + 16) as state,
        _snapshot_ring(run_id, layout.cells) as snapshots,
    ):
        state.load(topo, tables)
        members = [
            Executor(config, state.handle, seat, sync, run_prefix(run_id), snapshots)
            for seat in team
        ]
        rows: list[list[pa.RecordBatch]] = [[] for _ in members]
        errors: list[BaseException] = []
        helpers = []
        if get_scheduler(scheduler).coordinator_policies(config):
            coordinator = Coordinator(config, sync, run_prefix(run_id))
            helpers.append(threading.Thread(target=_serve, args=(coordinator, errors)))

        times = [Breakdown() for _ in members]
        chunks = list(_chunks(events, chunk))
        warm = threading.Barrier(executors + 1)

        def work(rank: int) -> None:
            try:
                if timing is not None:
                    members[rank].warm_up(events.schema)
                    warm.wait()
                for seq, (ts0, batch) in enumerate(chunks):
                    first, end = share_bounds(batch.num_rows, executors)[rank]
                    share = batch.slice(first, end - first)
                    ends = np.append(
                        np.arange(punctuation_interval, batch.num_rows, punctuation_interval),
                        batch.num_rows,
                    )
                    rows[rank].append(
                        members[rank].run_share(share, seq, first, ts0, ends, times[rank])
                    )
            except BaseException as exc:  # reported by the caller
                errors.append(exc)
                warm.abort()

        threads = [threading.Thread(target=work, args=(r,)) for r in range(executors)]
        for t in helpers + threads:
            t.start()
        if timing is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                warm.wait()  # (broken: an executor failed, raised below)
            start = time.perf_counter()
        for t in threads:
            t.join(TIMEOUT_S * 2)
        if timing is not None:
            timing["seconds"] = time.perf_counter() - start
            timing["breakdown_s"] = [t.as_dict() for t in times]
        ask_to_stop(sync)
        for t in helpers:
            t.join(TIMEOUT_S * 2)
            threads.append(t)
        if reports is not None:
            reports.append(members[0].scheduler.report())
        for member in members:
            member.close()
        if errors:  # the root cause, not a peer that stopped because of it
            raise next((e for e in errors if not isinstance(e, PeerFailed)), errors[0])
        assert not any(t.is_alive() for t in threads), "an executor thread hangs"
        ordered = sorted((r for rank in rows for r in rank), key=lambda r: r["ts"][0].as_py()
                         if r.num_rows else -1)  # fmt: skip
        return pa.Table.from_batches(ordered, output_schema(topo)), state.tables(topo)


def _serve(coordinator: Coordinator, errors: list[BaseException]) -> None:
    try:
        coordinator.serve()
    except BaseException as exc:  # reported by the caller
        errors.append(exc)


def _chunks(events: pa.Table, size: int):
    for ts0 in range(0, events.num_rows, size):
        part = events.slice(ts0, size).combine_chunks().to_batches()
        if part:
            yield ts0, part[0]


@contextmanager
def _snapshot_ring(run_id: str, cells: int):
    ring = SnapshotRing.create(run_id, cells)
    try:
        yield ring
    finally:
        ring.close()
