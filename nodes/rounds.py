"""A node's checkpoints as rounds of the run's: every node checkpoints at the same unit
boundary, and the round counts once every node has (`NodesSession._checkpoint`).

A node's checkpoint is named by the events it ran itself. After units gathered on another
node its state changes without any (the values of its cells come back), so a round's
checkpoint can have the name of the round before's and replace it. If the round does not
complete (a node lost meanwhile), the run goes back to the round before: so the checkpoint
a newer one replaces is kept aside until then (`KEPT`), and each is marked with its round.

A node stopped for a recovery is reported dead before its process is gone: it may still be
writing a checkpoint, replacing the very one its successor goes back to. So the process
of a node holds its folder (`LOCK`) as long as it lives, and its successor takes it back
only once it holds the folder in turn (`claim`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

from txstream.errors import RuntimeFailure
from txstream.state.checkpoints import PREFIX, CheckpointStore

ROUND = "round"
"""In a checkpoint's folder: the round it belongs to."""
KEPT = "kept"
"""In a node's checkpoint folder: its checkpoint that the newest replaced."""
LOCK = "lock"
"""In a node's checkpoint folder: locked (`fcntl.flock`) by the process that writes there;
the kernel unlocks it when that process ends, however it ends."""
CLAIM_POLL_S = 0.01


def claim(folder: Path, timeout_s: float) -> int:
    """Hold ``folder`` for as long as this process lives (the descriptor returned stays
    open), once the process that held it before has ended. RuntimeFailure if it has not
    within ``timeout_s``."""
    folder.mkdir(parents=True, exist_ok=True)
    held = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return held
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(held)
                raise RuntimeFailure(
                    f"{folder}: the process of the node before still runs after {timeout_s} s"
                ) from None
            time.sleep(CLAIM_POLL_S)


def keep_aside(folder: Path, ts: int) -> None:
    """Before a checkpoint of ``ts`` events is written in ``folder``: the one of the same
    ts, if any, copied aside."""
    same = folder / f"{PREFIX}{ts:012d}"
    if same.exists():
        shutil.rmtree(folder / KEPT, ignore_errors=True)
        shutil.copytree(same, folder / KEPT)


def mark(folder: Path, ts: int, number: int) -> None:
    """The checkpoint of ``ts`` events in ``folder`` belongs to round ``number``."""
    (folder / f"{PREFIX}{ts:012d}" / ROUND).write_text(str(number))


def take_back(folder: Path, upto: int, number: int) -> None:
    """``folder``'s checkpoints as of round ``number`` (0: none), whose checkpoint covers
    ``upto`` events: newer ones go, and one that replaced it (or a process that ended
    while replacing it left none) gives way to the one kept."""
    CheckpointStore(folder).drop_after(upto)
    taken = folder / f"{PREFIX}{upto:012d}"
    if round_of(taken) == number:
        return
    shutil.rmtree(taken, ignore_errors=True)
    kept = folder / KEPT
    if kept.exists() and round_of(kept) == number:
        kept.rename(taken)


def round_of(path: Path) -> int | None:
    """The round the checkpoint at ``path`` belongs to (None: not marked)."""
    marked = path / ROUND
    return int(marked.read_text()) if marked.exists() else None
