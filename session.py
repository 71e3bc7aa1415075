"""Sessions: a stream that stays up (contract §6, §7).

`StreamSession` is what a running session promises, on one host or several: `Job.start`
returns a `Session` (one host) or a `txstream.nodes.session.NodesSession` (``nodes`` > 1),
which take the same calls with the same arguments and keep the same promises, so a program
does not depend on where its team runs.

A `Session` is the stream API: events are pushed as they come; outputs are written in ts
order behind a *watermark*; queries read the state as of a chunk boundary the watermark has
reached; ``close()`` commits the outputs and frees everything. `Job.run` is a session too:
start, push everything, close.

What runs behind it is the engine's (`txstream.engine`): the plan checked before anything
starts, the team the `Engine` assembles, the watermark words, checkpoints and recovery
(`Checkpointing`), the outbox of pushed tables. Whatever fails - an actor, the user's
Ctrl-C - the session stops every actor it started, frees its shared memory, removes what it
wrote to temporary places and shuts down the Ray it started; the failure surfaces on the
next call, with its cause. With a checkpoint folder, the session survives the death of any
of its actors: a new team from the last checkpoint, the input after it pushed again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from functools import partial
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
from txstream.actors.executor import InPlace, output_schema
from txstream.cluster.ray_runtime import reachable_address
from txstream.cluster.transport import RayTransport, ThreadTransport
from txstream.connectors.inputs import Events, event_source
from txstream.connectors.outputs import file_stamps, part_first_ts, read_events
from txstream.connectors.sources import ArrowSource, Source
from txstream.engine.engine import NAMESPACE, Engine
from txstream.engine.live import LiveTeam
from txstream.engine.outbox import Outbox
from txstream.engine.plan import Plan
from txstream.engine.recovery import Checkpointing, InputLog, Pushed
from txstream.errors import ActorDied, RuntimeFailure, TxstreamError, UsageError
from txstream.monitor.console import Console, ProgressBar
from txstream.monitor.live_metrics import Figures, RunCollector
from txstream.monitor.metrics import session_metrics
from txstream.monitor.metrics_server import MetricsServer, serve_metrics
from txstream.monitor.ray_metrics import RayMetricsExport, metrics_agent_running
from txstream.result import Result
from txstream.state.keys import dense_keys
from txstream.state.operations import STATUS_NAMES
from txstream.state.values import typed_table
from txstream.topologies.api import conform_events

DRAIN_POLL_S = 0.00005
"""How often `drain` looks at the watermark: a node of a run over several drains once per
level, on the critical path between nodes."""
MAX_PENDING_BYTES = 128 * 1024**2
"""Pushed tables not yet processed, beyond which `push` waits (they hold memory in the
outbox or the object store); sources (files, Spark) are read by the ProgressController at
its own pace."""


@runtime_checkable
class StreamSession(Protocol):
    """A running stream of events (contract §6): push events as they come, read the state
    and the outputs behind the watermark, close it for the `Result`. Leaving a ``with``
    block closes it (after an exception: stops everything, commits nothing).

    Events get ts 0, 1, ... in the order pushed (after those a resumed checkpoint covers).
    Whatever fails surfaces on the next call, with its cause.
    """

    def push(self, events: Events, batch_id: int | None = None) -> None:
        """Append ``events`` to the stream: whatever
        `txstream.connectors.inputs.event_source` takes (Arrow data, Parquet files, a
        Spark DataFrame, a Source). A wrong schema raises `SchemaError` and applies
        nothing; another kind of input, `UsageError`. May return before the events are
        processed. ``batch_id``: the Spark micro-batch these events are
        (`txstream.connectors.streaming`: each is applied once)."""
        ...

    def flush(self) -> int:
        """Wait until every pushed event is processed and its outputs are committed; the
        watermark (= every event pushed)."""
        ...

    def query(self, table: str, keys: list[int] | None = None) -> tuple[int, pa.Table]:
        """``(w, rows)``: the rows of ``table`` (``key`` + value columns; the given keys in
        that order, or every key) as the state stands after exactly the first ``w``
        events, ``w`` a watermark the session reached (never part of a batch). UsageError
        for an unknown table or key."""
        ...

    def outputs(self, since: int = 0) -> Iterator[pa.RecordBatch]:
        """The committed output rows from ts ``since`` on, in ts order, as record batches
        (after `flush`: those of every event pushed). UsageError in a one-shot run, which
        returns its outputs in its Result."""
        ...

    @property
    def watermark(self) -> int:
        """How many events (ts below it) are processed: their transactions decided and
        their outputs written."""
        ...

    last_batch_id: int
    """The last Spark micro-batch pushed, or covered by the checkpoint resumed from; -1 if
    none."""

    @property
    def checkpointing(self) -> bool:
        """Whether the session writes checkpoints (and so recovers from failures)."""
        ...

    def checkpoint(self) -> int:
        """Flush, then write a checkpoint of the state as of every pushed event; its ts.
        UsageError without a checkpoint folder."""
        ...

    def close(self) -> Result:
        """Process everything pushed, commit the outputs, free every resource; the
        `Result`. Again after success: the same Result."""
        ...

    def __enter__(self) -> StreamSession: ...

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...


class Session:
    """A running stream on one host (module docstring; its promises: `StreamSession`);
    made by `Job.start` (or `Job.run`).

    Use it as a context manager: leaving the block closes it. ``transport``: how the team
    runs (default: the plan's ``--transport``, see `transport_for`).
    """

    def __init__(
        self,
        plan: Plan,
        job_config: object | None = None,
        console: Console | None = None,
        transport: RayTransport | ThreadTransport | None = None,
    ):
        self.plan = plan
        self.console = console or Console(enabled=plan.config.progress)
        self.config = plan.config
        self.topology = plan.topology
        self.resumed_from = plan.resume.ts if plan.resume else 0
        """The ts this session continues from (0: it started afresh)."""
        self._pushed = self.resumed_from
        self._table_pushes: list[tuple[int, int]] = []  # (end ts, bytes) of pushed tables
        self._sources: list[Any] = []
        self._failure: BaseException | None = None
        self._result: Result | None = None
        self._closing = False
        self._recovering = False
        self._outbox: Outbox | None = None
        self._engine: Engine | None = None
        self._checkpoints: Checkpointing | None = None
        resumed = plan.resume.meta if plan.resume else {}
        self._inputs = InputLog(plan.store is not None, resumed.get("last_batch_id"))
        self.last_batch_id = resumed.get("last_batch_id")
        """The last Spark micro-batch pushed (`txstream.connectors.streaming`), -1 if none."""
        if self.last_batch_id is None:
            self.last_batch_id = -1
        self.resumed_files = resumed.get("files", [])
        """Single files pushed before the resumed checkpoint (`txstream.connectors.follow`)."""
        self.extra_metrics: dict[str, Any] = {}
        """Metrics the caller adds (e.g. Spark's start-up), written with the session's."""
        self._live: LiveTeam | None = None
        self._collector = RunCollector(plan.label, self.config.topology, self._figures)
        """The run's live metrics."""
        self._metrics: MetricsServer | None = None
        self._ray_metrics: RayMetricsExport | None = None
        if plan.resume:  # said at once, not only in the summary at the end
            self.console.note(f"resuming from {plan.resume.path} at event {self.resumed_from:,}")
        try:
            # first: a port in use fails at once
            self._metrics = serve_metrics(
                self.config, self._collector, self._alive, self._ready, self.console
            )
            begin = time.perf_counter()
            self._engine = Engine(plan, self.console, transport, job_config)
            self._live = LiveTeam(self._engine)
            if self._engine.transport.separate_processes and metrics_agent_running():
                self._ray_metrics = RayMetricsExport(self._collector)
            if plan.store is not None:
                self._checkpoints = Checkpointing(plan, self._engine, self._inputs)
            # the launch empties the checkpoint buffer in two steps: a writer between them
            # wrote the buffer, never filled, as the resumed checkpoint (all zeros)
            with self._checkpoints.writer.paused() if self._checkpoints else nullcontext():
                self._launch(self.resumed_from)
            self.startup_s = time.perf_counter() - begin
            self._started = time.perf_counter()
        except BaseException:
            self._teardown(failed=True)
            raise

    def _launch(self, ts: int) -> None:
        """A team on the state as after the first ``ts`` events; the input after ``ts``
        pushed again if some was pushed already."""
        engine = self._engine
        engine.launch(ts)
        self._outbox = Outbox(engine.controller.push.remote, self.config.timeout_s)
        for pushed, events in self._inputs.after(ts):
            self._send(events, pushed.start if pushed.start > ts else ts)
        if self._closing:
            self._to_controller(self._outbox.drain)
            engine.controller.close.remote()

    # ---------------------------------------------------------------- the stream
    def push(self, events: Events, batch_id: int | None = None) -> None:
        """Append ``events`` to the stream (`StreamSession.push`): what `event_source`
        takes, Parquet files read with Spark or pyarrow per the ``source`` option. Returns
        at once unless too much pushed input is pending; after a wrong schema, the session
        goes on. ``batch_id``: the Spark micro-batch these events are; a checkpoint
        remembers the last one it covers (`txstream.connectors.streaming`)."""
        self._poll()
        cfg = self.config
        source = event_source(events, self.topology, cfg.source, cfg.spark_exchange_dir)
        made = source is not events
        if made and hasattr(source, "close"):  # staged by Spark for this push
            self._sources.append(source)
        # Arrow data pushed as such goes through the outbox, under back-pressure
        # (`MAX_PENDING_BYTES`); a Source is read by the ProgressController at its pace
        table = source.table if made and isinstance(source, ArrowSource) else None
        data: pa.Table | Source = source if table is None else table
        rows = data.num_rows
        if rows:
            kind = "table" if table is not None else "source"
            pushed = Pushed(self._pushed, self._pushed + rows, batch_id=batch_id, **{kind: data})
            self._inputs.record(pushed)
            self._send(data, self._pushed)
            self._pushed += rows
        if batch_id is not None:
            self.last_batch_id = batch_id
        if table is not None:
            self._wait_for_room()

    def _send(self, data: pa.Table | Source, start: int) -> None:
        """Hand events ``start..`` to the ProgressController: tables through the outbox,
        a source once the tables before it are taken in."""
        if isinstance(data, pa.Table):
            outbox, schema = self._outbox, self.topology.event_schema
            self._to_controller(lambda: outbox.put(conform_events(data, schema), time.time()))
            self._table_pushes.append((start + data.num_rows, data.nbytes))
        else:
            self._to_controller(self._outbox.drain)
            self._engine.controller.push_source.remote(data)

    def _to_controller(self, action: Callable[[], None]) -> None:
        """``action`` on the outbox; if it fails because the ProgressController died, the
        session recovers instead (its replay sends the input again), when it can."""
        engine = self._engine
        launches = engine.launches
        try:
            action()
        except RuntimeFailure:
            engine.ended([engine.running], self.config.timeout_s)  # the controller's end
            if self._recovering:
                engine.get(engine.running)  # its death (ActorDied): the recovery starts over
                raise
            self._poll()
            if engine.launches == launches:
                raise

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
        return self._engine.watermark.written

    @property
    def committed(self) -> int:
        """How many events (ts below it) have their outputs committed: what `outputs`
        yields (at most the watermark)."""
        return self._engine.watermark.committed

    @property
    def pushed(self) -> int:
        """How many events were pushed so far (with those before `resumed_from`)."""
        return self._pushed

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """The recoveries so far: cause, checkpoint, seconds per phase."""
        return self._checkpoints.recoveries if self._checkpoints else []

    def flush(self) -> int:
        """Wait until every pushed event is done and its outputs are committed; the
        watermark (= events pushed)."""
        self._poll()
        engine, asked = self._engine, 0

        def done() -> bool:
            return self.committed >= self._pushed or asked != engine.launches

        while self.committed < self._pushed:
            if asked != engine.launches:  # a recovery started a new ProgressController
                asked = engine.launches
                self._to_controller(self._outbox.drain)
                engine.controller.flush.remote(self._pushed)
            self._wait_until(done)
        return self.watermark

    def drain(self) -> int:
        """Wait until every pushed event is decided and its outputs written (not committed:
        cheaper than `flush` when nothing needs to be read back from the output); the
        watermark."""
        self._poll()
        self._wait_until(lambda: self.watermark >= self._pushed, DRAIN_POLL_S)
        return self.watermark

    @property
    def checkpointing(self) -> bool:
        """Whether the session writes checkpoints (and so recovers from failures)."""
        return self._checkpoints is not None

    def checkpoint(self) -> int:
        """Flush, then write a checkpoint of the state as of every pushed event (the team
        is idle: nothing may be pushed meanwhile); its ts. Needs a checkpoint folder."""
        if self._checkpoints is None:
            raise UsageError("checkpoint() needs a checkpoint folder (checkpoint_dir)")
        ts = self.flush()
        self._checkpoints.write_now(ts)
        return ts

    def query(self, table: str, keys: list[int] | None = None) -> tuple[int, pa.Table]:
        """``(w, rows)``: the table's rows (``key`` + value columns; the given keys in that
        order, or every key) as the state stands after exactly the first ``w``
        transactions, where ``w`` is a watermark the session has reached. Never part of a
        batch; ingestion does not wait for it."""
        self._poll()
        plan = self.plan
        if plan.keys and table in plan.keys:  # by natural key: the controller's index
            return self._engine.get(self._engine.controller.query.remote(table, keys))
        keys = dense_keys(table, keys)
        ts, rows = self._engine.snapshots.query(
            plan.layout, plan.tables, table, keys, lambda: self.watermark, self.config.timeout_s
        )
        return ts, typed_table(rows, plan.value_types[table])

    def set_cells(self, cells: np.ndarray, values: np.ndarray) -> None:
        """Overwrite ``cells`` of the flat state; only between `drain` (or `flush`) and the
        next push,
        when the team is idle. How a node of a run over several takes in the values of
        other nodes' cells that its next transactions read (`txstream.nodes`)."""
        self._engine.state.write(cells, values)

    def read_cells(self, cells: np.ndarray) -> np.ndarray:
        """The values of ``cells`` of the flat state; only between `drain` (or `flush`) and
        the next push (see `set_cells`)."""
        return self._engine.state.values[cells].copy()

    def in_place(self, events: pa.Table) -> InPlace:
        """``events`` to run straight on the state by the calling thread, without the team
        (`txstream.actors.executor.InPlace`), a range at a time: not pushed, of no ts of
        the session's; their output rows (ts from 0), which the session does not keep. Only
        between `drain` and the next push (see `set_cells`): how a node of a run over
        several runs its small steps."""
        events = conform_events(events, self.topology.event_schema)
        return InPlace(self.topology, self._engine.state, events, self.config.udf_cost_us)

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

    def abandon(self) -> None:
        """Stop everything and commit nothing: what was written goes, as after a failure
        (a node of a run over several, whose outputs its driver merged and committed)."""
        self._failure = self._failure or UsageError("the session was abandoned")
        self._teardown(failed=True)

    def _finish(self) -> Result:
        self._closing = True
        engine = self._engine
        self._to_controller(self._outbox.drain)
        engine.controller.close.remote()
        bar = self._wait_with_progress()
        indexes = engine.get(engine.controller.key_indexes.remote()) if self.plan.keys else None
        run_info, coordinator, summary = engine.finish()
        seconds = time.perf_counter() - self._started
        tables = engine.take_tables(indexes)
        output = self.plan.output
        schema = output_schema(self.topology)
        if self.recoveries or self.resumed_from:  # the last Sink saw only the last events
            status = read_events(output.parts(), schema, ["status"]).column("status")
            summary.update(dict.fromkeys(STATUS_NAMES, 0), events=len(status))
            summary.update({c["values"]: c["counts"] for c in pc.value_counts(status).to_pylist()})
        metrics = session_metrics(
            summary,
            run_info,
            seconds,
            coordinator=coordinator,
            startup_s=self.startup_s,
            phases_s=dict(self.console.phases),
            cores=self.plan.cores,
            recoveries=self.recoveries,
            checkpoints=self._checkpoints.report() if self._checkpoints else None,
            table_rows={name: table.num_rows for name, table in tables.items()},
            config={
                **self.config.as_dict(),
                "pushed": self._pushed,
                "resumed_from": self.resumed_from,
            },
        )
        if self.resumed_from and seconds > 0:  # this process ran the events after it only
            metrics["throughput_eps"] = round((metrics["events"] - self.resumed_from) / seconds, 1)
        metrics.update(self.extra_metrics)
        output.commit(tables, json.dumps(metrics, indent=2) + "\n")
        bar.close(metrics["throughput_eps"], metrics["seconds"])  # the summary's figures
        if self.plan.store is not None:
            self.plan.store.mark_complete()
        files = output.committed_events()
        events = partial(read_events, files, schema, stamps=file_stamps(files))
        # a private output folder goes with the run: its events are read now
        return Result(events() if self.plan.own_output else events, tables, metrics)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._failure = self._failure or RuntimeFailure("the session was interrupted")
            self._teardown(failed=True)

    def _teardown(self, failed: bool) -> None:
        """Stop everything this session started (idempotent). What the outbox held is
        dropped: it is in the input log, which a recovery replays."""
        for exporter in (self._metrics, self._ray_metrics):  # first: they read shared memory
            if exporter is not None:
                exporter.close()
        self._metrics = self._ray_metrics = None
        for source in self._sources:
            try:
                source.close()
            except Exception:  # Spark already gone: nothing left to free
                pass
        self._sources = []
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
        if self._checkpoints is not None:
            self._checkpoints.stop()
        if self._engine is not None:
            self._engine.close()
        if failed or self.plan.own_output:
            self.plan.discard_unused()

    # ---------------------------------------------------------------- health
    def _alive(self) -> bool:
        """Whether the session goes on (it has not failed)."""
        return self._failure is None

    def _ready(self) -> bool:
        """Whether the team runs: not while it starts, recovers, ends or has failed."""
        engine = self._engine
        running = engine is not None and engine.running is not None
        if not running or self._recovering or not self._alive():
            return False
        return engine.team_alive() and not engine.stopped()

    def _figures(self) -> Figures | None:
        """What a scrape of the live metrics reads (None before the team exists)."""
        engine, live, ready = self._engine, self._live, self._ready()
        team = live.read(ask=ready) if live is not None else None  # a dead team never answers
        if team is None:
            return None
        written, committed = engine.watermark.written, engine.watermark.committed
        writer = self._checkpoints.writer if self._checkpoints else None
        newest = writer.newest_at if writer else None
        return Figures(
            pushed=self._pushed,
            watermark=written,
            committed=committed,
            backlog_bytes=sum(size for end, size in self._table_pushes if end > written),
            statuses=team["statuses"],
            reasons=team["reasons"],
            latency=team["latency"],
            chunks=team["chunks"],
            executors=team["executors"],
            checkpoints=writer.count if writer else 0,
            checkpoint_seconds=writer.seconds if writer else 0.0,
            checkpoint_age_s=None if newest is None else max(0.0, time.time() - newest),
            recoveries=len(self.recoveries),
            rows=engine.state.rows(),
            decisions=team["decisions"],
            ready=ready,
        )

    def _poll(self) -> None:
        """Raise the session's failure, if it failed; recover from the death of an actor
        first when checkpoints allow it."""
        if self._result is not None:
            raise UsageError("the session is closed")
        if self._failure is not None:
            raise self._failure
        if self._checkpoints is not None and self._checkpoints.failure is not None:
            failure = self._checkpoints.failure
            self._failure = RuntimeFailure(f"writing a checkpoint failed: {failure}")
            raise self._failure
        engine = self._engine
        if not engine.stopped():
            return
        if self._closing and engine.ended([engine.running]) and engine.ended_well():
            return
        cause = engine.cause()
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

    def _recover(self, cause: ActorDied) -> bool:
        """A new team from the last checkpoint (`Checkpointing.recover`)."""
        if self._checkpoints is None:
            return False
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
        self._recovering = True
        try:
            return self._checkpoints.recover(cause, self._launch)
        finally:
            self._recovering = False

    def _wait_until(self, done: Callable[[], bool], poll_s: float = 0.001) -> None:
        """Wait for ``done()`` (asked every ``poll_s``), failing if the session fails or
        nothing gets through for the run's timeout."""
        deadline = time.monotonic() + self.config.timeout_s
        moved = self._movement()
        while not done():
            self._poll()
            if self._movement() != moved:
                moved, deadline = self._movement(), time.monotonic() + self.config.timeout_s
            elif time.monotonic() > deadline:
                raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            time.sleep(poll_s)

    def _movement(self) -> tuple[int, int]:
        """What changes while the session gets on: its watermark, or a new team."""
        return self.watermark, self._engine.launches

    def _wait_with_progress(self) -> ProgressBar:
        """Wait for the run to end, with the event bar on the console (its rate is the
        metrics' one: events since `resumed_from` over the seconds since the start); fail
        when no event got through for the run's timeout, or at once when an actor fails
        (recovering from a death when checkpoints allow). The bar, for its last line."""
        engine = self._engine
        bar = self.console.progress(self._pushed, "running", self._started, self.resumed_from)
        with bar:
            bar.update(self.watermark)
            deadline = time.monotonic() + self.config.timeout_s
            moved = self._movement()
            while not engine.ended([engine.running], 0.1) or not engine.ended_well():
                self._poll()
                if self._movement() != moved:
                    moved, deadline = self._movement(), time.monotonic() + self.config.timeout_s
                    bar.update(self.watermark)
                elif time.monotonic() > deadline:
                    raise RuntimeFailure(f"no progress within {self.config.timeout_s} s")
            bar.update(self.watermark)
        return bar


def attach(address: str, name: str) -> Any:
    """The front door (ProgressController) of the session named ``name`` on the Ray cluster
    at ``address``, for outside readers; connects this process to that cluster."""
    if not ray.is_initialized():
        gcs = reachable_address(address)  # ray.init would retry an unreachable one forever
        ray.init(address=gcs, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as exc:
        raise UsageError(f"no session named {name!r} on the Ray cluster at {address}") from exc
