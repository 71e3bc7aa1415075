"""The state as of recent chunk boundaries, kept for consistent queries (FlowDB's
queryable state: an outside reader never sees half of a transaction, or of a batch).

What is kept costs what the chunks changed, not the size of the state: a *base* copy of
the state's values as of some chunk boundary, and a ring of *deltas*, one per chunk
boundary after it, each the groups of cells the chunk wrote (`txstream.state.dirty`) with
their values at its end. At the end of every chunk, once the whole team has finished it,
executor 0 appends the chunk's delta to a log in shared memory; when the log or the ring
is full, the oldest deltas are folded into the base (a copy of their groups only).

A reader takes the newest boundary the Sink's watermark has reached (so the outputs of
every event before it are written too), at or after the base's: it copies the cells it
wants from the base, overlays the deltas up to that boundary, and checks that neither the
base nor those deltas changed meanwhile (seqlocks), or starts again. Ingestion never
waits for a reader.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from txstream.errors import RuntimeFailure, UsageError
from txstream.state import dirty
from txstream.state._numba import jit
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.sync import STRIDE, load, publish

FREE = -1
"""Tag of a slot holding no delta (never written, folded, or being written)."""
SLOTS = 16
"""Deltas the ring holds at most: boundaries a reader may choose from after the base's."""
MIN_LOG_CELLS = 8 * 1024**2
"""Cells of the delta log at least (64 MiB of values): a small state's deltas never
need folding before the ring is full."""
LOG_SHARE = 4
"""A large state's delta log holds 1 / LOG_SHARE of its cells: a few chunks' writes."""
VERSION, BASE_TS, HEAD, NEXT, OLDEST = range(5)
"""Lines of the words: the base's version (odd while a fold changes it), the base's ts,
where the next delta goes in the log, the next delta's number, the oldest live delta's."""
SEARCHED = 32
"""A read looks its cells up in each delta (a binary search) when that costs less than
a map of every group of the state to its newest delta (1 / SEARCHED of it, about)."""
START, COUNT, TS = range(3)
"""Columns of the slot table: a delta's first row in the log, its groups, its ts."""


@jit
def _overlay_searched(values, cells, spans, groups, rows):
    """``values`` (of ``cells``, read from the base) with each delta of ``spans`` (first
    row, groups; oldest first) laid over them: looked up by binary search."""
    for d in range(len(spans)):
        first, count = spans[d, 0], spans[d, 1]
        for j in range(len(cells)):
            wanted = cells[j] >> dirty.GROUP_SHIFT
            lo, hi = first, first + count
            while lo < hi:
                mid = (lo + hi) >> 1
                if groups[mid] < wanted:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < first + count and groups[lo] == wanted:
                values[j] = rows[lo, cells[j] & (dirty.GROUP - 1)]


@jit
def _overlay_mapped(values, cells, spans, groups, rows, newest):
    """`_overlay_searched` through ``newest``: per group of the state, its newest row in
    the log (-1: none), for reads of many cells."""
    for d in range(len(spans)):
        for i in range(spans[d, 0], spans[d, 0] + spans[d, 1]):
            newest[groups[i]] = i
    for j in range(len(cells)):
        at = newest[cells[j] >> dirty.GROUP_SHIFT]
        if at >= 0:
            values[j] = rows[at, cells[j] & (dirty.GROUP - 1)]


