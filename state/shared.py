"""Numpy arrays in POSIX shared memory, created by the driver and attached by actors.

The driver alone creates and unlinks segments (in a ``finally``); actors attach by
name and unregister from Python's resource tracker so their exit does not unlink.
Names carry the creating pid, so segments left by a killed run can be swept.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np

PREFIX = "txstream_"
_CREATED_HERE: set[str] = set()
"""Segments this process created: attaching to one of them (executors run as threads)
must leave the resource tracker's registration for the owner's unlink. Such an executor
maps the segment again rather than sharing the owner's mapping: the owner unmapping it at
a stop must not pull the pages from under a kernel still running."""


@dataclass(frozen=True)
class ArrayHandle:
    """What an actor needs to attach to a shared array: picklable and tiny."""

    name: str
    shape: tuple[int, ...]
    dtype: str


class SharedArray:
    """One numpy array backed by one shared-memory segment."""

    def __init__(
        self,
        shm: shared_memory.SharedMemory,
        handle: ArrayHandle,
        owner: bool,
    ):
        self._shm = shm
        self.handle = handle
        self.owner = owner
        self.array: np.ndarray = np.ndarray(handle.shape, handle.dtype, buffer=shm.buf)

    @classmethod
    def create(
        cls, run_id: str, what: str, shape: tuple[int, ...], dtype: str, touch: bool = True
    ) -> SharedArray:
        """Create a zeroed segment named after the run (driver side), its pages faulted in
        now rather than while a run is timed; without ``touch``, a page costs memory only
        once written (a buffer sized for the worst case costs what it holds)."""
        name = f"{run_prefix(run_id)}_{what}"
        nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        shm = create_segment(name, nbytes)
        array = cls(shm, ArrayHandle(name, tuple(shape), dtype), owner=True)
        if touch:
            array.array.fill(0)
        return array

    @classmethod
    def attach(cls, handle: ArrayHandle) -> SharedArray:
        """Attach to an existing segment (actor side); never unlinks it."""
        return cls(attach_segment(handle.name), handle, owner=False)

    def close(self) -> None:
        """Unlink the segment (owner only), then detach.

        Unlinking comes first: views of the array may still be alive (e.g. in the
        frames of an exception being handled), which makes detaching fail; the
        mapping then goes away with the last view, but the name is gone already.
        """
        self.array = np.empty(0)
        if self.owner:
            unlink_segment(self._shm)
        try:
            self._shm.close()
        except BufferError:
            pass


def create_segment(name: str, nbytes: int) -> shared_memory.SharedMemory:
    """A new zeroed segment; this process unlinks it (`unlink_segment`)."""
    shm = shared_memory.SharedMemory(name=name, create=True, size=max(1, nbytes))
    _CREATED_HERE.add(name)
    return shm


def attach_segment(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment without taking it over: Python's resource tracker would
    unlink it when this process exits, so it is told to forget it (unless this process
    created it: executors run as threads in tests)."""
    shm = shared_memory.SharedMemory(name=name)
    if name not in _CREATED_HERE:
        resource_tracker.unregister(shm._name, "shared_memory")
    return shm


def unlink_segment(shm: shared_memory.SharedMemory) -> None:
    """Remove a segment's name (its memory goes with the last mapping)."""
    _CREATED_HERE.discard(shm.name)
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


def run_prefix(run_id: str) -> str:
    """Start of the names of every segment of run ``run_id`` of this process."""
    return f"{PREFIX}{os.getpid()}_{run_id}"


def new_run_id() -> str:
    """A short random token distinguishing the segments of concurrent runs."""
    return secrets.token_hex(4)


def sweep_stale_segments(shm_dir: str = "/dev/shm", dead: int | None = None) -> list[str]:
    """Remove segments of txstream runs whose driver process no longer exists (or is
    ``dead``: killed, though its parent has not reaped it yet)."""
    removed = []
    for path in Path(shm_dir).glob(PREFIX + "*"):
        try:
            pid = int(path.name[len(PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        if pid == dead or not _alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
