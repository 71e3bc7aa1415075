"""The Coordinator: it has transactions redone on hot keys, and its failure stops the
team (threads). Its marking is tested in test_tpg.py."""

from __future__ import annotations

import pytest
from local_engine import run_local
from txstream.actors.coordinator import Coordinator
from txstream.errors import RuntimeFailure
from txstream.topologies.generators import WorkloadSpec, generate


def test_on_hot_keys_the_coordinator_has_transactions_redone(monkeypatch):
    served = []
    serve = Coordinator.serve
    monkeypatch.setattr(Coordinator, "serve", lambda self: served.append(serve(self)))
    events, init = generate("sl", WorkloadSpec(events=5000, keys=50, theta=0.8, seed=3))
    serial = run_local("sl", events, init, punctuation_interval=500)
    tstream = run_local(
        "sl", events, init, scheduler="tstream", executors=2, punctuation_interval=500
    )
    assert tstream.events.equals(serial.events) and tstream.state == serial.state
    assert (serial.events.column("status").to_numpy(zero_copy_only=False) == "aborted").any()
    [stats] = served  # failures in exploration, some of them on polluted inputs: redone
    assert stats["failed"] > 0 and stats["marked"] > 0 and stats["requests"]["lazy"] <= 10


def test_a_failing_coordinator_stops_the_team_with_its_error(monkeypatch):
    def fail(self, policy, dims, begin, end):
        raise RuntimeError("coordinator failed on purpose")

    monkeypatch.setattr(Coordinator, "_resolve", fail)
    events, init = generate("sl", WorkloadSpec(events=2000, keys=20, seed=1))
    with pytest.raises(RuntimeFailure, match="Coordinator: RuntimeError: .*on purpose"):
        run_local("sl", events, init, scheduler="tstream", executors=2, punctuation_interval=100)
