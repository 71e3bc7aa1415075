"""Exactly-once recovery (contract §7): what a session keeps to rebuild itself after a failure.

* `InputLog` keeps what was pushed, with its ts range, until a checkpoint covers it: Arrow
  tables as they are (the caller's own memory), sources by their position (a Parquet file
  is read again, Spark's converted partitions are fetched again) - so the input after a
  checkpoint can be pushed again, from exactly the checkpoint's ts.
* `CheckpointWriter` writes the copies the team takes at chunk boundaries
  (`txstream.state.checkpoints`) in a background thread of the driver, once the outputs
  before the copy are committed, so that a checkpoint always pairs a state with the
  outputs of exactly the events before it.
* `Checkpointing` pairs each checkpoint with its input position and committed outputs
  (`txstream.engine.plan.resume_point` finds, when a session starts, the checkpoint of
  an interrupted run to continue from).

A recovery then is: stop every actor, restore the last checkpoint into shared memory,
drop the outputs written after it, start new actors and push the input after it again.
Only deaths of actor processes are recovered; an error raised by code (a user function,
a topology) would fail the same way again and fails the session.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from txstream.connectors.sources import ArrowSource, SkippedSource, Source
from txstream.engine.plan import FORMAT
from txstream.errors import ActorDied
from txstream.state.checkpoints import Checkpoint, CheckpointBuffer, CheckpointStore

if TYPE_CHECKING:
    from txstream.engine.engine import Engine
    from txstream.engine.plan import Plan

log = logging.getLogger(__name__)

MAX_RECOVERIES = 3
"""Recoveries from one checkpoint without getting past it, before the session gives up."""


@dataclass
class Pushed:
    """One push: events ``start..end-1`` of the stream."""

    start: int
    end: int
    table: pa.Table | None = None
    source: Source | None = None
    batch_id: int | None = None

    def after(self, ts: int) -> pa.Table | Source:
        """What to push again for the events from ``ts`` on (``ts`` inside this push)."""
        skip = max(0, ts - self.start)
        if self.table is not None:
            return self.table.slice(skip)
        return SkippedSource(self.source, skip) if skip else self.source


class InputLog:
    """What was pushed since the last checkpoint (see module docstring); keeps nothing
    when nothing can be recovered (no checkpoint folder)."""

    def __init__(self, keep: bool, last_batch_id: int | None = None):
        """``last_batch_id``: the last Spark micro-batch a resumed checkpoint covers (its
        events all lie before the resumed ts)."""
        self.keep = keep
        self._pushes: list[Pushed] = []
        self._files: list[dict[str, Any]] = []
        self._batch_ids: list[tuple[int, int]] = []  # (end ts, Spark batch id)
        if last_batch_id is not None:
            self._batch_ids.append((0, last_batch_id))

    def record(self, pushed: Pushed) -> None:
        """A push, in stream order."""
        if isinstance(pushed.source, ArrowSource) and len(pushed.source.files) == 1:
            self._files.append(
                {"path": str(pushed.source.files[0]), "start": pushed.start, "end": pushed.end}
            )
        if pushed.batch_id is not None:
            self._batch_ids.append((pushed.end, pushed.batch_id))
        if self.keep:
            self._pushes.append(pushed)

    def after(self, ts: int) -> Iterator[tuple[Pushed, pa.Table | Source]]:
        """Every push that holds events from ``ts`` on, with what to push again."""
        for pushed in self._pushes:
            if pushed.end > ts:
                yield pushed, pushed.after(ts)

    def release(self, ts: int) -> None:
        """A checkpoint covers the events before ``ts``: what is entirely before goes."""
        self._pushes = [p for p in self._pushes if p.end > ts]

    def position(self, ts: int) -> dict[str, Any]:
        """Where the input stands at ``ts``, for a checkpoint's metadata: the last Spark
        micro-batch entirely before it and the single files pushed that start before it."""
        batch_ids = [b for end, b in self._batch_ids if end <= ts]
        return {
            "last_batch_id": batch_ids[-1] if batch_ids else None,
            "files": [f for f in self._files if f["start"] < ts],
        }


class CheckpointWriter:
    """Writes the team's checkpoint copies in the background (see module docstring).

    ``committed()`` tells how far outputs are committed; ``meta(ts)`` the metadata of a
    checkpoint at ``ts``; ``written(ts)`` is told about every checkpoint written. An error
    is kept in ``failure`` (the session reports it).
    """

    POLL_S = 0.005

    def __init__(
        self,
        buffer: CheckpointBuffer,
        store: CheckpointStore,
        committed: Callable[[], int],
        meta: Callable[[int], dict],
        written: Callable[[int], None],
        keys: Callable[[], dict] = dict,
    ):
        self.buffer = buffer
        self.store = store
        self._committed = committed
        self._meta = meta
        self._keys = keys
        """The arrays of the key indexes to store beside the state's copy (taken after it)."""
        self._written = written
        self._lock = threading.Lock()
        self._paused = threading.Event()
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self.count = 0
        self.seconds = 0.0
        self.newest_at: float | None = None
        """When the newest checkpoint was written (`time.time`)."""
        self._thread = threading.Thread(target=self._run, name="checkpoints", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    self._write_pending()
                self._stop.wait(self.POLL_S)
        except BaseException as exc:  # reported by the session on its next call
            self.failure = exc

    def _write_pending(self) -> None:
        ts = self.buffer.copied
        if ts == self.buffer.written or self._paused.is_set():
            return
        if self._committed() < ts:
            return  # the outputs before the copy are not all committed yet
        begin = time.perf_counter()
        try:
            keys = self._keys()
        except ActorDied:
            return  # the team is lost: its recovery empties the buffer
        self.store.write_delta(ts, self.buffer.arrays(), self._meta(ts), keys)
        self.buffer.mark_written(ts)
        self.count += 1
        self.seconds += time.perf_counter() - begin
        self.newest_at = time.time()
        self._written(ts)

    def write_now(self, ts: int, arrays: dict, meta: dict) -> Checkpoint:
        """Write a checkpoint of the given arrays at once (the team is idle)."""
        with self._lock:
            checkpoint = self.store.write(ts, arrays, meta)
            self.newest_at = time.time()
            self._written(ts)
            return checkpoint

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No writing meanwhile: around every launch of a team (the first one and a
        recovery's), which empties the buffer in two steps the writer must not see apart."""
        self._paused.set()
        with self._lock:
            try:
                yield
            finally:
                self._paused.clear()

    def stop(self) -> None:
        """End the thread (a copy not yet written is dropped: the next run resumes from
        the checkpoint before it)."""
        self._stop.set()
        self._thread.join()


class Checkpointing:
    """A session's checkpoints (with a checkpoint folder): the background writer, the
    metadata that pairs each with its input position and committed outputs, and recovery
    from the latest when an actor dies.

    A new session (not a resumed one) clears the folder, marks its output as this run's
    and writes a checkpoint of the init state at once.
    """

    def __init__(self, plan: Plan, engine: Engine, inputs: InputLog):
        self.plan = plan
        self.engine = engine
        self.inputs = inputs
        self.token = plan.resume.meta["output_run"] if plan.resume else secrets.token_hex(8)
        """Identifies the run's output, so a checkpoint resumes only into its own."""
        self.recoveries: list[dict[str, Any]] = []
        self.writer = CheckpointWriter(
            engine.buffer,
            plan.store,
            lambda: engine.watermark.committed,
            self.meta,
            inputs.release,
            engine.key_arrays,
        )
        if plan.resume is None:
            plan.store.clear()
            plan.output.mark_run(self.token)
            self.write_now(0)

    @property
    def failure(self) -> BaseException | None:
        """Why writing a checkpoint failed, if it did."""
        return self.writer.failure

    def meta(self, ts: int) -> dict[str, Any]:
        """The metadata of a checkpoint at ``ts``."""
        plan = self.plan
        return {
            "format": FORMAT,
            "topology": plan.config.topology,
            "sizes": plan.layout.sizes,
            "input": plan.input,
            "output": None if plan.own_output else str(plan.output.path.resolve()),
            "output_run": self.token,
            "progressive": plan.output.progressive,
            **self.inputs.position(ts),
        }

    def write_now(self, ts: int) -> None:
        """A checkpoint of the state as it stands, at ``ts`` (the team is idle)."""
        state = self.engine.state
        arrays = {n: getattr(state, n) for n in ("values", "set_cells", "set_members")}
        self.writer.write_now(ts, {**arrays, **self.engine.key_arrays()}, self.meta(ts))

    def recover(self, cause: BaseException, launch: Callable[[int], None]) -> bool:
        """A new team from the latest checkpoint (``launch(ts)`` starts it and pushes the
        input after ``ts`` again); False if it cannot be done — recovering from the same
        checkpoint again and again."""
        begin = time.perf_counter()
        engine = self.engine
        with self.writer.paused():
            checkpoint = self.plan.store.latest()
            stuck = [r for r in self.recoveries if r["from_ts"] == checkpoint.ts]
            if len(stuck) >= MAX_RECOVERIES:
                return False
            log.warning("recovering from checkpoint %s after: %s", checkpoint.ts, cause)
            self.recoveries.append(
                {
                    "cause": str(cause).splitlines()[0][:300],
                    "watermark": engine.watermark.written,
                    "from_ts": checkpoint.ts,
                    "seconds": None,
                }
            )
            phases = {
                "stop_s": engine.stop,
                "restore_s": lambda: engine.restore(checkpoint),
                "launch_s": lambda: launch(checkpoint.ts),
            }
            for name, phase in phases.items():
                started = time.perf_counter()
                phase()
                self.recoveries[-1][name] = round(time.perf_counter() - started, 3)
        self.recoveries[-1]["seconds"] = round(time.perf_counter() - begin, 3)
        return True

    def report(self) -> dict[str, Any]:
        """What metrics.json says of the checkpoints written."""
        return {"written": self.writer.count, "seconds": round(self.writer.seconds, 3)}

    def stop(self) -> None:
        """End the writer (a copy not yet written is dropped)."""
        self.writer.stop()
