"""Sessions: a stream that stays up (contract §6, §7).

A `Session` owns a run's resources for as long as the user wants: a Ray (its own or the
caller's), the state and the team's synchronisation in shared memory, and the actors -
ProgressController, executors, Coordinator (for schedulers that need one), Sink. Events
are pushed as they come; outputs are written in ts order behind a *watermark*; queries
read the state as of a chunk boundary the watermark has reached; ``close()`` commits the
outputs and frees everything. `Job.run` is a session too: start, push everything, close.

Everything that can be checked is checked before anything starts (`plan`): the topology,
the init state, the cores, the output directory, a checkpoint to resume from. Whatever
fails later - an actor, the user's Ctrl-C - the session stops every actor it started,
unlinks its shared memory, removes what it wrote to temporary places and shuts down the
Ray it started; the failure surfaces on the next call, with its cause.

With a checkpoint folder, the session survives the death of any of its actors: it starts
a new team from the last checkpoint and pushes the input after it again
(`txstream.engine.recovery`); and a session started again on the folder of a killed one
continues where its last checkpoint left off.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
from txstream import schedulers, topologies
from txstream.actors.coordinator import Coordinator
from txstream.actors.executor import Executor, output_schema
from txstream.actors.progress import CONCURRENCY, ProgressController
from txstream.actors.sink import Sink
from txstream.cluster.ray_runtime import (
    actor_failure,
    ray_session,
    reachable_address,
    start_actor,
    stop_actors,
    wait_all,
)
from txstream.cluster.topology import host_topology
from txstream.config import RunConfig
from txstream.connectors.outputs import OutputDir, part_first_ts
from txstream.connectors.sources import ArrowSource, Source
from txstream.engine.outbox import Outbox
from txstream.engine.reaper import ensure_reaper
from txstream.engine.recovery import (
    FORMAT,
    CheckpointWriter,
    InputLog,
    Pushed,
    input_identity,
    resume_point,
)
from txstream.errors import ActorDied, PeerFailed, RuntimeFailure, TxstreamError, UsageError
from txstream.monitor.console import Console, Progress
from txstream.monitor.logs import captured, level_number
from txstream.monitor.metrics import run_metrics
from txstream.result import Result
from txstream.schedulers.team.placement import seats
from txstream.state.checkpoints import Checkpoint, CheckpointBuffer, CheckpointStore
from txstream.state.chunk import sweep_segments
from txstream.state.init import InitState, read_init_state
from txstream.state.layout import Layout
from txstream.state.operations import STATUS_NAMES
from txstream.state.shared import SharedArray, new_run_id, run_prefix, sweep_stale_segments
from txstream.state.snapshots import SnapshotRing
from txstream.state.sync import ask_to_stop, slots
from txstream.state.tables import SharedState
from txstream.topologies.api import Topology, conform_events

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
MAX_RECOVERIES = 3
"""Recoveries from one checkpoint without getting past it, before the session gives up."""

log = logging.getLogger(__name__)


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
    input: dict[str, Any] | None = None
    """What identifies a one-shot run's input (checkpoints of another input are refused)."""
    store: CheckpointStore | None = None
    resume: Checkpoint | None = None
    """The checkpoint of an interrupted run this session continues from."""

    @property
    def tables(self) -> dict[str, list[str]]:
        """The value columns of every table, by table name."""
        return {t.name: list(t.columns) for t in self.topology.tables}

    @property
    def set_capacity(self) -> int:
        """Slots of the distinct sets (twice the events, when known)."""
        if not any(t.distinct for t in self.topology.tables):
            return 16
        wanted = 2 * (self.expected_events or DEFAULT_SET_CAPACITY)
        return 1 << max(4, int(wanted - 1).bit_length())

    def discard_unused(self) -> None:
        """Remove what was prepared and not committed: the private output folder, or the
        ``_temporary`` of an output that was never committed (idempotent). An output
        that checkpoints can resume is kept."""
        if self.own_output:
            shutil.rmtree(self.output.path, ignore_errors=True)
        elif self.store is None or self.store.complete:
            self.output.abandon()


