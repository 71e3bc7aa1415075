"""Checkpoints of the state: copied at a chunk boundary, written in the background.

At the end of a chunk the ProgressController marked, executor 0 copies the state (values
and distinct sets: a memcpy of shared memory) into a *checkpoint buffer* and publishes the
chunk's end ts there; ingestion goes on at once. The session writes the buffer to the
checkpoint folder in the background and frees it. A checkpoint is a folder
``ckpt-<ts>`` holding the arrays and ``meta.json``; it is written as ``.tmp-ckpt-<ts>``
and counts only once renamed into place (atomic). The two newest are kept; a ``.tmp-``
folder is what a crash left behind and is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.sync import STRIDE, load, publish
from txstream.state.tables import SharedState

ARRAYS = ("values", "set_cells", "set_members")
"""What a checkpoint holds of the state, by `SharedState` attribute."""
COPIED, WRITTEN = 0, 1
"""Words of the buffer: ts of the copy it holds; ts of the last copy written to disk."""
KEEP = 2
PREFIX, TEMPORARY = "ckpt-", ".tmp-ckpt-"
COMPLETE = "_COMPLETE"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointBufferHandle:
    """What an actor needs to attach to the checkpoint buffer."""

    arrays: tuple[ArrayHandle, ...]
    words: ArrayHandle


class CheckpointBuffer:
    """A copy of the state at one chunk boundary, waiting to be written (see module
    docstring); free again once the copy it holds is written."""

    def __init__(self, arrays: list[SharedArray], words: SharedArray):
        self._arrays = arrays
        self._words = words
        self.words = words.array

    @classmethod
    def create(cls, run_id: str, state: SharedState) -> CheckpointBuffer:
        """A buffer shaped like ``state`` (driver side), holding nothing."""
        arrays = [
            SharedArray.create(run_id, f"ckpt_{name}", getattr(state, name).shape, "int64")
            for name in ARRAYS
        ]
        return cls(arrays, SharedArray.create(run_id, "ckpt_words", (2 * STRIDE,), "int64"))

    @classmethod
    def attach(cls, handle: CheckpointBufferHandle) -> CheckpointBuffer:
        """Attach to the driver's buffer (actor side)."""
        return cls([SharedArray.attach(h) for h in handle.arrays], SharedArray.attach(handle.words))

    @property
    def handle(self) -> CheckpointBufferHandle:
        """What to send to actors."""
        return CheckpointBufferHandle(tuple(a.handle for a in self._arrays), self._words.handle)

    def reset(self, ts: int) -> None:
        """Empty, as if a copy at ``ts`` had just been written (start, recovery)."""
        publish(self.words, COPIED * STRIDE, ts)
        publish(self.words, WRITTEN * STRIDE, ts)

    @property
    def free(self) -> bool:
        """Whether the buffer may take a new copy (the last one is written)."""
        return load(self.words, COPIED * STRIDE) == load(self.words, WRITTEN * STRIDE)

    @property
    def copied(self) -> int:
        """ts of the copy the buffer holds (= `written` when free)."""
        return int(load(self.words, COPIED * STRIDE))

    @property
    def written(self) -> int:
        """ts of the last copy written to disk."""
        return int(load(self.words, WRITTEN * STRIDE))

    def copy_from(self, state: SharedState, ts: int) -> None:
        """Executor 0, at a chunk boundary: take the state as of ``ts``."""
        for name, array in zip(ARRAYS, self._arrays, strict=True):
            np.copyto(array.array, getattr(state, name))
        publish(self.words, COPIED * STRIDE, ts)

    def arrays(self) -> dict[str, np.ndarray]:
        """The copy, by name (views: write them before `mark_written`)."""
        return {name: a.array for name, a in zip(ARRAYS, self._arrays, strict=True)}

    def mark_written(self, ts: int) -> None:
        """The copy at ``ts`` is on disk: the buffer is free."""
        publish(self.words, WRITTEN * STRIDE, ts)

    def close(self) -> None:
        """Detach (and unlink, on the driver)."""
        for array in (*self._arrays, self._words):
            array.close()


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    path: Path
    meta: dict[str, Any]

    @property
    def ts(self) -> int:
        """Events it covers: the state is as after the first ``ts`` transactions."""
        return int(self.meta["ts"])

    def load(self, name: str) -> np.ndarray:
        """One of its arrays."""
        return np.load(self.path / f"{name}.npy")

    def restore(self, state: SharedState) -> None:
        """Copy its arrays into ``state`` (same shapes: checked by the caller's meta)."""
        for name in ARRAYS:
            np.copyto(getattr(state, name), self.load(name))


class CheckpointStore:
    """The checkpoint folder: writes atomically, finds the newest complete checkpoint."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def write(self, ts: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Checkpoint:
        """Write a checkpoint of ``ts``; it counts once renamed; keeps the newest ones."""
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / f"{TEMPORARY}{ts:012d}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        for name, array in arrays.items():
            with open(staging / f"{name}.npy", "wb") as f:
                np.save(f, array)
                f.flush()
                os.fsync(f.fileno())
        (staging / "meta.json").write_text(json.dumps({**meta, "ts": ts}, indent=1))
        target = self.folder / f"{PREFIX}{ts:012d}"
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        self._prune()
        return Checkpoint(target, {**meta, "ts": ts})

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint (incomplete ones are ignored, with a warning)."""
        if not self.folder.is_dir():
            return None
        for path in sorted(self.folder.glob(f"{TEMPORARY}*")):
            log.warning("ignoring the incomplete checkpoint %s (a crash interrupted it)", path)
        for path in sorted(self.folder.glob(f"{PREFIX}*"), reverse=True):
            try:
                meta = json.loads((path / "meta.json").read_text())
            except (OSError, ValueError):
                log.warning("ignoring the unreadable checkpoint %s", path)
                continue
            return Checkpoint(path, meta)
        return None

    def drop_after(self, ts: int) -> None:
        """Remove the checkpoints of more than ``ts`` events: a run over several nodes
        goes back to the last checkpoint that every node took."""
        for path in self.folder.glob(f"{PREFIX}*"):
            if int(path.name[len(PREFIX) :]) > ts:
                shutil.rmtree(path, ignore_errors=True)

    def clear(self) -> None:
        """Remove every checkpoint (a run that starts afresh)."""
        for path in [*self.folder.glob(f"{PREFIX}*"), *self.folder.glob(f"{TEMPORARY}*")]:
            shutil.rmtree(path, ignore_errors=True)
        (self.folder / COMPLETE).unlink(missing_ok=True)

    def mark_complete(self) -> None:
        """The run these checkpoints belong to completed: nothing to resume, so they are
        removed (the state of each, the size of the tables, stayed on disk otherwise);
        the marker says so to the same command run again."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / COMPLETE).write_bytes(b"")
        for path in [*self.folder.glob(f"{PREFIX}*"), *self.folder.glob(f"{TEMPORARY}*")]:
            shutil.rmtree(path, ignore_errors=True)

    @property
    def complete(self) -> bool:
        """Whether the run these checkpoints belong to completed."""
        return (self.folder / COMPLETE).exists()

    def _prune(self) -> None:
        complete = sorted(self.folder.glob(f"{PREFIX}*"))
        for path in complete[:-KEEP]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.folder.glob(f"{TEMPORARY}*"):
            shutil.rmtree(path, ignore_errors=True)
