"""The engine: assembles a team from a `Plan`, runs it, tells how it fares, tears it down.

A team is the state and synchronisation words in shared memory, the executors (one per
seat, pinned to their cores), the Coordinator (for schedulers whose aborts need one), the
Sink and the ProgressController that feeds them. The *transport* says how the actors run
(`txstream.cluster.transport`): as Ray actors, or as threads of this process, with the same
classes and wiring (`--transport`; a local run takes threads: no Ray to start).

The shared memory lives as long as the engine; the actors as long as a launch: a recovery
stops them, restores the state and launches new ones on the same memory (`stop`, `restore`,
`launch`). Whatever happens, `close` stops every actor, unlinks every segment and ends the
Ray it started.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np
import pyarrow as pa
from txstream import schedulers
from txstream.actors.coordinator import Coordinator
from txstream.actors.executor import LIVE_COLUMNS, Executor, rows_schema
from txstream.actors.progress import CONCURRENCY, ProgressController
from txstream.actors.sink import Sink
from txstream.cluster.ray_runtime import actor_failure
from txstream.cluster.scratch import sweep_abandoned_outputs
from txstream.cluster.transport import (
    RayTransport,
    ThreadTransport,
    ended,
    get,
    transport_for,
    wait_all,
)
from txstream.engine.plan import Plan
from txstream.engine.reaper import ensure_reaper
from txstream.errors import PeerFailed, RuntimeFailure, TxstreamError, UsageError
from txstream.monitor.console import Console
from txstream.monitor.logs import captured, level_number
from txstream.schedulers.team.placement import seats
from txstream.state.checkpoints import Checkpoint, CheckpointBuffer
from txstream.state.chunk import sweep_segments
from txstream.state.keys import KeyIndex, StreamKeys, restored_indexes
from txstream.state.shared import SharedArray, new_run_id, run_prefix, sweep_stale_segments
from txstream.state.snapshots import SnapshotRing
from txstream.state.sync import ask_to_stop, sync_words
from txstream.state.tables import SharedState, with_keys
from txstream.state.watermark import Watermark

NAMESPACE = "txstream"
"""Ray namespace of named sessions, where `txstream query/status` look for them."""

Transport = RayTransport | ThreadTransport


def arrow_from_malloc() -> None:
    """Arrow's buffers in this process from malloc, which keeps freed memory for the next
    chunk (`keep_freed_memory`), instead of pyarrow's default mimalloc: with mimalloc, a
    team of threads reading Parquet stalls on some reads for tens of milliseconds, and its
    throughput varies from run to run."""
    pa.set_memory_pool(pa.system_memory_pool())


def spare_cpus(cores: list[tuple[int, int]]) -> set[int]:
    """The CPUs of this process that no executor is pinned to (``cores``: the plan's
    (socket, cpu) per executor).

    With threads, the ProgressController's thread runs there: left to the kernel's
    scheduler with the Sink's, it would share the executor's core now and then. The Sink's
    thread is left to the scheduler: an executor running a kernel made for its statements
    is fast enough to wait for its feeders a good part of a run, and the Sink then writes
    on its core (docs/performance.md); but not beside an executor 0 that runs chunks alone,
    its peers' cores idle (`ProgressController._pin`)."""
    return set(os.sched_getaffinity(0)) - {cpu for _, cpu in cores}