def plan(
    config: RunConfig,
    init_state: InitState,
    output: str | Path | None,
    *,
    name: str | None = None,
    progressive: bool = True,
    source: Any = None,
) -> SessionPlan:
    """Check everything a session needs before starting anything; UsageError,
    SchemaError or TopologyError otherwise. ``progressive``: outputs are committed as
    part files while the session runs (a one-shot run commits once, at the end).
    ``source``: a one-shot run's input (it identifies the run for checkpoints)."""
    topology = topologies.get(config.topology)
    cores = host_topology(config.sockets).assign(config.executors)
    init = read_init_state(topology, init_state)
    layout = Layout.of(
        topology.tables, topology.sizes_from({k: t.num_rows for k, t in init.items()})
    )
    if name is not None and not name:
        raise UsageError("a session name must not be empty")
    store = CheckpointStore(config.checkpoint_dir) if config.checkpoint_dir else None
    identity = input_identity(source) if source is not None else None
    resume = None
    if store is not None:
        resume = resume_point(
            store, {"topology": config.topology, "sizes": layout.sizes, "input": identity}
        )
    own = output is None
    if resume is not None:
        _check_resumable(resume, output, progressive)
    # absolute: the Sink writes from its own process, whose working folder may differ
    path = Path(tempfile.mkdtemp(prefix="txstream_")) if own else Path(output).resolve()
    out = OutputDir(path, overwrite=config.overwrite or own, progressive=progressive)
    try:
        out.prepare(resume=resume is not None)
    except BaseException:
        if own:
            shutil.rmtree(path, ignore_errors=True)
        raise
    expected = getattr(source, "num_rows", None)
    return SessionPlan(config, topology, init, layout, cores, out, own, name, expected,
                       identity, store, resume)  # fmt: skip


def _check_resumable(checkpoint: Checkpoint, output: str | Path | None, progressive: bool) -> None:
    """An interrupted run is resumed only into its own uncommitted output."""
    meta, where = checkpoint.meta, f"checkpoint {checkpoint.path}"
    if output is None or meta.get("output") is None:
        raise UsageError(
            f"{where} belongs to a run without an output directory, whose outputs cannot be "
            "resumed; remove it to start afresh"
        )
    out = OutputDir(Path(output), progressive=progressive)
    if meta["output"] != str(Path(output).resolve()) or out.run_token() != meta["output_run"]:
        raise UsageError(
            f"{where} belongs to the output {meta['output']}, not to {output}, or that output "
            "was committed or removed since; remove the checkpoints to start afresh"
        )
    if meta.get("progressive") != progressive:
        raise UsageError(f"{where} is of a {'session' if meta.get('progressive') else 'run'}")


