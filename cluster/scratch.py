"""Temporary files of a run, removed at its end whatever the outcome.

What txstream starts writes its temporary files into private folders (under TMPDIR),
removed at the end: a local Ray's session (logs, sockets, spilled objects), Spark's local
dirs and the JVMs' `java.io.tmpdir` (native libraries Spark extracts). Folders stay short:
Ray puts Unix sockets in its session folder, and their paths are limited to 107 bytes.

One thing honours no setting: a JVM that joins Ray as a Java driver (Spark's driver, RayDP's
app master) extracts Ray's native library (40 MB) into ``/tmp/ray/<milliseconds>/``. Those
folders are found through the processes that map the library (this process's descendants)
while they run, and removed once they have stopped; so are those made during the run that
no process maps any more (of JVMs killed with a lost Ray node before they were seen).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

_MAX_BASE = 40
"""Longest temporary base folder used as it is (Ray's socket paths add ~70 bytes)."""
_JAVA_DRIVER_ROOT = Path("/tmp/ray")
_JAVA_DRIVER_LIBRARY = re.compile(r"(/tmp/ray/\d+)/libcore_worker_library_java\.so")
_EXTRACTED_S = 2.0
"""A library folder this old is mapped by its JVM, if that still runs (it loads the
library right after extracting it)."""


def _base() -> Path:
    base = tempfile.gettempdir()
    return Path("/tmp" if len(base) > _MAX_BASE else base)


def private_dir(what: str) -> Path:
    """A new private folder ``txs-<what>-<random>`` under TMPDIR (/tmp if that is long)."""
    return Path(tempfile.mkdtemp(prefix=f"txs-{what}-", dir=_base()))


def own_output_dir() -> Path:
    """A temporary output folder for a run given none (``txs-out-<pid>-<random>``): named
    after this process, so that what a killed process leaves is found
    (`sweep_abandoned_outputs`)."""
    return private_dir(f"out-{os.getpid()}")


def sweep_abandoned_outputs(dead: int | None = None) -> None:
    """Remove the temporary outputs (`own_output_dir`) of processes that are gone (or
    ``dead``: killed, not yet reaped by its parent); nothing resumes them."""
    for folder in _base().glob("txs-out-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and _gone(int(pid), dead):
            remove_tree(folder)


def _gone(pid: int, dead: int | None) -> bool:
    """Whether process ``pid`` has ended (or is ``dead``: killed, not yet reaped)."""
    return pid == dead or not os.path.exists(f"/proc/{pid}")


def sweep_abandoned_rays(dead: int | None = None) -> None:
    """Stop what the local Ray of a killed run left running (Ray's agents can outlive
    their raylet) and remove its folder: a folder whose Ray session belongs to a driver
    process that is gone (or is ``dead``: killed, not yet reaped by its parent). The
    processes are found by the files they hold open there."""
    for folder in _base().glob("txs-ray-*"):
        drivers = [s.name.rsplit("_", 1)[-1] for s in folder.glob("session_*_*")]
        drivers = [int(d) for d in drivers if d.isdigit()]
        if not drivers or not all(_gone(p, dead) for p in drivers):
            continue  # not started yet, or its run goes on
        for proc in Path("/proc").glob("[0-9]*"):
            if _holds(proc, folder):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except OSError:  # gone meanwhile, or not ours
                    pass
        remove_tree(folder)


def _holds(proc: Path, folder: Path) -> bool:
    """Whether process ``proc`` has a file open under ``folder``."""
    prefix = f"{folder}/"
    try:
        return any(os.readlink(fd).startswith(prefix) for fd in (proc / "fd").iterdir())
    except OSError:  # gone, or another user's
        return False


@contextmanager
def scratch(what: str, made: Path | None = None) -> Iterator[Path]:
    """A private folder (`private_dir`, or ``made`` earlier) for the duration, then
    removed."""
    path = made or private_dir(what)
    try:
        yield path
    finally:
        remove_tree(path)
        # a JVM that Ray stops later (Spark's) may make it again on its way out
        atexit.register(remove_tree, path, 1)


@contextmanager
def written_whole(target: Path) -> Iterator[Path]:
    """A path beside ``target`` to write it to: it replaces ``target`` in one rename if the
    block completes, and is removed either way, so a reader never sees ``target`` half
    written (another process's, a failed write's)."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        yield partial
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def remove_tree(path: Path, attempts: int = 5) -> None:
    """Remove ``path`` entirely; processes still stopping may add files meanwhile, so
    try a few times."""
    for _ in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.2)


def java_driver_libraries(pid: int | None = None) -> set[Path]:
    """The ``/tmp/ray/<ms>`` folders that descendants of ``pid`` (default: this process)
    have extracted Ray's Java native library into and still map."""
    return _mapped_libraries(descendants(pid or os.getpid()))


def _mapped_libraries(pids: Iterable[int | str]) -> set[Path]:
    """The ``/tmp/ray/<ms>`` library folders that processes ``pids`` map."""
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue  # ended meanwhile, or another user's
        found.update(Path(m) for m in _JAVA_DRIVER_LIBRARY.findall(maps))
    return found


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class JavaDriverLibraries:
    """Ray's native-library folders that this process's descendant JVMs extracted:
    `note` them while those run, `remove` them once they have stopped (and ``/tmp/ray``
    too if it did not exist before and is left empty)."""

    def __init__(self) -> None:
        self._root_existed = _JAVA_DRIVER_ROOT.exists()
        self._since = time.time() - 1.0  # file times are coarser than the clock
        self.folders: set[Path] = set()

    def note(self) -> None:
        """Add the folders mapped right now."""
        self.folders |= java_driver_libraries()

    def remove(self) -> None:
        """Remove every folder noted, and those abandoned since this object was made."""
        for folder in self.folders | self._abandoned():
            remove_tree(folder)
        if not self._root_existed:
            try:
                _JAVA_DRIVER_ROOT.rmdir()
            except OSError:  # not empty: others use it too
                pass

    def _abandoned(self) -> set[Path]:
        """Library folders made since `__init__`, not noted, that no live process maps: a
        killed JVM's (a lost Ray node's), whoever started it."""
        now, made = time.time(), set()
        for folder in _JAVA_DRIVER_ROOT.glob("[0-9]*"):
            try:
                extracted = folder.stat().st_mtime
            except OSError:  # removed meanwhile
                continue
            if self._since <= extracted <= now - _EXTRACTED_S and folder not in self.folders:
                made.add(folder)
        if not made:
            return made
        return made - _mapped_libraries(proc.name for proc in Path("/proc").glob("[0-9]*"))