def log_rows(cells: int) -> int:
    """Groups the delta log holds for a state of ``cells`` cells."""
    return dirty.groups_of(max(MIN_LOG_CELLS, cells // LOG_SHARE))


@dataclass(frozen=True)
class SnapshotHandle:
    """What an actor needs to attach to the ring."""

    arrays: tuple[ArrayHandle, ...]


class SnapshotRing:
    """A base copy of the state plus the deltas of the chunk boundaries after it (see
    module docstring)."""

    def __init__(self, arrays: tuple[SharedArray, ...]):
        self._arrays = arrays
        self.base, self.groups, self.rows, self.slots, self.tags, self.words = (
            a.array for a in arrays
        )
        self._lock = threading.Lock()
        """Held by whoever folds, and by `publish` while it makes room."""
        self._folder: threading.Thread | None = None
        self._wake = threading.Event()
        self._fold_to = 0
        self._closing = False

    @classmethod
    def create(cls, run_id: str, cells: int) -> SnapshotRing:
        """A ring for ``cells`` cells, holding nothing yet (driver side)."""
        rows = log_rows(cells)
        return cls(
            (
                SharedArray.create(run_id, "snapshot_base", (max(1, cells),), "int64"),
                SharedArray.create(run_id, "snapshot_groups", (rows,), "int64"),
                SharedArray.create(run_id, "snapshot_rows", (rows, dirty.GROUP), "int64"),
                SharedArray.create(run_id, "snapshot_slots", (SLOTS, 3), "int64"),
                SharedArray.create(run_id, "snapshot_tags", (SLOTS * STRIDE,), "int64"),
                SharedArray.create(run_id, "snapshot_words", (5 * STRIDE,), "int64"),
            )
        )

    @classmethod
    def attach(cls, handle: SnapshotHandle) -> SnapshotRing:
        """Attach to the driver's ring (actor side)."""
        return cls(tuple(SharedArray.attach(h) for h in handle.arrays))

    @property
    def handle(self) -> SnapshotHandle:
        """What to send to actors."""
        return SnapshotHandle(tuple(a.handle for a in self._arrays))

    # ------------------------------------------------------------------ writer
    def reset(self, values: np.ndarray, ts: int) -> None:
        """Forget every delta; the base is ``values`` as of ``ts`` (start, recovery)."""
        for slot in range(SLOTS):
            publish(self.tags, slot * STRIDE, FREE)
        self._change_base(lambda: np.copyto(self.base[: len(values)], values), ts)
        for line in (HEAD, NEXT, OLDEST):
            publish(self.words, line * STRIDE, 0)

    def publish(self, values: np.ndarray, groups: np.ndarray, ts: int) -> None:
        """The state ``values`` as of ``ts``, whose ``groups`` (ascending) changed since
        the last boundary published (executor 0, the team past its barrier)."""
        n = len(groups)
        with self._lock:
            if n > len(self.groups):  # more than the whole log: straight into the base
                self._fold(self._word(NEXT))
                self._change_base(lambda: dirty.copy_groups(values, self.base, groups), ts)
                return
            start = self._word(HEAD)
            if start + n > len(self.groups):
                start = 0
            self._fold(self._room_for(start, n))
        seq = self._word(NEXT)
        slot = seq % SLOTS
        self.groups[start : start + n] = groups
        dirty.gather(values, groups, self.rows[start : start + n])
        self.slots[slot] = (start, n, ts)
        publish(self.tags, slot * STRIDE, seq)
        publish(self.words, HEAD * STRIDE, start + n)
        publish(self.words, NEXT * STRIDE, seq + 1)
        self._fold_soon()

    def _word(self, line: int) -> int:
        return int(load(self.words, line * STRIDE))

    def _live(self) -> range:
        """Numbers of the deltas not folded yet, oldest first."""
        return range(self._word(OLDEST), self._word(NEXT))

    def _room_for(self, start: int, n: int) -> int:
        """Up to which delta to fold so that a slot is free and no live delta holds log
        rows ``start .. start + n``."""
        live = self._live()
        stop = live.start
        for seq in live:
            first, count = self.slots[seq % SLOTS, START], self.slots[seq % SLOTS, COUNT]
            if first < start + n and start < first + count:
                stop = seq + 1
        return max(stop, live.stop - SLOTS + 1)

    def _fold_soon(self) -> None:
        """Once the ring or the log is half full, a thread folds the older half of the
        live deltas while the team goes on (a fold copies into the base only, which the
        team never reads), so that `publish` seldom has to fold itself; and the base
        changes (which restarts a reader of it) only every few chunks."""
        live = self._live()
        held = sum(int(self.slots[seq % SLOTS, COUNT]) for seq in live)
        if len(live) <= SLOTS // 2 and held <= len(self.groups) // 2:
            return
        self._fold_to = live.start + max(1, len(live) // 2)
        if self._folder is None:
            self._folder = threading.Thread(target=self._fold_loop, name="snapshots", daemon=True)
            self._folder.start()
        self._wake.set()

    def _fold_loop(self) -> None:
        # free to run beside executor 0, whose core it was started on (a team of threads:
        # the process's own mask is every core it may use)
        os.sched_setaffinity(0, os.sched_getaffinity(os.getpid()))
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            with self._lock:
                self._fold(self._fold_to)

    def _fold(self, stop: int) -> None:
        """Fold the live deltas numbered before ``stop`` into the base (holding the
        lock)."""
        live = range(self._word(OLDEST), stop)
        if not len(live):
            return

        def apply() -> None:
            for seq in live:
                first, count, _ = self.slots[seq % SLOTS]
                rows = slice(first, first + count)
                dirty.scatter(self.base, self.groups[rows], self.rows[rows])

        self._change_base(apply, int(self.slots[(stop - 1) % SLOTS, TS]))
        for seq in live:
            publish(self.tags, (seq % SLOTS) * STRIDE, FREE)
        publish(self.words, OLDEST * STRIDE, stop)

    def _change_base(self, change: Callable[[], object], ts: int) -> None:
        """Change the base under its seqlock; it is then as of ``ts``."""
        version = self._word(VERSION)
        publish(self.words, VERSION * STRIDE, version + 1)
        change()
        publish(self.words, BASE_TS * STRIDE, ts)
        publish(self.words, VERSION * STRIDE, version + 2)

    # ------------------------------------------------------------------ readers
    def read(
        self, cells: np.ndarray, watermark: Callable[[], int], timeout_s: float
    ) -> tuple[int, np.ndarray] | None:
        """(ts, values of ``cells``) of the newest boundary at or below the Sink's
        ``watermark()``; waits (up to ``timeout_s``) while every boundary held is newer
        than the watermark, which then catches up; None if it did not."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self._try_read(cells, watermark())
            if got is not None:
                return got
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0005)

    def _try_read(self, cells: np.ndarray, reached: int) -> tuple[int, np.ndarray] | None:
        """One attempt of `read`: None if no boundary held is reached yet, or the base or
        a delta changed while it was read."""
        version = self._word(VERSION)
        if version % 2:
            return None
        base_ts = self._word(BASE_TS)
        deltas = []
        for slot in range(SLOTS):
            seq = int(load(self.tags, slot * STRIDE))
            if seq != FREE:
                first, count, ts = (int(x) for x in self.slots[slot])
                if base_ts < ts <= reached:
                    deltas.append((seq, slot, first, count, ts))
        deltas.sort()
        if base_ts > reached:
            return None
        values = self.base[cells]
        spans = np.array([(first, count) for _, _, first, count, _ in deltas], np.int64)
        if len(cells) * len(deltas) * SEARCHED < len(self.base) // dirty.GROUP:
            _overlay_searched(values, cells, spans.reshape(-1, 2), self.groups, self.rows)
        else:
            newest = np.full(len(self.base) // dirty.GROUP + 1, -1, np.int64)
            _overlay_mapped(values, cells, spans.reshape(-1, 2), self.groups, self.rows, newest)
        if self._word(VERSION) != version or any(
            int(load(self.tags, slot * STRIDE)) != seq for seq, slot, *_ in deltas
        ):
            return None
        return (deltas[-1][-1] if deltas else base_ts), values

    def query(
        self,
        layout: object,
        tables: dict[str, list[str]],
        table: str,
        keys: list[int] | np.ndarray | None,
        watermark: Callable[[], int],
        timeout_s: float,
    ) -> tuple[int, pa.Table]:
        """(w, rows): ``key`` plus the value columns of ``table`` for ``keys`` (default:
        every key) as of the newest snapshot ``w`` the watermark has reached (see `read`).
        ``layout`` is the state's `Layout` (sizes and column bases), ``tables`` the value
        columns of every table."""
        if table not in tables:
            raise UsageError(f"query: no table {table!r}; the tables are {', '.join(tables)}")
        columns = tables[table]
        size = layout.sizes[table]
        if keys is None:
            keys = layout.keys(table)
        else:
            keys = np.asarray(keys, dtype=np.int64).reshape(-1)
            bad = keys[(keys < 0) | (keys >= size)]
            if len(bad):
                raise UsageError(
                    f"query: key {int(bad[0])} is not a key of {table!r} (0..{size - 1})"
                )
        cells = np.concatenate(
            [layout.cells_of(table, column, keys) for column in columns] or [keys[:0]]
        )
        got = self.read(cells, watermark, timeout_s)
        if got is None:
            raise RuntimeFailure(f"query: no snapshot within {timeout_s} s")
        ts, values = got
        n = len(keys)
        rows = {"key": pa.array(keys)}
        for i, column in enumerate(columns):
            rows[column] = pa.array(values[i * n : (i + 1) * n])
        return ts, pa.table(rows)

    def close(self) -> None:
        """Detach (and unlink, on the driver); idempotent."""
        if self._folder is not None:
            self._closing = True
            self._wake.set()
            self._folder.join()
            self._folder = None
        self.base = self.groups = self.rows = np.empty(0, np.int64)
        self.slots = self.tags = self.words = np.empty(0, np.int64)
        for array in self._arrays:
            array.close()