class Session:
    """A running stream (module docstring); made by `Job.start` (or `Job.run`).

    Use it as a context manager: leaving the block closes it.
    """

    def __init__(self, plan: SessionPlan, job_config: object | None = None,
                 console: Console | None = None):  # fmt: skip
        self.plan = plan
        self.console = console or Console(enabled=plan.config.progress)
        self.config = plan.config
        self.topology = plan.topology
        self._stack = ExitStack()
        self._actors: list = []
        self._pids: list[int] = []
        self.resumed_from = plan.resume.ts if plan.resume else 0
        """The ts this session continues from (0: it started afresh)."""
        self._pushed = self.resumed_from
        self._table_pushes: list[tuple[int, int]] = []  # (end ts, bytes) of pushed tables
        self._sources: list[Any] = []
        self._inputs = InputLog(keep=plan.store is not None)
        self._failure: BaseException | None = None
        self._result: Result | None = None
        self._closing = False
        self._serving = None
        self._outbox: Outbox | None = None
        self._recovering = False
        self._writer: CheckpointWriter | None = None
        self._token: str | None = None
        self._launches = 0
        self.recoveries: list[dict[str, Any]] = []
        resumed = plan.resume.meta if plan.resume else {}
        self.last_batch_id = resumed.get("last_batch_id")
        """The last Spark micro-batch pushed (`txstream.connectors.streaming`), None if none."""
        if self.last_batch_id is None:
            self.last_batch_id = -1
        self.resumed_files = resumed.get("files", [])
        """Single files pushed before the resumed checkpoint (`txstream.connectors.follow`)."""
        self.extra_metrics: dict[str, Any] = {}
        """Metrics the caller adds (e.g. Spark's start-up), written with the session's."""
        if plan.resume:  # said at once, not only in the summary at the end
            self.console.note(f"resuming from {plan.resume.path} at event {self.resumed_from:,}")
        try:
            begin = time.perf_counter()
            self._allocate(job_config)
            self._launch(self.resumed_from)
            self.startup_s = time.perf_counter() - begin
            self._started = time.perf_counter()
        except BaseException:
            self._teardown(failed=True)
            raise

    # ---------------------------------------------------------------- start-up
    def _allocate(self, job_config: object | None) -> None:
        """What lives as long as the session: shared memory, Ray, the checkpoint writer."""
        cfg, plan, stack = self.config, self.plan, self._stack
        sweep_stale_segments()
        ensure_reaper()  # what a SIGKILL of this process would leave is removed at once
        run_id = new_run_id()
        self._prefix = run_prefix(run_id)
        self._state = stack.enter_context(
            SharedState.create(run_id, plan.layout, plan.set_capacity)
        )
        if plan.resume is not None:
            self._restore(plan.resume)
        else:
            self._state.load(self.topology, plan.init)
        self._watermark = SharedArray.create(run_id, "watermark", (2,), "int64")
        stack.callback(self._watermark.close)
        self._team = seats(cfg.placement, [socket for socket, _ in plan.cores])
        words = slots(len(self._team))
        self._sync = SharedArray.create(run_id, "sync", (words,), "int64")
        stack.callback(self._sync.close)
        self._snapshots = SnapshotRing.create(run_id, plan.layout.cells)
        stack.callback(self._snapshots.close)
        stack.callback(sweep_segments, self._prefix)  # if an executor died
        self._buffer = None
        if plan.store is not None:
            self._buffer = CheckpointBuffer.create(run_id, self._state)
            stack.callback(self._buffer.close)
            self._token = plan.resume.meta["output_run"] if plan.resume else secrets.token_hex(8)
            self._writer = CheckpointWriter(
                self._buffer, plan.store, lambda: int(self._watermark.array[COMMITTED]),
                self._checkpoint_meta, self._inputs.release,
            )  # fmt: skip
            stack.callback(self._writer.stop)
            if plan.resume is None:
                plan.store.clear()
                plan.output.mark_run(self._token)
                self._write_checkpoint_now(0)
        stack.enter_context(
            ray_session(
                cfg.address,
                job_config,
                phase=self.console.phase,
                # Ray's own records (its start, its token authentication) are for the run's
                # log; without one (a session of a Python program), only its errors show
                logging_level=level_number(cfg.log_level)
                if captured() or cfg.verbose
                else logging.ERROR,
            )
        )
        stack.callback(self._stop_actors)

    def _restore(self, checkpoint: Checkpoint) -> None:
        for name in ("values", "set_cells", "set_members"):
            want, got = getattr(self._state, name).shape, checkpoint.load(name).shape
            if want != got:
                raise UsageError(
                    f"checkpoint {checkpoint.path} is of another state size ({name} {got}, "
                    f"here {want}); use another --checkpoint-dir or remove it"
                )
        checkpoint.restore(self._state)

    def _launch(self, ts: int) -> None:
        """Start a team (and its Coordinator, Sink and ProgressController) on the state as
        it stands, which is as after the first ``ts`` events; push the input after ``ts``
        again if some was pushed already."""
        cfg, plan, topology = self.config, self.plan, self.topology
        self._sync.array[:] = 0
        self._snapshots.reset(self._state.values, ts)
        self._watermark.array[:] = (ts, ts)
        if self._buffer is not None:
            self._buffer.reset(ts)
        plan.output.drop_parts_from(ts)
        sweep_segments(self._prefix)
        sink = start_actor(Sink, plan.output, output_schema(topology), self._watermark.handle, ts)
        self._actors.append(sink)
        buffer = self._buffer.handle if self._buffer is not None else None
        executors = [
            start_actor(
                Executor,
                cfg,
                self._state.handle,
                seat,
                self._sync.handle,
                self._prefix,
                self._snapshots.handle,
                sink,
                cpu,
                buffer,
                label=f"Executor {seat.rank}",
            )  # fmt: skip
            for seat, (_, cpu) in zip(self._team, plan.cores, strict=True)
        ]
        self._actors += executors
        self._serving = None
        if schedulers.get(cfg.scheduler).coordinator_policies(cfg):
            coordinator = start_actor(Coordinator, cfg, self._sync.handle, self._prefix)
            self._actors.append(coordinator)
            self._serving = coordinator.serve.remote()
        self._controller = start_actor(
            ProgressController, cfg, topology.event_schema, executors, sink,
            self._watermark.handle, self._snapshots.handle, plan.layout, plan.tables, buffer, ts,
            name=plan.name, namespace=NAMESPACE if plan.name else None,
            concurrency_groups=CONCURRENCY,
        )  # fmt: skip
        self._actors.append(self._controller)
        self._sink, self._executors = sink, executors
        team = f"starting {len(executors)} executor{'s' * (len(executors) > 1)}"
        with self.console.phase(team if self._launches == 0 else f"re{team}"):
            self._pids = self._get_watching(
                [e.warm_up.remote(topology.event_schema) for e in executors]
            )
        self._running = self._controller.run.remote()
        self._outbox = Outbox(self._controller.push.remote, cfg.timeout_s)
        self._launches += 1
        for pushed, events in self._inputs.after(ts):
            self._send(events, pushed.start if pushed.start > ts else ts)
        if self._closing:
            self._to_controller(self._outbox.drain)
            self._controller.close.remote()

    # ---------------------------------------------------------------- the stream
    def push(self, events: Any, batch_id: int | None = None) -> None:
        """Append ``events`` to the stream: an Arrow table or record batch, a Parquet
        file or folder, a Spark DataFrame (of the running Spark on this Ray) or any
        `Source`. Returns at once unless too much pushed input is pending. A wrong
        schema raises `SchemaError` and applies nothing; the session goes on.
        ``batch_id``: the Spark micro-batch these events are (`txstream.connectors.streaming`)."""
        self._poll()
        if isinstance(events, pa.RecordBatch):
            events = pa.Table.from_batches([events])
        if isinstance(events, pa.Table):
            self.topology.check_event_schema(events.schema)
            data: pa.Table | Source = events
        else:
            data = self.source(events)
        rows = data.num_rows
        if rows:
            kind = "table" if isinstance(data, pa.Table) else "source"
            pushed = Pushed(self._pushed, self._pushed + rows, batch_id=batch_id, **{kind: data})
            self._inputs.record(pushed)
            self._send(data, self._pushed)
            self._pushed += rows
        if batch_id is not None:
            self.last_batch_id = batch_id
        if isinstance(data, pa.Table):
            self._wait_for_room()

    def _send(self, data: pa.Table | Source, start: int) -> None:
        """Hand events ``start..`` to the ProgressController: tables through the outbox,
        a source once the tables before it are taken in."""
        if isinstance(data, pa.Table):
            outbox = self._outbox
            self._to_controller(lambda: outbox.put(conform_events(data, self.topology.event_schema),
                                                   time.time()))  # fmt: skip
            self._table_pushes.append((start + data.num_rows, data.nbytes))
        else:
            self._to_controller(self._outbox.drain)
            self._controller.push_source.remote(data)

    def _to_controller(self, action: Callable[[], None]) -> None:
        """``action`` on the outbox; if it fails because the ProgressController died, the
        session recovers instead (its replay sends the input again), when it can."""
        launches = self._launches
        try:
            action()
        except RuntimeFailure:
            ray.wait([self._running], timeout=self.config.timeout_s)  # the controller's end
            if self._recovering:
                self._get(self._running)  # its death (ActorDied): the recovery starts over
                raise
            self._poll()
            if self._launches == launches:
                raise

    def source(self, events: Any) -> Source:
        """A source for ``events`` (not a table): a Parquet path is read with Spark or
        pyarrow per the ``source`` option; its schema checked."""
        from txstream.connectors import spark

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
                        "txstream.connectors.spark.spark_session) or use source='arrow'"
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
            self._poll()
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
        """How many events were pushed so far (with those before `resumed_from`)."""
        return self._pushed

    def flush(self) -> int:
        """Wait until every pushed event is done and its outputs are committed; the
        watermark (= events pushed)."""
        self._poll()
        asked = 0

        def done() -> bool:
            return self._watermark.array[COMMITTED] >= self._pushed or asked != self._launches

        while self._watermark.array[COMMITTED] < self._pushed:
            if asked != self._launches:  # a recovery started a new ProgressController
                asked = self._launches
                self._to_controller(self._outbox.drain)
                self._controller.flush.remote(self._pushed)
            self._wait_until(done)
        return self.watermark

    @property
    def checkpointing(self) -> bool:
        """Whether the session writes checkpoints (and so recovers from failures)."""
        return self._writer is not None

    def checkpoint(self) -> int:
        """Flush, then write a checkpoint of the state as of every pushed event (the team
        is idle: nothing may be pushed meanwhile); its ts. Needs a checkpoint folder."""
        if self._writer is None:
            raise UsageError("checkpoint() needs a checkpoint folder (checkpoint_dir)")
        ts = self.flush()
        self._write_checkpoint_now(ts)
        return ts

    def _write_checkpoint_now(self, ts: int) -> None:
        arrays = {n: getattr(self._state, n) for n in ("values", "set_cells", "set_members")}
        self._writer.write_now(ts, arrays, self._checkpoint_meta(ts))

    def _checkpoint_meta(self, ts: int) -> dict[str, Any]:
        plan = self.plan
        return {
            "format": FORMAT,
            "topology": self.config.topology,
            "sizes": plan.layout.sizes,
            "input": plan.input,
            "output": None if plan.own_output else str(plan.output.path.resolve()),
            "output_run": self._token,
            "progressive": plan.output.progressive,
            **self._inputs.position(ts),
        }

    def query(self, table: str, keys: list[int] | None = None) -> tuple[int, pa.Table]:
        """``(w, rows)``: the table's rows (``key`` + value columns; the given keys in that
        order, or every key) as the state stands after exactly the first ``w``
        transactions, where ``w`` is a watermark the session has reached. Never part of a
        batch; ingestion does not wait for it."""
        self._poll()
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
        self._closing = True
        self._to_controller(self._outbox.drain)
        self._controller.close.remote()
        bar = self._wait_with_progress()
        run_info = self._get(self._running)
        ask_to_stop(self._sync.array)
        coordinator = self._get(self._serving) if self._serving is not None else None
        summary = self._get(self._sink.finish.remote())
        seconds = time.perf_counter() - self._started
        self._get([e.close.remote() for e in self._executors])
        tables = self._state.tables(self.topology)
        output = self.plan.output
        parts = [pq.read_table(p) for p in output.parts()]
        events = pa.concat_tables(parts) if parts else output_schema(self.topology).empty_table()
        if self.recoveries or self.resumed_from:  # the last Sink saw only the last events
            counts = pc.value_counts(events.column("status")).to_pylist()
            summary.update(dict.fromkeys(STATUS_NAMES, 0), events=events.num_rows)
            summary.update({c["values"]: c["counts"] for c in counts})
        metrics = {
            **run_metrics(summary, run_info, seconds),
            "coordinator": coordinator,
            "startup_s": round(self.startup_s, 3),
            "phases_s": dict(self.console.phases),
            "executor_cores": [
                {"socket": socket, "cpus": e["cpus"]}
                for (socket, _), e in zip(self.plan.cores, run_info["executors"], strict=True)
            ],
            "recoveries": self.recoveries,
            "checkpoints": None if self._writer is None else {
                "written": self._writer.count, "seconds": round(self._writer.seconds, 3)},
            "config": {**self.config.as_dict(), "pushed": self._pushed,
                       "resumed_from": self.resumed_from},
        }  # fmt: skip
        if self.resumed_from and seconds > 0:  # this process ran the events after it only
            metrics["throughput_eps"] = round((events.num_rows - self.resumed_from) / seconds, 1)
        metrics.update(self.extra_metrics)
        output.commit(tables, json.dumps(metrics, indent=2) + "\n")
        bar.close(metrics["throughput_eps"], metrics["seconds"])  # the summary's figures
        if self.plan.store is not None:
            self.plan.store.mark_complete()
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

    def _stop_actors(self) -> None:
        """Kill every actor of the team and wait until its executors' processes are gone
        (a dying executor must not write into the state after it was restored). What the
        outbox held is dropped: it is in the input log, which a recovery replays."""
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
        stop_actors(self._actors)
        self._actors.clear()
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in self._pids):
            if time.monotonic() > deadline:
                raise RuntimeFailure("an executor's process does not exit")
            time.sleep(0.01)
        self._pids = []

    # ---------------------------------------------------------------- health
    def _poll(self) -> None:
        """Raise the session's failure, if it failed; recover from the death of an actor
        first when checkpoints allow it."""
        if self._result is not None:
            raise UsageError("the session is closed")
        if self._failure is not None:
            raise self._failure
        if self._writer is not None and self._writer.failure is not None:
            self._failure = RuntimeFailure(f"writing a checkpoint failed: {self._writer.failure}")
            raise self._failure
        calls = [r for r in (self._running, self._serving) if r is not None]
        if not ray.wait(calls, num_returns=1, timeout=0)[0]:
            return
        if self._closing and ray.wait([self._running], timeout=0)[0] and self._ended_well():
            return
        cause = self._cause()
        while isinstance(cause, ActorDied):
            try:
                if not self._recover(cause):
                    break
                return
            except ActorDied as again:  # an actor died during the recovery: once more
                cause = again
            except TxstreamError as failed:
                cause = failed
        self._failure = cause
        raise cause

    def _ended_well(self) -> bool:
        try:
            self._get(self._running)
        except TxstreamError:
            return False
        return True

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

    def _recover(self, cause: ActorDied) -> bool:
        """A new team from the last complete checkpoint; False if it cannot be done (no
        checkpoints, or recovering from the same one again and again)."""
        if self._writer is None:
            return False
        begin = time.perf_counter()
        with self._writer.paused():
            checkpoint = self.plan.store.latest()
            stuck = [r for r in self.recoveries if r["from_ts"] == checkpoint.ts]
            if len(stuck) >= MAX_RECOVERIES:
                return False
            log.warning("recovering from checkpoint %s after: %s", checkpoint.ts, cause)
            self.recoveries.append({
                "cause": str(cause).splitlines()[0][:300], "watermark": self.watermark,
                "from_ts": checkpoint.ts, "seconds": None,
            })  # fmt: skip
            phases = {
                "stop_s": self._stop_actors,
                "restore_s": lambda: checkpoint.restore(self._state),
                "launch_s": lambda: self._launch(checkpoint.ts),
            }
            self._recovering = True
            try:
                for name, phase in phases.items():
                    started = time.perf_counter()
                    phase()
                    self.recoveries[-1][name] = round(time.perf_counter() - started, 3)
            finally:
                self._recovering = False
        self.recoveries[-1]["seconds"] = round(time.perf_counter() - begin, 3)
        return True

    def _wait_until(self, done: Callable[[], bool]) -> None:
        """Wait for ``done()``, failing if the session fails or nothing gets through for
        the run's timeout."""
        deadline = time.monotonic() + self.config.timeout_s
        progress = self._progress()
        while not done():
            self._poll()
            if self._progress() != progress:
                progress, deadline = self._progress(), time.monotonic() + self.config.timeout_s
            elif time.monotonic() > deadline:
                raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            time.sleep(0.001)

    def _progress(self) -> tuple[int, int]:
        """What changes while the session gets on: its watermark, or a new team."""
        return self.watermark, self._launches

    def _get(self, refs: Any) -> Any:
        """ray.get with the run's timeout; user and engine errors keep their own type, the
        death of an actor's process is `ActorDied`."""
        try:
            return ray.get(refs, timeout=self.config.timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise RuntimeFailure(f"no progress within {self.config.timeout_s} s") from exc
        except ray.exceptions.RayError as exc:
            raise actor_failure(exc) from exc

    def _wait_with_progress(self) -> Progress:
        """Wait for the run to end, with the event bar on the console (its rate is the
        metrics' one: events since `resumed_from` over the seconds since the start); fail
        when no event got through for the run's timeout, or at once when an actor fails
        (recovering from a death when checkpoints allow). The bar, for its last line."""
        bar = self.console.progress(self._pushed, "running", self._started, self.resumed_from)
        with bar:
            bar.update(self.watermark)
            deadline = time.monotonic() + self.config.timeout_s
            progress = self._progress()
            while not ray.wait([self._running], timeout=0.1)[0] or not self._ended_well():
                self._poll()
                if self._progress() != progress:
                    progress, deadline = self._progress(), time.monotonic() + self.config.timeout_s
                    bar.update(self.watermark)
                elif time.monotonic() > deadline:
                    raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            bar.update(self.watermark)
        return bar

    def _get_watching(self, refs: list) -> Any:
        """The results of ``refs``, failing at once if one fails (its peers may wait for
        it) or if the Coordinator ends first (e.g. during warm-up, while executors wait
        for it to map their segment)."""
        deadline = time.monotonic() + self.config.timeout_s
        while self._serving is not None and len(
            ray.wait(refs, num_returns=len(refs), timeout=0.1)[0]
        ) < len(refs):
            if ray.wait([self._serving], timeout=0)[0]:
                self._get(self._serving)
                raise RuntimeFailure("the Coordinator stopped before the end of the run")
            self._get(ray.wait(refs, num_returns=len(refs), timeout=0)[0])  # one failed?
            if time.monotonic() > deadline:
                break  # reported below
        try:
            return wait_all(refs, self.config.timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise RuntimeFailure(f"no progress within {self.config.timeout_s} s") from exc
        except ray.exceptions.RayError as exc:
            raise actor_failure(exc) from exc


def attach(address: str, name: str) -> Any:
    """The front door (ProgressController) of the session named ``name`` on the Ray cluster
    at ``address``, for outside readers; connects this process to that cluster."""
    if not ray.is_initialized():
        gcs = reachable_address(address)  # ray.init would retry an unreachable one forever
        ray.init(address=gcs, namespace=NAMESPACE, logging_level=logging.ERROR,
                 log_to_driver=False)  # fmt: skip
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as exc:
        raise UsageError(f"no session named {name!r} on the Ray cluster at {address}") from exc
