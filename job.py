"""The public entry point: configure a `Job`, `run()` it on events, get a `Result`.

`run()` validates everything it can before starting anything (schema errors cost no
Ray start-up), then runs the actor graph ProgressController -> Executors -> Sink (and
the Coordinator, for schedulers that need one) over shared-memory state, and always
stops the actors, unlinks the shared memory and shuts down the Ray it started - on
success, on error and on Ctrl-C.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from txstream import schedulers, topologies
from txstream.actors.coordinator import Coordinator
from txstream.actors.executor import Executor, output_schema
from txstream.actors.progress import ProgressController
from txstream.actors.sink import Sink
from txstream.cluster.ray_runtime import ray_session, start_actor, stop_actors
from txstream.cluster.topology import host_topology
from txstream.config import RunConfig
from txstream.errors import PeerFailed, RuntimeFailure, TxstreamError
from txstream.schedulers.placement import seats
from txstream.sources import ArrowSource, Source
from txstream.state.chunk import sweep_segments
from txstream.state.init import InitState, read_init_state
from txstream.state.layout import Layout
from txstream.state.shared import SharedArray, new_run_id, run_prefix, sweep_stale_segments
from txstream.state.sync import ask_to_stop, slots
from txstream.state.tables import SharedState

DEFAULT_SET_CAPACITY = 1 << 20
"""Distinct-set slots when the number of events is not known in advance."""


@dataclass
class Result:
    """What a run produced: per-event outputs, final state, and metrics."""

    events: pa.Table
    state: dict[str, pa.Table]
    metrics: dict[str, Any]

    def to_spark(self, spark: Any) -> tuple[Any, dict[str, Any]]:
        """Events and every table's state as Spark DataFrames of ``spark`` (same columns,
        types and nulls as the Arrow tables)."""
        from txstream.cluster.spark import arrow_to_spark

        state = {name: arrow_to_spark(table, spark) for name, table in self.state.items()}
        return arrow_to_spark(self.events, spark), state


class Job:
    """A configured run of one topology, e.g. ``Job("sl", scheduler="serial").run(events, init)``.

    Options are those of `txstream run` (see :class:`txstream.config.RunConfig`).
    """

    def __init__(self, topology: str = "sl", **options: Any):
        self.config = RunConfig(topology=topology, **options)

    def run(
        self,
        events: str | Path | pa.Table | Any,
        init_state: InitState,
        output: str | Path | None = None,
    ) -> Result:
        """Run the job on ``events`` from ``init_state`` (folder of ``<table>.parquet`` or
        Arrow tables by name). ``events`` is a Parquet file or folder (read by Spark or
        pyarrow, per ``source``), an Arrow table, a Spark DataFrame (of the running Spark
        on Ray), or any Source. With ``output``, also writes events.parquet, state/ and
        metrics.json there."""
        cfg = self.config
        topology = topologies.get(cfg.topology)
        cores = host_topology(cfg.sockets).assign(cfg.executors)
        init = read_init_state(topology, init_state)
        layout = Layout.of(
            topology.tables, topology.sizes_from({k: t.num_rows for k, t in init.items()})
        )
        out_dir = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="txstream_"))
        try:
            with ExitStack() as stack:
                source, ingest = self._open_source(events, topology, stack)
                metrics, state = self._execute(
                    topology, source, init, layout, cores, out_dir, ingest
                )
            result = Result(pq.read_table(out_dir / "events.parquet"), state, metrics)
        finally:
            if output is None:
                shutil.rmtree(out_dir, ignore_errors=True)
        return result

    def _open_source(self, events: Any, topology, stack: ExitStack) -> tuple[Source, dict]:
        """The event source, its schema checked; for Spark, started on a Ray with the JVM
        flags and staged in input order (its seconds are returned, reported apart)."""
        from txstream.cluster import spark

        if hasattr(events, "iter_batches"):
            topology.check_event_schema(events.schema)
            return events, {}
        from_spark = spark.is_spark_dataframe(events)
        if not from_spark and (isinstance(events, pa.Table) or self.config.source == "arrow"):
            source = ArrowSource(events)
            topology.check_event_schema(source.schema)
            return source, {}
        if not from_spark:  # a path: check the Parquet footers before starting Spark
            events = ArrowSource(events)
            topology.check_event_schema(events.schema)
        begin = time.perf_counter()
        stack.enter_context(ray_session(self.config.address, job_config=spark.ray_job_config()))
        stack.enter_context(spark.spark_session())
        started = time.perf_counter()
        source = stack.enter_context(spark.SparkSource(events))
        topology.check_event_schema(source.schema)
        staged = time.perf_counter()
        spark_seconds = {"startup_s": round(started - begin, 3),
                         "staging_s": round(staged - started, 3)}  # fmt: skip
        return source, {"spark": spark_seconds}

    def _execute(self, topology, source, init, layout, cores, out_dir: Path, ingest: dict):
        cfg = self.config
        sweep_stale_segments()
        run_id = new_run_id()
        has_sets = any(t.distinct for t in topology.tables)
        set_capacity = (2 * (source.num_rows or DEFAULT_SET_CAPACITY)) if has_sets else 16
        actors: list = []
        begin = time.perf_counter()
        with ExitStack() as stack:
            state = stack.enter_context(SharedState.create(run_id, layout, set_capacity))
            progress = SharedArray.create(run_id, "progress", (1,), "int64")
            stack.callback(progress.close)
            team = seats(cfg.placement, [socket for socket, _ in cores])
            sync = SharedArray.create(run_id, "sync", (slots(len(team)),), "int64")
            stack.callback(sync.close)
            stack.callback(sweep_segments, run_prefix(run_id))  # if an executor died
            state.load(topology, init)
            stack.enter_context(ray_session(cfg.address))
            stack.callback(stop_actors, actors)
            sink = start_actor(Sink, str(out_dir), output_schema(topology), progress.handle)
            executors = [
                start_actor(
                    Executor, cfg, state.handle, seat, sync.handle, run_prefix(run_id), sink, cpu
                )
                for seat, (_, cpu) in zip(team, cores, strict=True)
            ]
            controller = start_actor(ProgressController, cfg, source, executors)
            actors += [controller, *executors, sink]
            serving = None
            if schedulers.get(cfg.scheduler).coordinator_policies(cfg):
                coordinator = start_actor(Coordinator, cfg, sync.handle, run_prefix(run_id))
                actors.append(coordinator)
                serving = coordinator.serve.remote()
            self._get_watching([e.warm_up.remote(source.schema) for e in executors], serving)
            startup = time.perf_counter() - begin
            start = time.perf_counter()
            done = controller.run.remote()
            self._wait_with_progress(done, progress, source.num_rows, serving)
            run_info = self._get(done)
            ask_to_stop(sync.array)
            run_info["coordinator"] = self._get(serving) if serving else None
            summary = self._get(sink.finish.remote())
            seconds = time.perf_counter() - start
            self._get([e.close.remote() for e in executors])
            tables = state.tables(topology)
        self._write_state(out_dir, tables)
        metrics = {**self._metrics(summary, run_info, seconds, startup, source), **ingest}
        metrics["executor_cores"] = [
            {"socket": socket, "cpus": e["cpus"]}
            for (socket, _), e in zip(cores, run_info["executors"], strict=True)
        ]
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        return metrics, tables

    def _get(self, refs: Any) -> Any:
        """ray.get with the run's timeout; user and engine errors keep their own type."""
        import ray

        try:
            return ray.get(refs, timeout=self.config.timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, TxstreamError):
                raise cause from exc
            raise RuntimeFailure(f"an actor failed: {cause or exc}") from exc
        except ray.exceptions.GetTimeoutError as exc:
            raise RuntimeFailure(f"no progress within {self.config.timeout_s} s") from exc
        except ray.exceptions.RayError as exc:
            raise RuntimeFailure(f"an actor died: {exc}") from exc

    def _wait_with_progress(
        self, done: Any, progress: SharedArray, total: int | None, serving: Any | None
    ) -> None:
        """Wait for the run, with a progress bar on stderr once it takes over 2 s; fail
        when no event got through for the run's timeout, or at once when the
        Coordinator (``serving``) fails or dies."""
        import ray
        from tqdm import tqdm

        deadline = time.monotonic() + self.config.timeout_s
        with tqdm(
            total=total,
            unit="ev",
            unit_scale=True,
            delay=2.0,
            file=sys.stderr,
            disable=not self.config.progress,
            desc=self.config.topology,
        ) as bar:
            while not ray.wait([done], timeout=0.1)[0]:
                if serving is not None and ray.wait([serving], timeout=0)[0]:
                    self._coordinator_ended(serving)
                    serving = None
                if int(progress.array[0]) > bar.n:
                    bar.update(int(progress.array[0]) - bar.n)
                    deadline = time.monotonic() + self.config.timeout_s
                elif time.monotonic() > deadline:
                    raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            bar.update(int(progress.array[0]) - bar.n)

    def _get_watching(self, refs: list, serving: Any | None) -> Any:
        """`_get` of ``refs``, failing at once if one of them fails (an executor that
        dies cannot release its peers' waits) or the Coordinator (``serving``) ends
        first (e.g. during warm-up, while executors wait for it to map their segment)."""
        import ray

        deadline = time.monotonic() + self.config.timeout_s
        while True:
            ended, _ = ray.wait(refs, num_returns=len(refs), timeout=0.1)
            if len(ended) == len(refs) or time.monotonic() > deadline:
                break  # `_get` below returns, or reports the error or the timeout
            for ref in ended:
                try:
                    self._get(ref)
                except PeerFailed:
                    continue  # the root cause is still to come
            if serving is not None and ray.wait([serving], timeout=0)[0]:
                self._coordinator_ended(serving)
                serving = None
        return self._get(refs)

    def _coordinator_ended(self, serving: Any) -> None:
        """The Coordinator's call ended before the run: raise its error, unless it only
        stopped because an executor failed (the run's own result tells why)."""
        try:
            self._get(serving)
        except PeerFailed:
            return
        raise RuntimeFailure("the Coordinator stopped before the end of the run")

    @staticmethod
    def _write_state(out_dir: Path, tables: dict[str, pa.Table]) -> None:
        (out_dir / "state").mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            pq.write_table(table, out_dir / "state" / f"{name}.parquet")

    def _metrics(self, summary, run_info, seconds, startup, source) -> dict[str, Any]:
        from txstream.metrics import Breakdown

        total = Breakdown()
        for executor in run_info["executors"]:
            total.add(Breakdown(**executor["breakdown_s"]))
        events = summary["events"]
        return {
            "events": events,
            "committed": summary["committed"],
            "aborted": summary["aborted"],
            "rejected": summary["rejected"],
            "seconds": round(seconds, 6),
            "throughput_eps": round(events / seconds, 1) if seconds > 0 else None,
            "latency_ms": summary["latency_ms"],
            "breakdown_s": total.as_dict(),
            "breakdown_per_executor_s": [e["breakdown_s"] for e in run_info["executors"]],
            "batches": _batch_metrics(run_info["executors"]),
            "cpu_s": {"progress_controller": run_info["cpu_s"], "sink": summary["cpu_s"]},
            "coordinator": run_info["coordinator"],
            **run_info["executors"][0]["scheduler"],
            "operations": sum(e["operations"] for e in run_info["executors"]),
            "startup_s": round(startup, 3),
            "config": {**self.config.as_dict(), "source_rows": source.num_rows},
        }


def _batch_metrics(executors: list[dict]) -> dict[str, Any]:
    """Per punctuation batch: how long the team's state access took (percentiles; the
    batches end at a barrier, so every executor saw the same durations), and the time
    breakdown of every chunk of batches, summed over executors."""
    import numpy as np
    from txstream.metrics import Breakdown

    seconds = np.asarray(executors[0]["batch_seconds"])
    chunks = []
    for parts in zip(*(e["chunks"] for e in executors), strict=True):
        total = Breakdown()
        for part in parts:
            total.add(Breakdown(**part["breakdown_s"]))
        chunks.append({"ts": parts[0]["ts"], "events": parts[0]["events"],
                       "breakdown_s": total.as_dict()})  # fmt: skip
    state_access = dict.fromkeys(("p50", "p99", "max"))
    if len(seconds):
        p50, p99, top = np.percentile(seconds, [50, 99, 100]) * 1e3
        state_access = {"p50": round(p50, 4), "p99": round(p99, 4), "max": round(top, 4)}
    return {"count": len(seconds), "state_access_ms": state_access, "chunks": chunks}
