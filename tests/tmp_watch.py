"""What a process tree holds under /tmp while it runs, to check it is gone afterwards."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from txstream.cluster.scratch import descendants

TMP = Path("/tmp")


class TmpWatch:
    """Samples, every 0.2 s until stopped, the paths under /tmp that process ``pid`` and
    its descendants map (native libraries, shared files) or hold open (logs, sockets),
    made since the watch began (not, say, the libraries of a virtualenv that lies under
    /tmp), and which top-level entries of /tmp they lie in; `left` lists those still
    there, except under ``keep`` (the test's own inputs and outputs)."""

    def __init__(self, pid: int, keep: Path) -> None:
        self.pid = pid
        self.keep = keep
        self.before = set(os.listdir(TMP))
        self.since = time.time() - 1.0  # file times are coarser than the clock
        self.paths: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for pid in [self.pid, *descendants(self.pid)]:
                self.paths |= {
                    p for p in _held(pid) if not p.is_relative_to(self.keep) and _new(p, self.since)
                }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def left(self) -> list[Path]:
        """Sampled paths still present, and new top-level entries of /tmp they were in."""
        left = {p for p in self.paths if os.path.lexists(p)}
        for path in self.paths:
            top = TMP / path.relative_to(TMP).parts[0]
            if top.name not in self.before and os.path.lexists(top):
                left.add(top)
        return sorted(left)


def _held(pid: int) -> set[Path]:
    """Files under /tmp that ``pid`` maps or has open (not those already deleted)."""
    names = []
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            names += parts[5:]
        names += [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:  # the process ended meanwhile
        pass
    return {Path(n) for n in names if n.startswith("/tmp/") and not n.endswith(" (deleted)")}


def _new(path: Path, since: float) -> bool:
    """Whether ``path`` was made (or changed) since ``since``."""
    try:
        return os.lstat(path).st_ctime >= since
    except OSError:  # gone already
        return False
