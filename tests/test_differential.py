"""Every serial-equivalent parallel scheduler equals `serial`, for every topology,
placement, team size {1, 2, 3}, punctuation interval {1, 7, 97, 10240} and its own
options, on randomized workloads with hot keys, cascading aborts, parametric reads of
cells written earlier in the batch, and malformed events.

The baselines lock, mvlk and sstore run on intervals {1, 97, 10240}, and only sstore
places work; so does `serial` itself on 2 and 3 executors. serial and morphstream (whose
`auto` walks chunks of cheap operations in order) run both ways a team deals a chunk:
whole to executor 0, which runs its statements (threads), or in shares whose operations
are built into the chunk (a team of processes; `Scheduler.whole_chunks`). The
matrix is sampled pairwise (`pairwise`): every value of every axis meets every value
of every other axis in some case. MorphStream's cases also include every fixed
combination of its three dimensions and all of them on `auto`. A new scheduler adds
its name and axes to `AXES`.
"""

from __future__ import annotations

from itertools import product

import pytest
from compare import assert_same_tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from local_engine import run_local
from pairwise import pairwise
from txstream import schedulers
from txstream.config import PLACEMENTS
from txstream.topologies import BUNDLED
from workloads import workloads

TEAM = {
    "topology": BUNDLED,
    "placement": PLACEMENTS,
    "executors": (1, 2, 3),
    "punctuation_interval": (1, 7, 97, 10240),
}
DEALING = ("whole", "shares")
"""How a team of threads gets its chunks: as the scheduler asks, or in shares as a team
of processes does (`Scheduler.whole_chunks`)."""
WHOLE = {"topology": BUNDLED, "executors": (1, 2, 3), "punctuation_interval": (1, 97, 10240)}
"""The baselines that give whole transactions to executors; only sstore places work."""
AXES = {
    "serial": {
        "topology": BUNDLED,
        "executors": (2, 3),
        "punctuation_interval": (1, 97, 10240),
        "dealing": DEALING,
    },
    "tstream": TEAM,
    "lock": WHOLE,
    "mvlk": WHOLE,
    "sstore": {**WHOLE, "placement": PLACEMENTS},
    "morphstream": {
        **TEAM,
        "dealing": DEALING,
        "explore": ("auto", "bfs", "dfs", "ns"),
        "granularity": ("auto", "fine", "coarse"),
        "abort": ("auto", "eager", "lazy"),
    },
}
REQUIRED = {
    "morphstream": [
        {"explore": e, "granularity": g, "abort": a}
        for e, g, a in [
            *product(("bfs", "dfs", "ns"), ("fine", "coarse"), ("eager", "lazy")),
            ("auto", "auto", "auto"),
        ]
    ],
}
CASES = [
    pytest.param(name, case, id=f"{name}-" + "-".join(str(v) for v in case.values()))
    for name, axes in AXES.items()
    for case in pairwise(axes, REQUIRED.get(name, ()))
]


@pytest.mark.parametrize("scheduler,case", CASES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_equals_serial(scheduler, case, data):
    case = dict(case)
    topology = case.pop("topology")
    dealing = case.pop("dealing", "whole")
    events, init = data.draw(workloads(topology))
    per_chunk = data.draw(st.integers(1, 3), label="batches_per_chunk")
    sockets = data.draw(st.integers(1, 2), label="sockets")
    interval = case["punctuation_interval"]
    want = run_local(
        topology, events, init, punctuation_interval=interval, batches_per_chunk=per_chunk
    )
    got = run_dealt(
        dealing,
        topology,
        events,
        init,
        scheduler=scheduler,
        sockets=sockets,
        batches_per_chunk=per_chunk,
        **case,
    )
    assert_same_tables(got, want)


def run_dealt(dealing: str, *args, scheduler: str, **options):
    """`run_local`, the team's chunks dealt in shares (as to a team of processes) for
    ``"shares"``, as the scheduler asks for ``"whole"``."""
    with pytest.MonkeyPatch.context() as patch:
        if dealing == "shares":
            in_shares = classmethod(lambda cls, config: False)
            patch.setattr(schedulers.get(scheduler), "whole_chunks", in_shares)
        return run_local(*args, scheduler=scheduler, **options)


@pytest.mark.parametrize("scheduler", AXES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_equals_serial_on_long_streams(scheduler, data):
    """Many chunks and batches: links, versions and rollbacks across their boundaries."""
    topology = data.draw(st.sampled_from(BUNDLED), label="topology")
    events, init = data.draw(workloads(topology, max_events=600))
    options = {
        name: data.draw(st.sampled_from(values), label=name)
        for name, values in AXES[scheduler].items()
        if name not in WHOLE
    }
    dealing = options.pop("dealing", "whole")
    want = run_local(topology, events, init, punctuation_interval=64, batches_per_chunk=2)
    executors = data.draw(st.integers(2, 3), label="executors")
    got = run_dealt(
        dealing,
        topology,
        events,
        init,
        scheduler=scheduler,
        executors=executors,
        sockets=2,
        punctuation_interval=64,
        batches_per_chunk=2,
        **options,
    )
    assert_same_tables(got, want)
