"""Sessions: a stream that stays up (SPEC §6).

A `Session` owns a run's resources for as long as the user wants: a Ray (its own or the
caller's), the state and the team's synchronisation in shared memory, and the actors -
ProgressController, executors, Coordinator (for schedulers that need one), Sink. Events
are pushed as they come; outputs are written in ts order behind a *watermark*; queries
read the state as of a chunk boundary the watermark has reached; ``close()`` commits the
outputs and frees everything. `Job.run` is a session too: start, push everything, close.

Everything that can be checked is checked before anything starts (`plan`): the topology,
the init state, the cores, the output directory. Whatever fails later - an actor, the
user's Ctrl-C - the session stops every actor it started, unlinks its shared memory,
removes what it wrote to temporary places and shuts down the Ray it started; the failure
surfaces on the next call, with its cause.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from txstream import schedulers, topologies
from txstream.actors.coordinator import Coordinator
from txstream.actors.executor import Executor, output_schema
from txstream.actors.progress import CONCURRENCY, ProgressController
from txstream.actors.sink import Sink
from txstream.cluster.ray_runtime import ray_session, start_actor, stop_actors
from txstream.cluster.topology import host_topology
from txstream.config import RunConfig
from txstream.errors import PeerFailed, RuntimeFailure, TxstreamError, UsageError
from txstream.metrics import run_metrics
from txstream.outbox import Outbox
from txstream.output import EVENTS, OutputDir, part_first_ts
from txstream.result import Result
from txstream.sources import ArrowSource, Source, conform_events
from txstream.state.chunk import sweep_segments
from txstream.state.init import InitState, read_init_state
from txstream.state.shared import SharedArray, new_run_id, run_prefix, sweep_stale_segments
from txstream.state.snapshots import SnapshotRing
from txstream.state.sync import ask_to_stop, seats, slots
from txstream.state.tables import SharedState
from txstream.topologies.api import Layout, Topology

DEFAULT_SET_CAPACITY = 1 << 20
"""Distinct-set slots when the number of events is not known in advance (a session)."""
MAX_PENDING_BYTES = 128 * 1024**2
"""Pushed tables not yet processed, beyond which `push` waits (they hold memory in the
outbox or the object store); sources (files, Spark) are read by the ProgressController at
its own pace."""
NAMESPACE = "txstream"
"""Ray namespace of named sessions, where `txstream query/status` look for them."""
WRITTEN, COMMITTED = 0, 1
"""Words of the watermark array: outputs written (the watermark), and committed."""


@dataclass
class SessionPlan:
    """A session checked and ready to start; nothing is running yet."""

    config: RunConfig
    topology: Topology
    init: dict[str, pa.Table]
    layout: Layout
    cores: list[tuple[int, int]]
    output: OutputDir
    own_output: bool
    """The output is a private temporary folder (no output asked for): removed at the end."""
    name: str | None
    expected_events: int | None = None

    @property
    def tables(self) -> dict[str, list[str]]:
        """The value columns of every table, by table name."""
        return {t.name: list(t.columns) for t in self.topology.tables}

    def discard_unused(self) -> None:
        """Remove what was prepared and not committed: the private output folder, or the
        ``_temporary`` of an output that was never committed (idempotent)."""
        if self.own_output:
            shutil.rmtree(self.output.path, ignore_errors=True)
        else:
            self.output.abandon()


def plan(
    config: RunConfig,
    init_state: InitState,
    output: str | Path | None,
    *,
    name: str | None = None,
    progressive: bool = True,
) -> SessionPlan:
    """Check everything a session needs before starting anything; UsageError,
    SchemaError or TopologyError otherwise. ``progressive``: outputs are committed as
    part files while the session runs (a one-shot run commits once, at the end)."""
    topology = topologies.get(config.topology)
    cores = host_topology(config.sockets).assign(config.executors)
    init = read_init_state(topology, init_state)
    layout = Layout.of(
        topology.tables, topology.sizes_from({k: t.num_rows for k, t in init.items()})
    )
    if name is not None and not name:
        raise UsageError("a session name must not be empty")
    own = output is None
    path = Path(tempfile.mkdtemp(prefix="txstream_")) if own else Path(output)
    out = OutputDir(path, overwrite=config.overwrite or own, progressive=progressive)
    try:
        out.prepare()
    except BaseException:
        if own:
            shutil.rmtree(path, ignore_errors=True)
        raise
    return SessionPlan(config, topology, init, layout, cores, out, own, name)


class Session:
    """A running stream (module docstring); made by `Job.start` or `Session.start`.

    Use it as a context manager: leaving the block closes it.
    """

    def __init__(self, plan: SessionPlan, job_config: object | None = None):
        self.plan = plan
        self.config = plan.config
        self.topology = plan.topology
        self._stack = ExitStack()
        self._actors: list = []
        self._pushed = 0
        self._table_pushes: list[tuple[int, int]] = []  # (end ts, bytes) of pushed tables
        self._sources: list[Any] = []
        self._failure: BaseException | None = None
        self._result: Result | None = None
        self._serving = None
        self.last_batch_id = -1
        """The last Spark micro-batch pushed (`txstream.streaming`)."""
        self.extra_metrics: dict[str, Any] = {}
        """Metrics the caller adds (e.g. Spark's start-up), written with the session's."""
        try:
            self._start(job_config)
        except BaseException:
            self._teardown(failed=True)
            raise

    @classmethod
    def start(cls, config: RunConfig, init_state: InitState, output: str | Path | None = None,
              name: str | None = None) -> Session:  # fmt: skip
        """Plan and start a session (see `txstream.Job.start`)."""
        return cls(plan(config, init_state, output, name=name))

    # ---------------------------------------------------------------- start-up
    def _start(self, job_config: object | None) -> None:
        cfg, plan, stack = self.config, self.plan, self._stack
        topology, layout = self.topology, plan.layout
        begin = time.perf_counter()
        sweep_stale_segments()
        run_id = new_run_id()
        has_sets = any(t.distinct for t in topology.tables)
        capacity = 2 * (plan.expected_events or DEFAULT_SET_CAPACITY) if has_sets else 16
        self._state = stack.enter_context(SharedState.create(run_id, layout, capacity))
        self._state.load(topology, plan.init)
        self._watermark = SharedArray.create(run_id, "watermark", (2,), "int64")
        stack.callback(self._watermark.close)
        team = seats(cfg.placement, [socket for socket, _ in plan.cores])
        self._sync = SharedArray.create(run_id, "sync", (slots(len(team), team[0].pools),), "int64")
        stack.callback(self._sync.close)
        self._snapshots = SnapshotRing.create(run_id, layout.cells)
        stack.callback(self._snapshots.close)
        self._snapshots.publish(self._state.values, 0, 0)
        stack.callback(sweep_segments, run_prefix(run_id))  # if an executor died
        stack.enter_context(ray_session(cfg.address, job_config=job_config))
        stack.callback(stop_actors, self._actors)
        sink = start_actor(Sink, plan.output, output_schema(topology), self._watermark.handle)
        self._actors.append(sink)
        executors = [
            start_actor(
                Executor,
                cfg,
                self._state.handle,
                seat,
                self._sync.handle,
                run_prefix(run_id),
                self._snapshots.handle,
                sink,
                cpu,
            )  # fmt: skip
            for seat, (_, cpu) in zip(team, plan.cores, strict=True)
        ]
        self._actors += executors
        if schedulers.get(cfg.scheduler).coordinated:
            coordinator = start_actor(
                Coordinator, cfg, self._sync.handle, run_prefix(run_id), layout.cells
            )
            self._actors.append(coordinator)
            self._serving = coordinator.serve.remote()
        self._controller = start_actor(
            ProgressController, cfg, topology.event_schema, executors, sink,
            self._watermark.handle, self._snapshots.handle, layout, plan.tables,
            name=plan.name, namespace=NAMESPACE if plan.name else None,
            concurrency_groups=CONCURRENCY,
        )  # fmt: skip
        self._actors.append(self._controller)
        self._outbox = Outbox(self._controller.push.remote, cfg.timeout_s)
        stack.callback(self._outbox.close)
        self._sink, self._executors = sink, executors
        self._get_watching([e.warm_up.remote(topology.event_schema) for e in executors])
        self.startup_s = time.perf_counter() - begin
        self._started = time.perf_counter()
        self._running = self._controller.run.remote()

    # ---------------------------------------------------------------- the stream
    def push(self, events: Any, batch_id: int | None = None) -> None:
        """Append ``events`` to the stream: an Arrow table or record batch, a Parquet
        file or folder, a Spark DataFrame (of the running Spark on this Ray) or any
        `Source`. Returns at once unless too much pushed input is pending. A wrong
        schema raises `SchemaError` and applies nothing; the session goes on.
        ``batch_id``: the Spark micro-batch these events are (`txstream.streaming`)."""
        self._check()
        self._push(events)
        if batch_id is not None:
            self.last_batch_id = batch_id

    def _push(self, events: Any) -> None:
        if isinstance(events, pa.RecordBatch):
            events = pa.Table.from_batches([events])
        if isinstance(events, pa.Table):
            self.topology.check_event_schema(events.schema)
            if events.num_rows == 0:
                return
            self._outbox.put(conform_events(events, self.topology.event_schema), time.time())
            self._pushed += events.num_rows
            self._table_pushes.append((self._pushed, events.nbytes))
            self._wait_for_room()
            return
        source = self._source(events)
        if source.num_rows == 0:
            return
        self._outbox.drain()  # the tables pushed before it go first
        self._controller.push_source.remote(source)
        self._pushed += source.num_rows

    def _source(self, events: Any) -> Source:
        """A source for ``events`` (not a table), its schema checked."""
        from txstream.cluster import spark

        if spark.is_spark_dataframe(events):
            source = spark.SparkSource(events)
            self._sources.append(source)
        elif hasattr(events, "iter_batches"):
            source = events
        elif isinstance(events, str | Path):
            source = ArrowSource(events)
            if self.config.source == "spark":
                if not spark.spark_running():
                    raise UsageError(
                        "source 'spark' reads pushed files with Spark: start it (see "
                        "txstream.cluster.spark.spark_session) or use source='arrow'"
                    )
                source = spark.SparkSource(source)
                self._sources.append(source)
        else:
            raise UsageError(f"cannot push a {type(events).__name__}: push Arrow, Parquet or Spark")
        if source.num_rows is None:
            raise UsageError("a pushed source must know its number of rows")
        self.topology.check_event_schema(source.schema)
        return source

    def _wait_for_room(self) -> None:
        """Back-pressure: wait while the pushed tables not yet processed hold too much."""
        while True:
            watermark = self.watermark
            self._table_pushes = [
                (end, size) for end, size in self._table_pushes if end > watermark
            ]
            if sum(size for _, size in self._table_pushes) <= MAX_PENDING_BYTES:
                return
            self._check()
            time.sleep(0.001)

    @property
    def watermark(self) -> int:
        """How many events (ts below it) have their transactions decided and outputs
        written."""
        return int(self._watermark.array[WRITTEN])

    @property
    def committed(self) -> int:
        """How many events (ts below it) have their outputs committed: what `outputs`
        yields (at most the watermark)."""
        return int(self._watermark.array[COMMITTED])

    @property
    def pushed(self) -> int:
        """How many events were pushed so far."""
        return self._pushed

    def flush(self) -> int:
        """Wait until every pushed event is done and its outputs are committed; the
        watermark (= events pushed)."""
        self._check()
        self._outbox.drain()
        self._controller.flush.remote(self._pushed)
        self._wait_until(lambda: self._watermark.array[COMMITTED] >= self._pushed)
        return self.watermark

    def query(self, table: str, keys: list[int] | None = None) -> tuple[int, pa.Table]:
        """``(w, rows)``: the table's rows (``key`` + value columns; the given keys in that
        order, or every key) as the state stands after exactly the first ``w``
        transactions, where ``w`` is a watermark the session has reached. Never part of a
        batch; ingestion does not wait for it."""
        self._check()
        return self._snapshots.query(self.plan.layout, self.plan.tables, table, keys,
                                     lambda: self.watermark, self.config.timeout_s)  # fmt: skip

    def outputs(self, since: int = 0) -> Iterator[pa.RecordBatch]:
        """The committed output rows from ts ``since`` on, in ts order, as record batches:
        what is committed when each part is reached (`flush` commits everything pushed)."""
        if not self.plan.output.progressive:
            raise UsageError("outputs() is for sessions; a one-shot run returns its Result")
        for part in self.plan.output.parts():
            first = part_first_ts(part.name)
            table = pq.read_table(part)
            if first + table.num_rows <= since:
                continue
            yield from table.slice(max(0, since - first)).to_batches()

    # ---------------------------------------------------------------- the end
    def close(self) -> Result:
        """Process everything pushed, commit the outputs (``_SUCCESS`` last), free every
        resource; the `Result`. Again after success: the same Result. After a failure:
        frees everything and raises the failure."""
        if self._result is not None:
            return self._result
        if self._failure is not None:
            self._teardown(failed=True)
            raise self._failure
        try:
            self._result = self._finish()
        except BaseException as exc:
            self._failure = exc if isinstance(exc, TxstreamError) else self._failure
            self._teardown(failed=True)
            raise
        self._teardown(failed=False)
        return self._result

    def _finish(self) -> Result:
        self._outbox.drain()
        self._controller.close.remote()
        self._wait_with_progress()
        run_info = self._get(self._running)
        ask_to_stop(self._sync.array)
        coordinator = self._get(self._serving) if self._serving is not None else None
        summary = self._get(self._sink.finish.remote())
        seconds = time.perf_counter() - self._started
        self._get([e.close.remote() for e in self._executors])
        tables = self._state.tables(self.topology)
        metrics = {
            **run_metrics(summary, run_info, seconds),
            "coordinator": coordinator,
            "startup_s": round(self.startup_s, 3),
            "executor_cores": [
                {"socket": socket, "cpus": e["cpus"]}
                for (socket, _), e in zip(self.plan.cores, run_info["executors"], strict=True)
            ],
            "config": {**self.config.as_dict(), "pushed": self._pushed},
        }
        metrics.update(self.extra_metrics)
        output = self.plan.output
        output.commit(tables, json.dumps(metrics, indent=2) + "\n")
        if output.progressive:
            parts = [pq.read_table(p) for p in output.parts()]
            events = (
                pa.concat_tables(parts) if parts else output_schema(self.topology).empty_table()
            )
        else:
            events = pq.read_table(output.path / EVENTS)
        return Result(events, tables, metrics)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._failure = self._failure or RuntimeFailure("the session was interrupted")
            self._teardown(failed=True)

    def _teardown(self, failed: bool) -> None:
        """Stop everything this session started (idempotent)."""
        for source in self._sources:
            try:
                source.close()
            except Exception:  # Spark already gone: nothing left to free
                pass
        self._sources = []
        self._stack.close()
        if failed or self.plan.own_output:
            self.plan.discard_unused()

    # ---------------------------------------------------------------- health
    def _check(self) -> None:
        """Raise the session's failure, if it has failed (now or before)."""
        if self._result is not None:
            raise UsageError("the session is closed")
        if self._failure is not None:
            raise self._failure
        calls = [r for r in (self._running, self._serving) if r is not None]
        if ray.wait(calls, num_returns=1, timeout=0)[0]:
            self._failure = self._cause()
            raise self._failure

    def _cause(self) -> BaseException:
        """Why the ProgressController's loop or the Coordinator ended before `close`: the
        root cause, not an executor that stopped because a peer failed."""
        try:
            if self._serving is not None and ray.wait([self._serving], timeout=0)[0]:
                self._get(self._serving)
                return RuntimeFailure("the Coordinator stopped before the end of the session")
            self._get(self._running)
            return RuntimeFailure("the ProgressController stopped before the end of the session")
        except PeerFailed:
            try:
                self._get(self._running)  # the executor that failed first
            except TxstreamError as exc:
                return exc
            return RuntimeFailure("an executor failed")
        except TxstreamError as exc:
            return exc

    def _wait_until(self, done: Any) -> None:
        """Wait for ``done()``, failing if the session fails or nothing gets through for
        the run's timeout."""
        deadline = time.monotonic() + self.config.timeout_s
        watermark = self.watermark
        while not done():
            self._check()
            if self.watermark > watermark:
                watermark, deadline = self.watermark, time.monotonic() + self.config.timeout_s
            elif time.monotonic() > deadline:
                raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            time.sleep(0.001)

    def _get(self, refs: Any) -> Any:
        """ray.get with the run's timeout; user and engine errors keep their own type."""
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

    def _wait_with_progress(self) -> None:
        """Wait for the run to end, with a progress bar on stderr once it takes over 2 s;
        fail when no event got through for the run's timeout, or at once when the
        Coordinator fails or dies."""
        from tqdm import tqdm

        with tqdm(total=self._pushed, unit="ev", unit_scale=True, delay=2.0, file=sys.stderr,
                  disable=not self.config.progress, desc=self.config.topology) as bar:  # fmt: skip
            bar.update(self.watermark)
            deadline = time.monotonic() + self.config.timeout_s
            while not ray.wait([self._running], timeout=0.1)[0]:
                self._check_coordinator()
                if self.watermark > bar.n:
                    bar.update(self.watermark - bar.n)
                    deadline = time.monotonic() + self.config.timeout_s
                elif time.monotonic() > deadline:
                    raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            bar.update(self.watermark - bar.n)

    def _get_watching(self, refs: list) -> Any:
        """`_get` of ``refs``, failing at once if the Coordinator ends first (e.g. during
        warm-up, while executors wait for it to map their segment)."""
        deadline = time.monotonic() + self.config.timeout_s
        while self._serving is not None and len(
            ray.wait(refs, num_returns=len(refs), timeout=0.1)[0]
        ) < len(refs):
            self._check_coordinator()
            if time.monotonic() > deadline:
                break  # `_get` below reports the timeout
        return self._get(refs)

    def _check_coordinator(self) -> None:
        """Raise if the Coordinator's call ended before the run: its error, unless it only
        stopped because an executor failed (the run's own result tells why)."""
        if self._serving is None or not ray.wait([self._serving], timeout=0)[0]:
            return
        try:
            self._get(self._serving)
        except PeerFailed:
            self._serving = None
            return
        raise RuntimeFailure("the Coordinator stopped before the end of the run")


def attach(address: str, name: str) -> Any:
    """The front door (ProgressController) of the session named ``name`` on the Ray cluster
    at ``address``, for outside readers; connects this process to that cluster."""
    import logging

    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR,
                 log_to_driver=False)  # fmt: skip
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as exc:
        raise UsageError(f"no session named {name!r} on the Ray cluster at {address}") from exc
