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
from txstream.cluster.ray_runtime import actor_failure, ray_session, start_actor, stop_actors
from txstream.cluster.spark import ray_job_config as spark_job_config
from txstream.cluster.topology import check_executors, host_topology
from txstream.config import RunConfig
from txstream.console import Console
from txstream.errors import PeerFailed, RuntimeFailure, UsageError
from txstream.logs import run_log
from txstream.sources import ArrowSource, Source
from txstream.state.chunk import sweep_segments
from txstream.state.init import InitState, read_init_state
from txstream.state.shared import SharedArray, new_run_id, run_prefix, sweep_stale_segments
from txstream.state.sync import ask_to_stop, seats, slots
from txstream.state.tables import SharedState
from txstream.topologies.api import Layout

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

    Options are those of `txstream run` (see :class:`txstream.config.RunConfig`). The
    ``console`` shows phases, progress and warnings (default: on stderr, phases and bar
    only with ``progress``).
    """

    def __init__(self, topology: str = "sl", console: Console | None = None, **options: Any):
        self.config = RunConfig(topology=topology, **options)
        self.console = console or Console(enabled=self.config.progress)

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
        warning = check_executors(cfg.executors)
        if warning:
            self.console.warn(warning)
        init = read_init_state(topology, init_state)
        layout = Layout.of(
            topology.tables, topology.sizes_from({k: t.num_rows for k, t in init.items()})
        )
        source, staged = self._open_source(events, topology)
        out_dir = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="txstream_"))
        try:
            with run_log(output, cfg.log_level, cfg.verbose, self.console), ExitStack() as stack:
                begin = time.perf_counter()
                job_config = spark_job_config() if staged else None
                stack.enter_context(
                    ray_session(
                        cfg.address, job_config, console=self.console, log_level=cfg.log_level
                    )
                )
                stage = (lambda: self._stage(source, topology, stack)) if staged else None
                metrics, state = self._execute(
                    topology, source, init, layout, cores, out_dir, begin, stage
                )
            result = Result(pq.ParquetFile(out_dir / "events.parquet").read(), state, metrics)
        finally:
            if output is None:
                shutil.rmtree(out_dir, ignore_errors=True)
        return result

    def _open_source(self, events: Any, topology) -> tuple[Any, bool]:
        """The event source, its schema checked, and whether Spark must stage it first
        (a Parquet path read by Spark: its footers, and Java, are checked before anything
        starts; or a Spark DataFrame)."""
        from txstream.cluster import spark

        if hasattr(events, "iter_batches"):
            topology.check_event_schema(events.schema)
            return events, False
        if spark.is_spark_dataframe(events):
            return events, True
        source = ArrowSource(events)
        topology.check_event_schema(source.schema)
        staged = not isinstance(events, pa.Table) and self.config.source == "spark"
        problem = spark.java_available() if staged else None
        if problem:
            raise UsageError(problem)
        return source, staged

    def _stage(self, events: Any, topology, stack: ExitStack) -> tuple[Source, dict]:
        """Start Spark on this Ray (unless it runs) and stage ``events`` in input order;
        the seconds of both (reported apart)."""
        from txstream.cluster import spark

        cfg, console = self.config, self.console
        begin = time.perf_counter()
        stack.enter_context(spark.spark_session(console=console, log_level=cfg.log_level))
        started = time.perf_counter()
        with console.phase("staging the input"):
            source = stack.enter_context(spark.SparkSource(events))
            topology.check_event_schema(source.schema)
        staged = time.perf_counter()
        spark_seconds = {"startup_s": round(started - begin, 3),
                         "staging_s": round(staged - started, 3)}  # fmt: skip
        return source, {"spark": spark_seconds}

    def _execute(self, topology, source, init, layout, cores, out_dir: Path, begin, stage):
        """Run the team over ``source``. ``stage`` (Spark's start and staging of Parquet
        files) runs once the team's actors are started, so that their start-up overlaps
        Spark's; ``startup_s`` counts from ``begin`` (before Ray's start)."""
        cfg = self.config
        ingest: dict = {}
        if stage is not None and not isinstance(source, ArrowSource):
            source, ingest = stage()  # a DataFrame: staging counts the rows the sets are sized by
            stage = None
        sweep_stale_segments()
        run_id = new_run_id()
        has_sets = any(t.distinct for t in topology.tables)
        set_capacity = (2 * (source.num_rows or DEFAULT_SET_CAPACITY)) if has_sets else 16
        actors: list = []
        with ExitStack() as stack:
            state = stack.enter_context(SharedState.create(run_id, layout, set_capacity))
            progress = SharedArray.create(run_id, "progress", (1,), "int64")
            stack.callback(progress.close)
            team = seats(cfg.placement, [socket for socket, _ in cores])
            sync = SharedArray.create(run_id, "sync", (slots(len(team), team[0].pools),), "int64")
            stack.callback(sync.close)
            stack.callback(sweep_segments, run_prefix(run_id))  # if an executor died
            state.load(topology, init)
            stack.callback(stop_actors, actors)
            sink = start_actor(Sink, str(out_dir), output_schema(topology), progress.handle)
            executors = [
                start_actor(
                    Executor,
                    cfg,
                    state.handle,
                    seat,
                    sync.handle,
                    run_prefix(run_id),
                    sink,
                    cpu,
                    label=f"Executor {seat.rank}",
                )
                for seat, (_, cpu) in zip(team, cores, strict=True)
            ]
            actors += [*executors, sink]
            serving = None
            if schedulers.get(cfg.scheduler).coordinated:
                coordinator = start_actor(
                    Coordinator, cfg, sync.handle, run_prefix(run_id), layout.cells
                )
                actors.append(coordinator)
                serving = coordinator.serve.remote()
            warm = [e.warm_up.remote(source.schema) for e in executors]
            controller = start_actor(ProgressController, cfg, executors)
            actors.append(controller)
            if stage is not None:
                source, ingest = stage()
            with self.console.phase(f"starting {len(team)} executor{'s' * (len(team) > 1)}"):
                self._get_watching(warm, serving)
            startup = time.perf_counter() - begin
            start = time.perf_counter()
            done = controller.run.remote(source)
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
        except ray.exceptions.GetTimeoutError as exc:
            raise RuntimeFailure(f"no progress within {self.config.timeout_s} s") from exc
        except ray.exceptions.RayError as exc:
            raise actor_failure(exc) from exc

    def _wait_with_progress(
        self, done: Any, progress: SharedArray, total: int | None, serving: Any | None
    ) -> None:
        """Wait for the run, with the event bar on the console; fail when no event got
        through for the run's timeout, or at once when the Coordinator (``serving``)
        fails or dies."""
        import ray

        deadline = time.monotonic() + self.config.timeout_s
        with self.console.progress(total, "running") as bar:
            while not ray.wait([done], timeout=0.1)[0]:
                if serving is not None and ray.wait([serving], timeout=0)[0]:
                    self._coordinator_ended(serving)
                    serving = None
                if int(progress.array[0]) > bar.n:
                    deadline = time.monotonic() + self.config.timeout_s
                elif time.monotonic() > deadline:
                    raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
                bar.update(int(progress.array[0]))
            bar.update(int(progress.array[0]))

    def _get_watching(self, refs: list, serving: Any | None) -> Any:
        """`_get` of ``refs``, failing at once if the Coordinator (``serving``) ends first
        (e.g. during warm-up, while executors wait for it to map their segment)."""
        import ray

        deadline = time.monotonic() + self.config.timeout_s
        while serving is not None and len(
            ray.wait(refs, num_returns=len(refs), timeout=0.1)[0]
        ) < len(refs):
            if ray.wait([serving], timeout=0)[0]:
                self._coordinator_ended(serving)
                break
            if time.monotonic() > deadline:
                break  # `_get` below reports the timeout
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
            "operations": sum(e["operations"] for e in run_info["executors"]),
            "startup_s": round(startup, 3),
            "phases_s": dict(self.console.phases),
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
