"""Pushed tables on their way to the ProgressController: one Ray call at a time.

Every call costs the ProgressController about as much CPU whatever it carries (a
millisecond or two on a loaded host, where it competes with the executors for the cores:
at a hundred pushes a second, most of its CPU). So a session does not make one call
per push: the `Outbox` sends everything pushed so far in one call as soon as the
previous call has been taken in, and pushes made meanwhile gather into the next one.
Calls follow the controller's pace, not the caller's: ``push`` returns at once, a busy
controller gets fewer, larger calls, and an idle one gets each push at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa
from txstream.cluster.transport import get
from txstream.errors import RuntimeFailure

Send = Callable[[pa.Table, list[tuple[int, float]]], object]
"""Sends a table and its ``(rows, arrival)`` runs; returns the call's reference."""


class Outbox:
    """Tables pushed and not yet taken in by the ProgressController, sent from a thread
    (see module docstring). ``send`` makes the call; ``timeout_s`` bounds each call."""

    def __init__(self, send: Send, timeout_s: float):
        self._send = send
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._tables: list[pa.Table] = []
        self._runs: list[tuple[int, float]] = []
        self._busy = False  # a call made and not yet taken in
        self._closed = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="txstream-outbox", daemon=True)
        self._thread.start()

    def put(self, table: pa.Table, arrival: float) -> None:
        """Queue ``table`` (of the canonical event schema), pushed at ``arrival``."""
        with self._cond:
            self._raise_failure()
            self._tables.append(table)
            self._runs.append((table.num_rows, arrival))
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until everything queued has been taken in (before a call that must come
        after it: a source, a flush, the end)."""
        with self._cond:
            while (self._tables or self._busy) and self._failure is None:
                self._cond.wait()
            self._raise_failure()

    def close(self) -> None:
        """Stop the thread (what is still queued is dropped: only after a failure)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)  # a call stuck on a dead actor ends with Ray

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeFailure(f"pushing events failed: {self._failure}") from self._failure

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._tables and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                tables, runs = self._tables, self._runs
                self._tables, self._runs = [], []
                self._busy = True
            try:
                get(self._send(pa.concat_tables(tables), runs), self._timeout_s)
            except BaseException as exc:  # surfaces on the next put or drain
                with self._cond:
                    self._failure = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()
