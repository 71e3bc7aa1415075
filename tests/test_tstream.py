"""`tstream` equals `serial` for every topology, placement, team size and punctuation
interval, on randomized workloads with hot keys, cascading aborts and malformed events."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from local_engine import run_local
from txstream.config import PLACEMENTS
from txstream.topologies import BUNDLED
from workloads import workloads

INTERVALS = (1, 7, 97, 10240)
TEAMS = (1, 2, 3)


def _same(got, want) -> None:
    got_events, got_state = got
    want_events, want_state = want
    assert got_events.equals(want_events), _first_difference(got_events, want_events)
    assert sorted(got_state) == sorted(want_state)
    for name, table in want_state.items():
        assert got_state[name].equals(table), name


def _first_difference(got, want) -> str:
    for name in want.column_names:
        g, w = got.column(name).to_pylist(), want.column(name).to_pylist()
        if g != w:
            i = next(i for i in range(min(len(g), len(w))) if g[i] != w[i])
            return f"column {name!r} differs first at ts {i}: got {g[i]!r}, want {w[i]!r}"
    return "schemas differ"


@pytest.mark.parametrize("topology", BUNDLED)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("executors", TEAMS)
@pytest.mark.parametrize("interval", INTERVALS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tstream_equals_serial(topology, placement, executors, interval, data):
    events, init = data.draw(workloads(topology))
    per_chunk = data.draw(st.integers(1, 3), label="batches_per_chunk")
    sockets = data.draw(
        st.lists(st.integers(0, 1), min_size=executors, max_size=executors), label="sockets"
    )
    want = run_local(topology, events, init, punctuation_interval=interval,
                     batches_per_chunk=per_chunk)  # fmt: skip
    got = run_local(
        topology, events, init, scheduler="tstream", executors=executors, placement=placement,
        sockets=sockets, punctuation_interval=interval, batches_per_chunk=per_chunk,
    )  # fmt: skip
    _same(got, want)


@pytest.mark.parametrize("topology", BUNDLED)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tstream_equals_serial_on_long_streams(topology, data):
    """Many chunks and batches: chains, versions and rollbacks across their boundaries."""
    events, init = data.draw(workloads(topology, max_events=600))
    executors = data.draw(st.integers(2, 3), label="executors")
    placement = data.draw(st.sampled_from(PLACEMENTS), label="placement")
    want = run_local(topology, events, init, punctuation_interval=64, batches_per_chunk=2)
    got = run_local(
        topology, events, init, scheduler="tstream", executors=executors, placement=placement,
        sockets=[0, 1, 1][:executors], punctuation_interval=64, batches_per_chunk=2,
    )  # fmt: skip
    _same(got, want)
