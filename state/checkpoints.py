"""Checkpoints of the state: what changed, copied at a chunk boundary, written in the
background.

A checkpoint is a folder ``ckpt-<ts>``: either *full* (the state's values and distinct
sets) or a *delta* of its parent, the checkpoint before it (the groups of cells written
since the parent, `txstream.state.dirty`, with their values, and the distinct sets whole:
they are sized by the events, not the keys). Restoring one reads its chain: the full
checkpoint it starts from, then each delta in order. Once a chain is long, or its deltas
hold half the state, the next checkpoint is written full instead, from the chain on disk
(block by block: the state is never held twice in memory); the folders the newest
checkpoints need are kept, the rest removed.

At the end of a chunk the ProgressController marked, executor 0 copies the groups written
since the last copy (executor 0 takes every chunk's written groups anyway, for the
snapshots of queries) into a *checkpoint buffer* and publishes the chunk's end ts there;
ingestion goes on at once. The session writes the buffer to the checkpoint folder in the
background and frees it. A checkpoint is written as ``.tmp-ckpt-<ts>`` and counts only
once renamed into place (atomic); one it replaces is first renamed aside, whole. A ``.tmp-``
folder is what a crash left behind and is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.state import dirty
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.sync import STRIDE, load, publish
from txstream.state.tables import SharedState

ARRAYS = ("values", "set_cells", "set_members")
"""What a full checkpoint holds of the state, by `SharedState` attribute."""
SETS = ARRAYS[1:]
DELTA = ("groups", "rows")
"""What a delta holds besides the sets: groups written since its parent, their values."""
COPIED, WRITTEN, COUNT, ASKED = range(4)
"""Words of the buffer: ts of the copy it holds; ts of the last copy written to disk;
groups the copy holds; ts of the last copy asked of the team."""
WORDS = ASKED + 1
KEEP = 2
MAX_CHAIN = 16
"""Deltas after a full checkpoint at most; the next one is full."""
BLOCK = 4 * 1024**2
"""Cells a full checkpoint is built from its chain at a time."""
PREFIX, TEMPORARY = "ckpt-", ".tmp-ckpt-"
COMPLETE = "_COMPLETE"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointBufferHandle:
    """What an actor needs to attach to the checkpoint buffer."""

    arrays: tuple[ArrayHandle, ...]
    words: ArrayHandle


class CheckpointBuffer:
    """The groups of cells written since the last copy, at one chunk boundary, waiting to
    be written (see module docstring); free again once the copy last asked is written.
    One copy at a time: a second one asked while chunks are in flight would overwrite the
    first as it is written.

    The buffer has room for every group, but only what a copy holds is ever touched (its
    pages untouched cost no memory)."""

    def __init__(self, arrays: list[SharedArray], words: SharedArray):
        self._arrays = arrays
        self._words = words
        self.words = words.array
        self._since: np.ndarray | None = None
        """Executor 0's marks of the groups written since the last copy."""

    @classmethod
    def create(cls, run_id: str, state: SharedState) -> CheckpointBuffer:
        """A buffer for ``state`` (driver side), holding nothing."""
        groups = len(state.dirty)
        shapes = {
            "groups": (groups,),
            "rows": (groups, dirty.GROUP),
            **{name: getattr(state, name).shape for name in SETS},
        }
        arrays = [
            SharedArray.create(run_id, f"ckpt_{name}", shape, "int64", touch=name in SETS)
            for name, shape in shapes.items()
        ]
        words = SharedArray.create(run_id, "ckpt_words", (WORDS * STRIDE,), "int64")
        return cls(arrays, words)

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
        publish(self.words, ASKED * STRIDE, ts)
        publish(self.words, COPIED * STRIDE, ts)
        publish(self.words, WRITTEN * STRIDE, ts)

    @property
    def free(self) -> bool:
        """Whether a new copy may be asked for: the one asked last is written."""
        return load(self.words, ASKED * STRIDE) == load(self.words, WRITTEN * STRIDE)

    def ask(self, ts: int) -> None:
        """The ProgressController asked the team for a copy at ``ts`` (the buffer is not
        `free` again until that copy is written)."""
        publish(self.words, ASKED * STRIDE, ts)

    @property
    def copied(self) -> int:
        """ts of the copy the buffer holds (= `written` when free)."""
        return int(load(self.words, COPIED * STRIDE))

    @property
    def written(self) -> int:
        """ts of the last copy written to disk."""
        return int(load(self.words, WRITTEN * STRIDE))

    def note(self, state: SharedState, groups: np.ndarray) -> None:
        """Executor 0, at every chunk boundary: the chunk wrote ``groups``. The state
        stood as the latest checkpoint when this executor started (a team starts from the
        state the checkpoints hold: the init state's, or the one restored)."""
        if self._since is None:
            self._since = np.zeros_like(state.dirty)
        self._since[groups] = 1

    def copy_from(self, state: SharedState, ts: int) -> None:
        """Executor 0, at a chunk boundary (after `note`): take the groups written since
        the last copy, as of ``ts``."""
        groups = np.zeros(0, np.int64)
        if self._since is not None:
            groups = dirty.take(self._since, np.empty(len(self._since), np.int64))
        n = len(groups)
        named = dict(zip(("groups", "rows", *SETS), self._arrays, strict=True))
        named["groups"].array[:n] = groups
        dirty.gather(state.values, groups, named["rows"].array[:n])
        for name in SETS:
            np.copyto(named[name].array, getattr(state, name))
        publish(self.words, COUNT * STRIDE, n)
        publish(self.words, COPIED * STRIDE, ts)

    def arrays(self) -> dict[str, np.ndarray]:
        """The copy, by name (views: write them before `mark_written`)."""
        n = int(load(self.words, COUNT * STRIDE))
        named = {
            name: a.array for name, a in zip(("groups", "rows", *SETS), self._arrays, strict=True)
        }
        return {**named, "groups": named["groups"][:n], "rows": named["rows"][:n]}

    def mark_written(self, ts: int) -> None:
        """The copy at ``ts`` is on disk: the buffer is free."""
        publish(self.words, WRITTEN * STRIDE, ts)

    def close(self) -> None:
        """Detach (and unlink, on the driver)."""
        for array in (*self._arrays, self._words):
            array.close()


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk: full, or a delta of its ``parent`` (module
    docstring)."""

    path: Path
    meta: dict[str, Any]

    @property
    def ts(self) -> int:
        """Events it covers: the state is as after the first ``ts`` transactions."""
        return int(self.meta["ts"])

    @property
    def full(self) -> bool:
        """Whether it holds the state's values whole (else it is a delta)."""
        return "parent" not in self.meta

    def chain(self) -> list[Checkpoint]:
        """The full checkpoint this one starts from, then every delta up to this one."""
        chain = [self]
        while not chain[-1].full:
            path = self.path.parent / chain[-1].meta["parent"]
            chain.append(Checkpoint(path, json.loads((path / "meta.json").read_text())))
        return chain[::-1]

    def load(self, name: str) -> np.ndarray:
        """One of its arrays (of a delta, its own)."""
        return np.load(self.path / f"{name}.npy")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of the state's arrays it restores."""
        root = self.chain()[0]
        return {name: _header(root.path / f"{name}.npy")[0] for name in ARRAYS}

    def restore(self, state: SharedState) -> None:
        """Copy the state it holds into ``state`` (same shapes: checked by the caller):
        the values of the full checkpoint of its chain, read in place, then every delta's
        groups in order; the distinct sets of this one."""
        root, *deltas = self.chain()
        with open(root.path / "values.npy", "rb") as f:
            _header_of(f)
            f.readinto(memoryview(state.values).cast("B"))
        for delta in deltas:
            dirty.scatter(state.values, delta.load("groups"), delta.load("rows"))
        for name in SETS:
            np.copyto(getattr(state, name), self.load(name))


