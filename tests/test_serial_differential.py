"""`serial` equals the plain-Python model of docs/contract.md on randomized workloads."""

from __future__ import annotations

import naive
import pytest
from compare import assert_same_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from local_engine import run_local
from txstream.topologies import BUNDLED
from workloads import workloads

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("topology", BUNDLED)
@SETTINGS
@given(data=st.data())
def test_serial_equals_model(topology, data):
    events, init = data.draw(workloads(topology))
    interval = data.draw(st.sampled_from([1, 2, 7, 97, 10240]), label="punctuation_interval")
    per_chunk = data.draw(st.integers(1, 4), label="batches_per_chunk")
    got = run_local(
        topology, events, init, punctuation_interval=interval, batches_per_chunk=per_chunk
    )
    assert_same_run(got.events, got.state, *naive.run_model(topology, events, init))


@pytest.mark.parametrize("topology", BUNDLED)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_serial_equals_model_on_long_streams(topology, data):
    events, init = data.draw(workloads(topology, max_events=600))
    got = run_local(topology, events, init, punctuation_interval=64)
    assert_same_run(got.events, got.state, *naive.run_model(topology, events, init))
