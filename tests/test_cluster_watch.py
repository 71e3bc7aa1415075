"""A Ray cluster that dies under a run is noticed within seconds (no Ray needed here: the
watch only sees whether the GCS port accepts connections)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import nullcontext

import pytest
import ray
from txstream.cluster import ray_runtime, watch
from txstream.errors import RuntimeFailure


def test_a_gcs_that_refuses_connections_fails_the_main_thread_within_seconds(monkeypatch):
    monkeypatch.setattr(watch, "LOST_AFTER_S", 1.0)
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen(16)
    address = f"127.0.0.1:{gcs.getsockname()[1]}"
    gone = threading.Event()
    with (
        pytest.raises(RuntimeFailure) as failure,
        watch.watch_cluster(address, "the cluster", gone),
    ):
        time.sleep(3)  # up and answering: nothing happens
        assert not gone.is_set()
        gcs.close()  # the cluster dies
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.05)  # the run's main thread, polling Ray
    assert str(failure.value) == (
        f"Ray: the cluster is gone: its GCS at {address} refuses connections (Connection refused)"
    )
    assert gone.is_set()


def test_a_shutdown_that_hangs_on_a_lost_cluster_is_left_after_its_bound(monkeypatch, caplog):
    hung = threading.Event()
    monkeypatch.setattr(ray_runtime, "GONE_SHUTDOWN_S", 0.5)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", hung.wait)  # Ray's client waiting on a dead GCS
    gone = threading.Event()
    gone.set()
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            ray_runtime._shutdown(lambda _name: nullcontext(), "disconnecting from Ray", gone)
    finally:
        hung.set()
    assert time.monotonic() - started < 2
    assert "did not shut down within 0.5 s of its cluster's loss" in caplog.text
