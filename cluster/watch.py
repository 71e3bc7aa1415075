"""Noticing that the Ray cluster a run uses is gone, before Ray ends the process silently.

When the GCS of its cluster stops answering, Ray's client in the driver retries for a
minute and then ends the process itself (exit 1, its reason only in Ray's log: for a run,
the run's log), so the run could neither say what failed nor clean up what it started. A
thread checks that the GCS port still accepts connections; once it has refused them for
`LOST_AFTER_S`, the main thread gets a `RuntimeFailure` naming the cluster, raised like a
Ctrl-C (at its next Python instruction: the run's waits on Ray are short polls), so the
run's ordinary failure path reports it and cleans up.
"""

from __future__ import annotations

import _thread
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from txstream.errors import RuntimeFailure

CHECK_EVERY_S = 1.0
LOST_AFTER_S = 5.0
"""How long the GCS may refuse connections before the cluster counts as gone (a GCS that
restarts, with Ray's fault tolerance, takes less)."""
_SIGNAL = signal.SIGUSR1
"""The signal whose handler raises the failure in the main thread (simulated with
`_thread.interrupt_main`, never sent to the process)."""


@contextmanager
def watch_cluster(gcs: str, cluster: str, gone: threading.Event) -> Iterator[None]:
    """While the ``with`` block runs, raise a `RuntimeFailure` in the main thread if the
    GCS at ``gcs`` (``host:port``) stops accepting connections, and set ``gone``;
    ``cluster`` names it in the message (``the Ray cluster at HOST:PORT``). Does nothing
    outside the main thread (signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    lost: list[str] = []

    def raise_lost(signum: int, frame: object) -> None:
        raise RuntimeFailure(lost[0], "Ray")

    previous = signal.signal(_SIGNAL, raise_lost)
    stop = threading.Event()
    thread = threading.Thread(target=_watch, args=(gcs, cluster, stop, lost, gone), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        signal.signal(_SIGNAL, previous)


def _watch(
    gcs: str, cluster: str, stop: threading.Event, lost: list[str], gone: threading.Event
) -> None:
    host, _, port = gcs.rpartition(":")
    refused_since = None
    while not stop.wait(CHECK_EVERY_S):
        try:
            socket.create_connection((host, int(port)), timeout=CHECK_EVERY_S).close()
            refused_since = None
            continue
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        now = time.monotonic()
        refused_since = refused_since or now
        if now - refused_since >= LOST_AFTER_S:
            lost.append(f"{cluster} is gone: its GCS at {gcs} refuses connections ({reason})")
            gone.set()
            _thread.interrupt_main(_SIGNAL)
            return
