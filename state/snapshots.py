"""The state as of recent chunk boundaries, kept for consistent queries (FlowDB's
queryable state: an outside reader never sees half of a transaction, or of a batch).

At the end of every chunk, once the whole team has finished it, executor 0 copies the
state's values (a memcpy) into the next slot of a small ring in shared memory and tags it
with the chunk's end ts. A reader takes the newest slot whose ts the Sink's watermark has
reached (so the outputs of every event before it are written too), copies the rows it
wants and checks the slot was not overwritten meanwhile (a seqlock). Ingestion never
waits for a reader.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from txstream.errors import RuntimeFailure, UsageError
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.sync import STRIDE, load, publish

WRITING = -1
"""Tag of a slot being written (or never written)."""
MAX_BYTES = 64 * 1024**2
"""Memory for the ring: as many slots as fit (between 2 and 8) for the state's size."""


def slot_count(cells: int) -> int:
    """Slots for a state of ``cells`` int64 cells: enough that the Sink, which runs a few
    chunks behind the team, still finds a slot it has reached."""
    return int(np.clip(MAX_BYTES // max(1, cells * 8), 2, 8))


@dataclass(frozen=True)
class SnapshotHandle:
    """What an actor needs to attach to the ring."""

    values: ArrayHandle
    tags: ArrayHandle


class SnapshotRing:
    """Copies of the state's values at chunk boundaries (see module docstring)."""

    def __init__(self, values: SharedArray, tags: SharedArray):
        self._arrays = (values, tags)
        self.values = values.array
        self.tags = tags.array

    @classmethod
    def create(cls, run_id: str, cells: int) -> SnapshotRing:
        """A ring for ``cells`` cells, every slot unwritten (driver side)."""
        slots = slot_count(cells)
        ring = cls(
            SharedArray.create(run_id, "snapshots", (slots, max(1, cells)), "int64"),
            SharedArray.create(run_id, "snapshot_tags", (slots * STRIDE,), "int64"),
        )
        ring.tags[:] = WRITING
        return ring

    @classmethod
    def attach(cls, handle: SnapshotHandle) -> SnapshotRing:
        """Attach to the driver's ring (actor side)."""
        return cls(SharedArray.attach(handle.values), SharedArray.attach(handle.tags))

    @property
    def handle(self) -> SnapshotHandle:
        """What to send to actors."""
        return SnapshotHandle(*(a.handle for a in self._arrays))

    def reset(self, values: np.ndarray, ts: int) -> None:
        """Forget every slot; hold ``values`` as of ``ts`` (start, recovery)."""
        for slot in range(len(self.values)):
            publish(self.tags, slot * STRIDE, WRITING)
        self.publish(values, ts, 0)

    def publish(self, values: np.ndarray, ts: int, seq: int) -> None:
        """Store the state ``values`` as of ``ts`` in slot ``seq`` (mod the ring size)."""
        slot = seq % len(self.values)
        publish(self.tags, slot * STRIDE, WRITING)
        np.copyto(self.values[slot, : len(values)], values)
        publish(self.tags, slot * STRIDE, ts)

    def read(
        self, cells: np.ndarray, watermark: Callable[[], int], timeout_s: float
    ) -> tuple[int, np.ndarray] | None:
        """(ts, values of ``cells``) of the newest snapshot at or below the Sink's
        ``watermark()``; waits (up to ``timeout_s``) while every slot is newer than the
        watermark, which then catches up; None if it did not."""
        deadline = time.monotonic() + timeout_s
        while True:
            reached = watermark()
            tags = [int(load(self.tags, s * STRIDE)) for s in range(len(self.values))]
            usable = [(ts, s) for s, ts in enumerate(tags) if 0 <= ts <= reached]
            if usable:
                ts, slot = max(usable)
                rows = self.values[slot, cells]
                if int(load(self.tags, slot * STRIDE)) == ts:
                    return ts, rows
                continue  # overwritten while copying: take the next newest
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0005)

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
        """Detach (and unlink, on the driver)."""
        self.values = self.tags = np.empty(0, np.int64)
        for array in self._arrays:
            array.close()
