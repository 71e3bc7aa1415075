"""A Ray cluster that dies under a run is noticed within seconds (no Ray needed here: the
watch only sees whether the GCS port accepts connections)."""

from __future__ import annotations

import socket
import time

import pytest
from txstream.cluster import watch
from txstream.errors import RuntimeFailure


def test_a_gcs_that_refuses_connections_fails_the_main_thread_within_seconds(monkeypatch):
    monkeypatch.setattr(watch, "LOST_AFTER_S", 1.0)
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen(16)
    address = f"127.0.0.1:{gcs.getsockname()[1]}"
    with pytest.raises(RuntimeFailure) as failure, watch.watch_cluster(address, "the cluster"):
        time.sleep(3)  # up and answering: nothing happens
        gcs.close()  # the cluster dies
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.05)  # the run's main thread, polling Ray
    assert str(failure.value) == (
        f"Ray: the cluster is gone: its GCS at {address} refuses connections (Connection refused)"
    )
