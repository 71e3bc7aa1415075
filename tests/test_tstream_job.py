"""tstream on Ray: executor actors in shared memory equal serial; failures clean up."""

from __future__ import annotations

import pytest
from compare import assert_same_run
from conftest import actor_processes, txstream_segments
from test_job import _sl_tables
from txstream import Job
from txstream.config import PLACEMENTS
from txstream.errors import RuntimeFailure
from txstream.topologies._generators import WorkloadSpec, generate

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def hot_gs():
    """Hot keys, many parametric reads, 1% aborts: chains depend on each other."""
    events, init = generate("gs", WorkloadSpec(events=60_000, keys=200, theta=0.9, seed=5))
    options = dict(punctuation_interval=10240, progress=False)
    return events, init, Job("gs", **options).run(events, init)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_tstream_on_two_executors_equals_serial(hot_gs, placement):
    events, init, serial = hot_gs
    run = Job("gs", scheduler="tstream", executors=2, placement=placement, sockets=2,
              punctuation_interval=10240, progress=False).run(events, init)  # fmt: skip
    assert_same_run(run.events, run.state, serial.events, serial.state)
    assert run.events.equals(serial.events)  # reasons too, not only their presence
    assert len(run.metrics["breakdown_per_executor_s"]) == 2
    coordinator = run.metrics["coordinator"]  # it resolved the batches that had aborts
    assert coordinator["failed"] > 0 and run.metrics["aborted"] > 0
    assert 0 < coordinator["requests"]["lazy"] <= run.metrics["batches"]["count"]
    assert serial.metrics["coordinator"] is None  # serial aborts on its own
    assert not txstream_segments()


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_failure_in_one_executor_stops_the_team_and_cleans_up(failing_rank):
    events, init = _sl_tables(30)
    if failing_rank == 1:  # event 13 in the second executor's share
        events = events.slice(0, 30).take(list(range(10, 30)) + list(range(10)))
    with pytest.raises(RuntimeFailure, match="on purpose"):
        Job("failing_topology:build", scheduler="tstream", executors=2, progress=False,
            timeout_s=60).run(events, init)  # fmt: skip
    assert not txstream_segments()
    assert not actor_processes("Executor")
    assert not actor_processes("ProgressController")
    assert not actor_processes("Sink")
    assert not actor_processes("Coordinator")
    assert Job("sl", scheduler="tstream", executors=2, progress=False).run(events, init)


def test_a_dead_coordinator_fails_the_run_at_once_and_cleans_up():
    import os
    import signal
    import threading
    import time

    events, init = generate("sl", WorkloadSpec(events=200_000, seed=2))
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            Job("sl", scheduler="tstream", executors=2, udf_cost_us=50, progress=False,
                timeout_s=600).run(events, init)  # fmt: skip
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 120
    while not actor_processes("Coordinator", wait_s=0) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the run (or the warm-up) is under way
    killed_at = time.monotonic()
    for pid in actor_processes("Coordinator", wait_s=0):
        os.kill(pid, signal.SIGKILL)
    runner.join(120)
    assert isinstance(outcome[0], RuntimeFailure), outcome
    assert "died" in str(outcome[0])
    assert time.monotonic() - killed_at < 60  # not the run's 600 s timeout
    assert not txstream_segments()
    assert not actor_processes("Executor")
    assert not actor_processes("Coordinator")