class Engine:
    """A team's shared memory for as long as the engine lives, and its actors per launch
    (module docstring). ``job_config``: the Ray job config of a Ray started for Spark."""

    def __init__(
        self,
        plan: Plan,
        console: Console,
        transport: Transport | None = None,
        job_config: object | None = None,
    ):
        self.plan = plan
        self.config = plan.config
        self.console = console
        self.transport = transport or transport_for(
            self.config.transport,
            self.config.address,
            bool(plan.name),
            plan.store is not None,
            self.config.dashboard,
        )
        self.launches = 0
        """Teams launched so far (a recovery launches another)."""
        self.launched: tuple[int, int, Any, Any] = (0, 0, None, None)
        """The team launched last as one value: (launches, its first event, its Sink, its
        ProgressController), for readers on other threads (a scrape) to take as a whole."""
        self._stack = ExitStack()
        self._actors: list = []
        self._pids: list[int] = []
        self.controller: Any = None
        self.sink: Any = None
        self.executors: list = []
        self.running: Any = None
        """The ProgressController's loop: ends with the run (its report) or its failure."""
        self.serving: Any = None
        """The Coordinator's loop, if the scheduler needs one."""
        try:
            self._allocate(job_config)
        except BaseException:
            self.close()
            raise

    def _allocate(self, job_config: object | None) -> None:
        cfg, plan, stack = self.config, self.plan, self._stack
        sweep_stale_segments()
        sweep_abandoned_outputs()
        ensure_reaper()  # what a SIGKILL of this process would leave is removed at once
        run_id = new_run_id()
        self.prefix = run_prefix(run_id)
        # a key is its row (`Layout`) or in its table's key index: the key columns go
        # before the state is allocated, which the init values alone then stand beside
        init = {name: table.drop_columns(["key"]) for name, table in plan.take_init().items()}
        self.state = stack.enter_context(SharedState.create(run_id, plan.layout, plan.set_capacity))
        if plan.resume is not None:
            self.restore(plan.resume)
        else:
            self.state.load(plan.topology, init)
        del init
        self.watermark = Watermark.create(run_id)
        stack.callback(self.watermark.close)
        self.seats = seats(cfg.placement, [socket for socket, _ in plan.cores])
        self._sync = SharedArray.create(run_id, "sync", (sync_words(len(self.seats)),), "int64")
        stack.callback(self._sync.close)
        self.live = SharedArray.create(run_id, "live", (len(self.seats), LIVE_COLUMNS), "float64")
        """Each executor's row of live figures (`LIVE_COLUMNS`), written after every chunk."""
        stack.callback(self.live.close)
        self.live_before = np.zeros(self.live.handle.shape)
        """What the executors of the teams before this one had published."""
        self.snapshots = SnapshotRing.create(run_id, plan.layout.cells) if plan.queryable else None
        if self.snapshots is not None:
            stack.callback(self.snapshots.close)
        stack.callback(sweep_segments, self.prefix)  # if an executor died
        self.buffer = None
        if plan.store is not None:
            self.buffer = CheckpointBuffer.create(run_id, self.state)
            stack.callback(self.buffer.close)
        # Ray's own records (its start, its token authentication) are for the run's log;
        # without one (a session of a Python program), only its errors show
        ray_logging = level_number(cfg.log_level) if captured() or cfg.verbose else logging.ERROR
        stack.enter_context(
            self.transport.session(
                cfg.address, job_config, self.console.phase, ray_logging, cfg.dashboard
            )
        )
        stack.callback(self.stop)

    def restore(self, checkpoint: Checkpoint) -> None:
        """The state as ``checkpoint`` has it (no team running)."""
        for name, got in checkpoint.shapes().items():
            want = getattr(self.state, name).shape
            if want != got:
                raise UsageError(
                    f"checkpoint {checkpoint.path} is of another state size ({name} {got}, "
                    f"here {want}); use another --checkpoint-dir or remove it"
                )
        checkpoint.restore(self.state)
        if self.plan.keys:  # the rows of natural keys as they were then
            self.plan.keys = restored_indexes(self.plan.keys, checkpoint.load)

    def key_arrays(self) -> dict[str, np.ndarray]:
        """The key indexes of tables of natural keys as a checkpoint stores them (the
        team's, once it runs)."""
        if not self.plan.keys:
            return {}
        if self.controller is None:
            return StreamKeys(self.plan.keys, self.plan.topology.key_columns).arrays()
        return self.get(self.controller.key_arrays.remote())

    def launch(self, ts: int) -> None:
        """Start a team (Sink, executors, Coordinator, ProgressController) on the state as
        it stands, which is as after the first ``ts`` events, and warm it up."""
        cfg, plan, topology, transport = self.config, self.plan, self.plan.topology, self.transport
        if not transport.separate_processes:
            arrow_from_malloc()
        self.first_ts = ts
        """The first event of the team launched last."""
        self._sync.array[:] = 0
        published = self.live.array.copy()
        self.live.array[:] = 0  # a scrape meanwhile reads less, never twice (`LiveTeam`)
        self.live_before = self.live_before + published
        if self.snapshots is not None:
            self.snapshots.reset(self.state.values, ts)
        self.watermark.reset(ts)
        if self.buffer is not None:
            self.buffer.reset(ts)
        plan.output.drop_parts_from(ts)
        sweep_segments(self.prefix)
        self.state.unmap_pages()  # the team's mappings hold the state while it runs
        sink = transport.start(
            Sink,
            plan.output,
            rows_schema(topology),
            self.watermark.handle,
            ts,
            feeder=True,
            **self._known_as("Sink"),
        )
        self._actors.append(sink)
        buffer = self.buffer.handle if self.buffer is not None else None
        snapshots = self.snapshots.handle if self.snapshots is not None else None
        # a process is pinned as it starts; a thread by its first call (on its own thread)
        pin = transport.separate_processes
        executors = [
            transport.start(
                Executor,
                cfg,
                self.state.handle,
                seat,
                self._sync.handle,
                self.prefix,
                snapshots,
                sink,
                cpu if pin else None,
                buffer,
                self.live.handle,
                label=f"Executor {seat.rank}",
                **self._known_as(f"Executor {seat.rank}"),
            )
            for seat, (_, cpu) in zip(self.seats, plan.cores, strict=True)
        ]
        self._actors += executors
        self.serving = None
        if schedulers.get(cfg.scheduler).coordinator_policies(cfg):
            coordinator = transport.start(
                Coordinator, cfg, self._sync.handle, self.prefix, **self._known_as("Coordinator")
            )
            self._actors.append(coordinator)
            self.serving = coordinator.serve.remote()
        named = plan.name and transport.separate_processes
        known_as = {"name": plan.name, "namespace": NAMESPACE} if named else None
        self.controller = transport.start(
            ProgressController,
            cfg,
            topology.event_schema,
            executors,
            sink,
            self.watermark.handle,
            snapshots,
            plan.layout,
            plan.tables,
            buffer,
            ts,
            StreamKeys(plan.keys, topology.key_columns) if plan.keys else None,
            plan.value_types,
            feeder=True,
            concurrency_groups=CONCURRENCY,
            **(known_as or self._known_as("ProgressController")),
        )
        self._actors.append(self.controller)
        self.sink, self.executors = sink, executors
        team = f"starting {len(executors)} executor{'s' * (len(executors) > 1)}"
        with self.console.phase(team if self.launches == 0 else f"re{team}"):
            pids = self._get_watching(
                [
                    e.warm_up.remote(topology.engine_schema, None if pin else cpu)
                    for e, (_, cpu) in zip(executors, plan.cores, strict=True)
                ]
            )
        self._pids = pids if transport.separate_processes else []
        feeders = None if pin else spare_cpus(plan.cores)
        # where they run while executor 0 runs chunks alone (`Scheduler.alone_next`)
        beside_first = None if pin else spare_cpus(plan.cores[:1])
        # what start-up built lives as long as the run: the collector skips it from now
        # on (a full collection over it would stop every thread of the run for a while)
        gc.freeze()
        self.running = self.controller.run.remote(feeders, beside_first)
        self.launched = (self.launches + 1, ts, sink, self.controller)
        self.launches += 1

    def _known_as(self, role: str) -> dict[str, str]:
        """The Ray name of the team's actor ``role``, which Ray's dashboard shows: the
        run's label and the role (a recovery's team numbered: a dead actor's name may
        not be free yet)."""
        team = f" (team {self.launches + 1})" if self.launches else ""
        return {"name": f"{self.plan.label}: {role}{team}", "namespace": NAMESPACE}

    # ---------------------------------------------------------------- health
    def get(self, refs: Any) -> Any:
        """The results of ``refs`` within the run's timeout; user and engine errors keep
        their own type, the death of an actor's process is `ActorDied`."""
        return self._results(get, refs)

    def _results(self, wait: Callable[[Any, float], Any], refs: Any) -> Any:
        """``wait(refs, timeout)``, its failures as `get` says."""
        try:
            return wait(refs, self.config.timeout_s)
        except TimeoutError as exc:
            raise RuntimeFailure(f"no progress within {self.config.timeout_s} s") from exc
        except TxstreamError:
            raise
        except Exception as exc:
            if not self.transport.separate_processes:
                raise  # a thread's call raised the error itself
            raise actor_failure(exc) from exc

    def ended(self, refs: list, timeout_s: float = 0.0) -> list:
        """Those of ``refs`` that have ended (at least one within ``timeout_s``, if any)."""
        return ended([r for r in refs if r is not None], timeout_s)

    def team_alive(self) -> bool:
        """Whether every executor's process of this host is still there (an idle team
        notices a dead member only at its next chunk)."""
        return all(os.path.exists(f"/proc/{pid}") for pid in self._pids)

    def stopped(self) -> bool:
        """Whether the ProgressController's or the Coordinator's loop has ended."""
        return bool(self.ended([self.running, self.serving]))

    def ended_well(self) -> bool:
        """Whether the ProgressController's loop ended with the run's report."""
        try:
            self.get(self.running)
        except TxstreamError:
            return False
        return True

    def cause(self) -> BaseException:
        """Why the ProgressController's loop or the Coordinator ended: the root cause, not
        an executor that stopped because a peer failed."""
        try:
            if self.serving is not None and self.ended([self.serving]):
                self.get(self.serving)
                return RuntimeFailure("the Coordinator stopped before the end of the session")
            self.get(self.running)
            return RuntimeFailure("the ProgressController stopped before the end of the session")
        except PeerFailed:
            try:
                self.get(self.running)  # the executor that failed first
            except TxstreamError as exc:
                return exc
            return RuntimeFailure("an executor failed")
        except TxstreamError as exc:
            return exc

    def _get_watching(self, refs: list) -> Any:
        """The results of ``refs``, failing at once if one fails (its peers may wait for
        it) or if the Coordinator ends first (e.g. during warm-up, while executors wait
        for it to map their segment)."""
        deadline = time.monotonic() + self.config.timeout_s
        while self.serving is not None and not _all_ended(refs):
            if self.ended([self.serving]):
                self.get(self.serving)
                raise RuntimeFailure("the Coordinator stopped before the end of the run")
            self.get(self.ended(refs))  # one failed?
            if time.monotonic() > deadline:
                break  # reported below
            time.sleep(0.01)
        return self._results(wait_all, refs)

    # ---------------------------------------------------------------- the end
    def finish(self) -> tuple[dict, dict | None, dict]:
        """Once the ProgressController's loop ended well: stop the team; the loop's report,
        the Coordinator's and the Sink's summary."""
        run_info = self.get(self.running)
        ask_to_stop(self._sync.array)
        coordinator = self.get(self.serving) if self.serving is not None else None
        summary = self.get(self.sink.finish.remote())
        self.get([e.close.remote() for e in self.executors])
        if self.snapshots is not None:  # no query after the end: its memory goes first
            self.snapshots.close()
        return run_info, coordinator, summary

    def take_tables(self, indexes: dict[str, KeyIndex] | None = None) -> dict[str, pa.Table]:
        """Once finished: every table of the state (copies; of natural keys, by ``indexes``),
        whose shared memory is freed before the key columns are made, so that a run's end
        holds the state about once."""
        columns = self.state.columns(self.plan.topology)
        self.state.close()
        return with_keys(self.plan.layout, columns, indexes, self.plan.value_types)

    def stop(self) -> None:
        """Stop every actor of the team and wait until its executors' processes are gone
        (a dying executor must not write into the state after it was restored)."""
        ask_to_stop(self._sync.array)
        self.transport.stop(self._actors)
        self._actors.clear()
        gc.unfreeze()  # collectable again (see `launch`)
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in self._pids):
            if time.monotonic() > deadline:
                raise RuntimeFailure("an executor's process does not exit")
            time.sleep(0.01)
        self._pids = []

    def close(self) -> None:
        """Stop the team, free the shared memory, end the Ray this engine started
        (idempotent)."""
        self._stack.close()


def _all_ended(refs: list) -> bool:
    return all(ended([ref]) for ref in refs)
