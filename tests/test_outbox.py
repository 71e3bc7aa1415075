"""Outbox (txstream.engine.outbox) with a fake ``send`` whose calls the test completes."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import pytest
from txstream.engine.outbox import Outbox
from txstream.errors import RuntimeFailure

WAIT_S = 5.0


class FakeController:
    """Records every call the outbox makes; each returns a Future the test completes."""

    def __init__(self):
        self.calls: queue.Queue[tuple[pa.Table, list, Future]] = queue.Queue()
        self.futures: list[Future] = []

    def send(self, table: pa.Table, runs: list[tuple[int, float]]) -> Future:
        future: Future = Future()
        self.futures.append(future)
        self.calls.put((table, runs, future))
        return future

    def next_call(self) -> tuple[pa.Table, list, Future]:
        return self.calls.get(timeout=WAIT_S)

    def no_call(self, wait_s: float = 0.1) -> bool:
        time.sleep(wait_s)
        return self.calls.empty()


def _events(first: int, n: int) -> pa.Table:
    return pa.table({"ts": pa.array(range(first, first + n), pa.int64())})


@pytest.fixture
def controller():
    return FakeController()


@pytest.fixture
def outbox(controller):
    box = Outbox(controller.send, timeout_s=WAIT_S)
    yield box
    for future in controller.futures:  # a call left in flight would hold close() up
        if not future.done():
            future.set_result(None)
    box.close()


def _in_thread(action) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def test_a_push_to_an_idle_controller_is_sent_at_once(controller, outbox):
    outbox.put(_events(0, 3), 10.0)
    table, runs, _ = controller.next_call()
    assert table.equals(_events(0, 3))
    assert runs == [(3, 10.0)]


def test_pushes_made_during_a_call_gather_into_the_next_one_in_order(controller, outbox):
    outbox.put(_events(0, 3), 10.0)
    _, _, first = controller.next_call()
    outbox.put(_events(3, 2), 11.0)
    outbox.put(_events(5, 4), 12.0)
    outbox.put(_events(9, 1), 13.0)
    assert controller.no_call()  # one call at a time
    first.set_result(None)
    table, runs, second = controller.next_call()
    assert table.column("ts").to_pylist() == list(range(3, 10))
    assert runs == [(2, 11.0), (4, 12.0), (1, 13.0)]
    second.set_result(None)
    assert controller.no_call()


def test_drain_waits_until_every_call_is_taken_in(controller, outbox):
    outbox.put(_events(0, 3), 10.0)
    _, _, first = controller.next_call()
    outbox.put(_events(3, 2), 11.0)
    drained = threading.Event()
    _in_thread(lambda: (outbox.drain(), drained.set()))
    assert not drained.wait(0.1)
    first.set_result(None)
    _, runs, second = controller.next_call()
    assert runs == [(2, 11.0)]
    assert not drained.wait(0.1)  # the second call is not taken in yet
    second.set_result(None)
    assert drained.wait(WAIT_S)


def test_drain_with_nothing_pushed_returns_at_once(controller, outbox):
    outbox.drain()
    assert controller.no_call(0.01)


def test_a_failed_call_surfaces_on_the_next_put_and_drain(controller, outbox):
    outbox.put(_events(0, 3), 10.0)
    _, _, first = controller.next_call()
    first.set_exception(ValueError("controller died"))
    with pytest.raises(RuntimeFailure, match="controller died") as failure:
        outbox.drain()
    assert isinstance(failure.value.__cause__, ValueError)
    with pytest.raises(RuntimeFailure, match="controller died"):
        outbox.put(_events(3, 1), 11.0)
    assert controller.no_call()


def test_a_drain_waiting_on_a_call_that_fails_raises(controller, outbox):
    outbox.put(_events(0, 3), 10.0)
    _, _, first = controller.next_call()
    outbox.put(_events(3, 1), 11.0)
    raised = queue.Queue()

    def drain():
        try:
            outbox.drain()
        except RuntimeFailure as exc:
            raised.put(exc)

    _in_thread(drain)
    first.set_exception(ValueError("controller died"))
    assert "controller died" in str(raised.get(timeout=WAIT_S))


def test_a_call_that_raises_at_once_fails_like_one_that_fails_later():
    def send(table, runs):
        raise ConnectionError("no controller")

    box = Outbox(send, timeout_s=WAIT_S)
    try:
        box.put(_events(0, 1), 10.0)
        with pytest.raises(RuntimeFailure, match="no controller"):
            box.drain()
    finally:
        box.close()


def test_a_call_not_taken_in_within_the_timeout_fails(controller):
    box = Outbox(controller.send, timeout_s=0.05)
    try:
        box.put(_events(0, 1), 10.0)
        controller.next_call()  # never completed
        with pytest.raises(RuntimeFailure, match="pushing events failed"):
            box.drain()
    finally:
        box.close()


def test_close_ends_the_thread(controller):
    box = Outbox(controller.send, timeout_s=WAIT_S)
    box.put(_events(0, 1), 10.0)
    controller.next_call()[2].set_result(None)
    box.drain()
    assert box._thread.is_alive()
    box.close()
    assert not box._thread.is_alive()
