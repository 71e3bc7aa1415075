"""The door of a named session over several nodes, for outside readers (`txstream query`,
`txstream status`): a Ray actor named as the session, whose questions the driver answers.

Only the driver knows which steps it has submitted, so only it can ask every owner for its
rows at one cut (`NodesSession.query`). The door queues a reader's question; a thread of
the driver takes it (`next_question`), answers it between two units of input and hands
the answer back (`answer`), which the reader's call returns.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

import ray
from txstream.errors import RuntimeFailure

CONCURRENCY = {"readers": 16, "driver": 1}
"""Readers wait for their answers on threads of their own; the driver's calls never queue
behind them."""


class NodesFrontDoor:
    """See the module docstring; ``timeout_s``: how long a reader waits for its answer;
    ``status``: the run's figures until the driver reports newer ones."""

    def __init__(self, timeout_s: float, status: dict[str, Any]):
        self.timeout_s = timeout_s
        self._questions: queue.Queue = queue.Queue()
        self._answers: dict[int, tuple[threading.Event, list]] = {}
        self._ids = itertools.count()
        self._status = status

    @ray.method(concurrency_group="readers")
    def query(self, table: str, keys: list[int] | None) -> Any:
        """``(w, rows)`` of ``table`` at a cut every node has reached (the driver's)."""
        return self._ask(("query", table, keys))

    @ray.method(concurrency_group="readers")
    def status(self) -> dict[str, Any]:
        """What the driver last reported of the run (watermark, events, throughput)."""
        return dict(self._status)

    def _ask(self, question: tuple) -> Any:
        number, done = next(self._ids), threading.Event()
        self._answers[number] = (done, [])
        self._questions.put((number, question))
        try:
            if not done.wait(self.timeout_s):
                raise RuntimeFailure(f"the session's driver did not answer in {self.timeout_s} s")
            value, failure = self._answers[number][1]
        finally:
            self._answers.pop(number, None)
        if failure is not None:
            raise failure
        return value

    @ray.method(concurrency_group="driver")
    def next_question(self, wait_s: float) -> tuple | None:
        """The oldest question not taken yet, ``(number, question)``; None if none comes
        within ``wait_s``."""
        try:
            return self._questions.get(timeout=wait_s)
        except queue.Empty:
            return None

    @ray.method(concurrency_group="driver")
    def answer(self, number: int, value: Any, failure: Exception | None) -> None:
        """The answer to question ``number`` (its value, or the error to raise)."""
        waiting = self._answers.get(number)
        if waiting is not None:
            waiting[1][:] = [value, failure]
            waiting[0].set()

    @ray.method(concurrency_group="driver")
    def report(self, status: dict[str, Any]) -> None:
        """The driver's figures of the run, for `status`."""
        self._status = status
