"""The public entry point: configure a `Job`, then `start()` a session or `run()` it once.

``Job(...).start(init)`` returns a running session (`StreamSession`: push events as they
come, query the state, close it for the `Result`); ``Job(...).run(events, init)`` is the
same engine on a finite input: start, push everything, close. Everything that can be
checked is checked before anything starts (schema errors cost no Ray or Spark start-up).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from txstream import topologies
from txstream.cluster.ray_runtime import check_dashboard, ray_address, ray_session
from txstream.cluster.topology import check_executors
from txstream.cluster.transport import RayTransport, ThreadTransport
from txstream.config import RunConfig
from txstream.connectors.extras import require_spark
from txstream.connectors.inputs import Events, checked_events, event_source, needs_spark, staged
from txstream.connectors.sources import SkippedSource, Source
from txstream.engine.plan import plan, with_key_type
from txstream.errors import UsageError
from txstream.monitor.console import Console
from txstream.monitor.logs import level_number, run_log
from txstream.nodes.session import NodesSession
from txstream.result import Result
from txstream.session import Session, StreamSession
from txstream.state.init import InitState

__all__ = ["Job", "Result"]


class Job:
    """A configured topology, e.g. ``Job("sl", scheduler="tstream", executors=2)``.

    Options are those of `txstream run` (see :class:`txstream.config.RunConfig`). The
    ``console`` shows phases, progress and warnings (default: on stderr, phases and bar
    only with ``progress``). The ``transport`` says how the team runs: the option
    (``"auto"``, ``"ray"``, ``"threads"``, see `RunConfig.transport`) or a transport
    object of one's own (e.g. ``ThreadTransport()`` in tests).
    """

    def __init__(
        self,
        topology: str = "sl",
        console: Console | None = None,
        transport: str | RayTransport | ThreadTransport = "auto",
        **options: Any,
    ):
        self.transport = None if isinstance(transport, str) else transport
        if self.transport is not None:
            transport = "ray" if self.transport.separate_processes else "threads"
        self.config = RunConfig(topology=topology, transport=transport, **options)
        self.console = console or Console(enabled=self.config.progress)

    def start(
        self, init_state: InitState, output: str | Path | None = None, name: str | None = None
    ) -> StreamSession:
        """Start a session from ``init_state`` (folder of ``<table>.parquet`` or Arrow
        tables by name). With ``output``, its outputs are committed there as they are
        written (``events/part-*.parquet``), then ``state/``, ``metrics.json`` and
        ``_SUCCESS`` at ``close()``. With ``name`` (on a Ray cluster, ``address``), other
        processes reach it with ``txstream query`` and ``txstream status``."""
        self._check_nodes(name=name)
        session_plan = self._plan(init_state, output, name=name)
        if self.config.nodes > 1:
            return NodesSession(session_plan, self.console)
        return Session(session_plan, console=self.console, transport=self.transport)

    def run(
        self,
        events: Events,
        init_state: InitState,
        output: str | Path | None = None,
        name: str | None = None,
    ) -> Result:
        """Run the job on ``events`` from ``init_state``: a session that gets all of
        ``events`` and closes. ``events``: what `event_source` takes (Arrow data, a Parquet
        file or folder read by Spark or pyarrow per ``source``, a Spark DataFrame of any
        classic Spark session, any Source), checked before anything starts. With
        ``output``, writes events.parquet, state/, metrics.json and _SUCCESS there,
        committed together at the end. With ``name``, outside readers can query it while
        it runs (see `start`)."""
        begin = time.perf_counter()
        self._check_nodes(name=name)
        cfg = with_key_type(self.config, init_state)
        events = checked_events(events, topologies.get(cfg.topology, cfg.key_type), cfg.source)
        session_plan = self._plan(
            init_state,
            output,
            name=name,
            progressive=False,
            source=events,
            queryable=name is not None,
        )
        try:
            with (
                run_log(output, self.config.log_level, self.config.verbose, self.console),
                ExitStack() as stack,
            ):
                source, ingest, job_config = self._open_source(events, stack, session_plan.topology)
                session_plan.expected_events = source.num_rows
                if self.config.nodes > 1:
                    with NodesSession(session_plan, self.console, job_config) as nodes:
                        nodes.startup_s = time.perf_counter() - begin  # Spark's included
                        nodes.extra_metrics = ingest
                        if nodes.resumed_from:  # the nodes' checkpoints cover the events before
                            source = SkippedSource(source, nodes.resumed_from)
                        nodes.push(source)
                        return nodes.close()
                with Session(session_plan, job_config, self.console, self.transport) as session:
                    session.startup_s = time.perf_counter() - begin  # Spark's included
                    session.extra_metrics = ingest
                    if session.resumed_from:  # a checkpoint covers the events before it
                        source = SkippedSource(source, session.resumed_from)
                    session.push(source)
                    return session.close()
        finally:
            session_plan.discard_unused()

    def _check_nodes(self, follow: bool = False, name: str | None = None) -> None:
        """What a run over several nodes does not take: UsageError."""
        cfg = self.config
        if cfg.nodes == 1:
            return
        if ray_address(cfg.address) is None:
            raise UsageError(f"--nodes {cfg.nodes} runs on a Ray cluster: give its --address")
        if follow:
            raise UsageError("--nodes N > 1 takes no --follow")

    def _plan(self, init_state: InitState, output: str | Path | None, **options: Any):
        """Everything checked before anything starts (`txstream.engine.plan`, Ray's
        dashboard's packages if asked); too many executors for the cores is a warning."""
        address = ray_address(self.config.address)  # a Ray Client address refused here
        if self.config.dashboard and address is None:
            check_dashboard()
        warning = check_executors(self.config.executors)
        session_plan = plan(self.config, init_state, output, **options)
        if warning:
            self.console.warn(warning)
        return session_plan

    def _open_source(
        self, events: Any, stack: ExitStack, topology: Any
    ) -> tuple[Source, dict, Any]:
        """The source of the checked ``events`` (`checked_events`); for Spark, started on
        a Ray with the JVM flags, then staged in input order (its seconds are returned,
        reported apart)."""
        if not needs_spark(events, self.config.source):
            return events, {}, None
        begin = time.perf_counter()
        job_config = self._start_spark(stack, events)
        started = time.perf_counter()
        with self.console.phase("staging the input"):
            exchange_dir = self.config.spark_exchange_dir
            source = staged(events, topology, self.config.source, exchange_dir)
            stack.callback(source.close)
        staged_at = time.perf_counter()
        spark_seconds = {
            "startup_s": round(started - begin, 3),
            "staging_s": round(staged_at - started, 3),
        }
        return source, {"spark": spark_seconds}, job_config

    def _start_spark(self, stack: ExitStack, events: Any = None) -> Any:
        """Ray (with the flags Spark's JVMs need) and Spark on it, for as long as ``stack``
        is open; the Ray job config that a session started on it must use. A Spark of the
        user's that is not on Ray (that of ``events`` if a DataFrame, else the active one)
        needs neither: nothing starts, and the session starts the Ray it needs."""
        from txstream.connectors import spark

        session = spark.staging_session(events)
        if session is not None and not spark.on_ray(session):
            return None
        require_spark("starting Spark on Ray", instead="source='arrow'")
        cfg, console = self.config, self.console
        job_config = spark.ray_job_config()
        stack.enter_context(
            ray_session(
                cfg.address,
                job_config,
                phase=console.phase,
                logging_level=level_number(cfg.log_level),
                dashboard=cfg.dashboard,
            )
        )
        stack.enter_context(spark.spark_session(console=console, log_level=cfg.log_level))
        return job_config

    def follow(
        self,
        folder: str | Path,
        init_state: InitState,
        output: str | Path,
        stop: threading.Event,
        name: str | None = None,
        on_files: Callable[[list[Path], int], None] | None = None,
    ) -> Result:
        """A session fed by ``folder``: every new complete Parquet file is pushed in name
        order (read by Spark or pyarrow, per ``source``) and its outputs committed, until a
        ``_STOP`` file appears or ``stop`` is set; then it closes
        (see `txstream.connectors.follow`)."""
        from txstream.connectors.follow import check_folder, follow

        self._check_nodes(follow=True, name=name)
        warning = check_folder(folder)
        session_plan = self._plan(init_state, output, name=name, queryable=name is not None)
        if warning:
            self.console.warn(warning)
        try:
            with (
                run_log(output, self.config.log_level, self.config.verbose, self.console),
                ExitStack() as stack,
            ):
                job_config = self._start_spark(stack) if self.config.source == "spark" else None
                with Session(session_plan, job_config, self.console, self.transport) as session:

                    def push(path: Path, skip: int = 0) -> None:
                        if not skip:
                            session.push(path)
                            return
                        cfg = self.config
                        source = event_source(
                            path, session.topology, cfg.source, cfg.spark_exchange_dir
                        )
                        if hasattr(source, "close"):  # staged by Spark
                            stack.callback(source.close)
                        session.push(SkippedSource(source, skip))

                    start = session.resumed_from
                    for f in session.resumed_files:  # the input after the checkpoint
                        if f["end"] > start:
                            push(Path(f["path"]), max(0, start - f["start"]))
                    seen = [Path(f["path"]).name for f in session.resumed_files]
                    follow(push, session.flush, folder, stop, on_files, seen)
                    return session.close()
        finally:
            session_plan.discard_unused()
