"""A deadline and the signals for a command that waits on Ray in the main thread.

While Ray's client connects or waits for an answer, the main thread is inside Ray's C++
code: Python's signal handlers (Ray's own SIGTERM handler included) run only when it
returns, which for an unreachable or dead cluster is never. CPython's C-level handler
still writes each signal's number to the wakeup file descriptor, whatever thread the
signal reaches, so a watchdog thread reads it there: SIGINT or SIGTERM, or the deadline,
ends the process at once with one line on stderr. Meanwhile Ray's client's own complaints
(``Failed to connect to GCS ...``, repeated) go nowhere: the one line says what failed.
Only for commands that start nothing (`query`, `status`): there is nothing to clean up.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_S = 0.2


@contextmanager
def watchdog(seconds: float, timeout_line: str, timeout_code: int) -> Iterator[None]:
    """Run the ``with`` block under a deadline of ``seconds``: past it, print
    ``timeout_line`` on stderr and exit with ``timeout_code``; on SIGINT or SIGTERM, print
    ``txstream: interrupted`` and exit with 128 + the signal's number. Main thread only."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    stderr = os.dup(2)
    handlers = {signum: signal.signal(signum, _nothing) for signum in _SIGNALS}
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done = threading.Event()
    thread = threading.Thread(
        target=_watch,
        args=(done, read, stderr, time.monotonic() + seconds, timeout_line, timeout_code),
        daemon=True,
    )
    thread.start()
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(stderr, 2)
        done.set()
        thread.join()
        signal.set_wakeup_fd(wakeup)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for fd in (read, write, stderr):
            os.close(fd)


def _nothing(signum: int, frame: object) -> None:
    """The Python-level handler while the watchdog runs: the watchdog acts on the signal."""


def _watch(
    done: threading.Event, wakeup: int, stderr: int, deadline: float, line: str, code: int
) -> None:
    while not done.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _end(stderr, line, code)
        ready, _, _ = select.select([wakeup], [], [], min(_POLL_S, remaining))
        if ready:
            received = os.read(wakeup, 1)
            if received and not done.is_set():
                _end(stderr, "txstream: interrupted", 128 + received[0])


def _end(stderr: int, line: str, code: int) -> None:
    """One line on stderr, then the process ends without waiting for Ray's threads."""
    sys.stdout.flush()
    os.write(stderr, f"{line}\n".encode())
    os._exit(code)
