"""`txstream run --follow`: a session fed by a folder that keeps growing.

Every new *complete* Parquet file of the folder (its footer reads: a writer that is still
at it, or that writes under a hidden name and renames, is never half-read) is pushed in
file-name order, then the session is flushed, so that each batch of files ends with its
outputs committed. Files whose names start with ``_`` or ``.`` are ignored (in-progress
or bookkeeping files, as Spark and Hadoop name them). A new file whose name sorts before
one already pushed cannot be put in ts order: it is skipped with a warning. Following
ends when a ``_STOP`` file appears in the folder (it is then removed: it was meant for
this run, and would end the next one at once) or when ``stop`` is set (Ctrl-C); a
``_STOP`` already there at the start is said (`check_folder`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
from txstream.errors import UsageError

STOP_FILE = "_STOP"
POLL_S = 0.2

log = logging.getLogger(__name__)


class FolderWatch:
    """The complete Parquet files of a folder not seen before, in name order."""

    def __init__(self, folder: str | Path, seen: list[str] = ()):
        self.folder = Path(folder)
        self._seen: set[str] = set(seen)
        self._last: str | None = max(seen, default=None)

    def new_files(self) -> list[Path]:
        """Files that appeared complete since the last call, in name order."""
        found = []
        for path in sorted(self.folder.glob("*.parquet")):
            name = path.name
            if name[0] in "_." or name in self._seen:
                continue
            if self._last is not None and name < self._last:
                if _complete(path):
                    self._seen.add(name)
                    log.warning("%s sorts before %s, already pushed: skipped", name, self._last)
                continue
            if not _complete(path):
                break  # later files wait for this one: name order is ts order
            found.append(path)
            self._seen.add(name)
            self._last = name
        return found

    def stop_requested(self) -> bool:
        """Whether a ``_STOP`` file asks to end."""
        return (self.folder / STOP_FILE).exists()


def check_folder(folder: str | Path) -> str | None:
    """A `UsageError` unless ``folder`` is a folder; a warning if a ``_STOP`` is already
    there (the files present are pushed, then following ends at once)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--follow: {folder} is not a folder")
    if (folder / STOP_FILE).exists():
        return (
            f"{folder / STOP_FILE} is already there: the files present are pushed, then the "
            "session ends (remove it to keep following)"
        )
    return None


def _complete(path: Path) -> bool:
    try:
        pq.read_metadata(path)
    except Exception:  # not (yet) a whole Parquet file
        return False
    return True


def follow(
    push: Callable[[Path], None],
    flush: Callable[[], int],
    folder: str | Path,
    stop: threading.Event,
    on_files: Callable[[list[Path], int], None] | None = None,
    seen: list[str] = (),
) -> int:
    """Push every complete file of ``folder`` as it appears, flushing after each round,
    until ``_STOP`` or ``stop``; the number of files pushed. ``on_files(files,
    watermark)`` is told about each round; files named in ``seen`` were pushed before
    (a resumed session)."""
    watch = FolderWatch(folder, seen)
    pushed = 0
    while True:
        files = watch.new_files()
        for path in files:
            push(path)
        if files:
            watermark = flush()
            pushed += len(files)
            if on_files is not None:
                on_files(files, watermark)
            continue
        if stop.is_set() or watch.stop_requested():
            (watch.folder / STOP_FILE).unlink(missing_ok=True)  # consumed
            return pushed
        stop.wait(POLL_S)