def _header_of(f: BinaryIO) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the ``.npy`` file ``f``, left at its data."""
    if np.lib.format.read_magic(f) == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return shape, dtype


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    with open(path, "rb") as f:
        return _header_of(f)


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def _save_built(path: Path, chain: list[Checkpoint], groups: np.ndarray, rows: np.ndarray) -> None:
    """Write the values of ``chain`` (a full checkpoint and deltas), then ``groups`` set to
    ``rows``, block by block."""
    root, *deltas = chain
    layers = [(d.path / "groups.npy", d.path / "rows.npy") for d in deltas]
    with open(root.path / "values.npy", "rb") as source, open(path, "wb") as out:
        shape, dtype = _header_of(source)
        np.lib.format.write_array_header_1_0(
            out,
            {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape},
        )
        cells = int(np.prod(shape))
        for first in range(0, cells, BLOCK):
            block = np.empty(min(BLOCK, cells - first), np.int64)
            source.readinto(memoryview(block).cast("B"))
            for layer in [*layers, (groups, rows)]:
                _apply_block(block, first, *layer)
            out.write(block.tobytes())
        out.flush()
        os.fsync(out.fileno())


def _apply_block(block: np.ndarray, first: int, groups: Any, rows: Any) -> None:
    """Set the groups of a delta that fall in the cells ``first ..`` of ``block``
    (``groups`` and ``rows``: arrays, or the files holding them, mapped a block at a time)."""
    if isinstance(groups, Path):
        groups, rows = np.load(groups, mmap_mode="r"), np.load(rows, mmap_mode="r")
    lo, hi = np.searchsorted(
        groups, [first // dirty.GROUP, -(-(first + len(block)) // dirty.GROUP)]
    )
    if hi > lo:
        dirty.scatter(
            block, np.asarray(groups[lo:hi]) - first // dirty.GROUP, np.asarray(rows[lo:hi])
        )


class CheckpointStore:
    """The checkpoint folder: writes atomically, finds the newest complete checkpoint."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def write(self, ts: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Checkpoint:
        """Write a full checkpoint of ``ts``; it counts once renamed; keeps the newest ones."""
        return self._write(ts, arrays, meta)

    def write_delta(
        self,
        ts: int,
        arrays: dict[str, np.ndarray],
        meta: dict[str, Any],
        whole: dict[str, np.ndarray] | None = None,
    ) -> Checkpoint | None:
        """Write a checkpoint of ``ts`` from the groups written since the latest one
        (``arrays``: `CheckpointBuffer.arrays`): a delta of it, or full once its chain
        is long; ``whole``: arrays written whole into it either way (the key indexes).
        None if a checkpoint as new is on disk already (written full while the team was
        idle: this copy adds nothing)."""
        parent = self.latest()
        if parent is not None and parent.ts >= ts:
            return None
        groups, rows = arrays["groups"], arrays["rows"]
        sets = {name: arrays[name] for name in SETS} | (whole or {})
        chain = parent.chain() if parent is not None else []
        held = sum(int(c.meta.get("groups", 0)) for c in chain[1:]) + len(groups)
        cells = _header(chain[0].path / "values.npy")[0][0] if chain else 0
        if chain and len(chain) <= MAX_CHAIN and held * dirty.GROUP <= cells // 2:
            own = {"parent": parent.path.name, "groups": len(groups)}
            return self._write(ts, {"groups": groups, "rows": rows, **sets}, {**meta, **own})
        if not chain:
            raise RuntimeFailure(f"checkpoint {ts}: no checkpoint before it to start from")
        return self._write(ts, sets, meta, built=(chain, groups, rows))

    def _write(self, ts, arrays, meta, built=None) -> Checkpoint:
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / f"{TEMPORARY}{ts:012d}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        for name, array in arrays.items():
            _save(staging / f"{name}.npy", array)
        if built is not None:
            _save_built(staging / "values.npy", *built)
        (staging / "meta.json").write_text(json.dumps({**meta, "ts": ts}, indent=1))
        target = self.folder / f"{PREFIX}{ts:012d}"
        if target.exists():  # moved aside whole (`_prune` removes it): a crash while removing
            # it in place would leave a checkpoint that looks complete but lacks files
            replaced = self.folder / f"{TEMPORARY}{ts:012d}-replaced"
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(target, replaced)
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
        """Keep the newest checkpoints and the folders their chains need."""
        complete = sorted(self.folder.glob(f"{PREFIX}*"))
        needed = {path.name for path in complete[-KEEP:]}
        for path in complete[-KEEP:]:
            meta = json.loads((path / "meta.json").read_text())
            needed |= {c.path.name for c in Checkpoint(path, meta).chain()}
        for path in complete:
            if path.name not in needed:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.folder.glob(f"{TEMPORARY}*"):
            shutil.rmtree(path, ignore_errors=True)
