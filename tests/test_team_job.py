"""Parallel schedulers on Ray: executor actors in shared memory equal serial; a failing
or killed executor, or a killed Coordinator, fails the run at once and cleans up."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from compare import assert_same_run
from conftest import actor_processes, txstream_segments
from test_job import _sl_tables
from txstream import Job
from txstream.config import PLACEMENTS
from txstream.errors import RuntimeFailure
from txstream.topologies.generators import WorkloadSpec, generate

pytestmark = pytest.mark.usefixtures("ray_cluster")
SCHEDULERS = ("tstream", "morphstream")


@pytest.fixture(scope="module")
def hot_gs():
    """Hot keys, many parametric reads, 1% aborts: chains depend on each other."""
    events, init = generate("gs", WorkloadSpec(events=60_000, keys=200, theta=0.9, seed=5))
    options = dict(punctuation_interval=10240, progress=False)
    return events, init, Job("gs", **options).run(events, init)


TEAMS = [("tstream", p) for p in PLACEMENTS] + [("morphstream", "shared-nothing")]


@pytest.mark.parametrize("scheduler,placement", TEAMS)
def test_two_executors_equal_serial(hot_gs, scheduler, placement):
    events, init, serial = hot_gs
    run = Job(
        "gs",
        scheduler=scheduler,
        executors=2,
        placement=placement,
        sockets=2,
        punctuation_interval=10240,
        progress=False,
        # operations of 1 us: morphstream explores graphs (cheaper ones, executor 0 walks)
        udf_cost_us=1.0 if scheduler == "morphstream" else 0.0,
    ).run(events, init)
    assert_same_run(run.events, run.state, serial.events, serial.state)
    assert run.events.equals(serial.events)  # reasons too, not only their presence
    assert len(run.metrics["breakdown_per_executor_s"]) == 2
    # the batches that had aborts were resolved: by the Coordinator, or by the team for
    # failures that changed nothing (`Repairs`: GS's statements are one per transaction)
    coordinator = run.metrics["coordinator"]
    assert coordinator["failed"] + run.metrics["settled_failures"] > 0
    assert run.metrics["aborted"] > 0
    assert serial.metrics["coordinator"] is None  # serial aborts on its own
    assert not txstream_segments()
    if scheduler == "morphstream":
        batches = run.metrics["batches"]["count"]
        decisions = run.metrics["decisions"]
        walked = decisions["explore"]["ordered"]  # no units, no abort policy
        for dimension, counts in decisions.items():
            assert sum(counts.values()) == batches - walked * (dimension != "explore"), dimension
        assert len(run.metrics["decision_batches"]["operations"]) == batches
        assert run.metrics["config"]["explore"] == "auto"


def _clean() -> None:
    assert not txstream_segments()
    for actor in ("Executor", "ProgressController", "Sink", "Coordinator"):
        assert not actor_processes(actor), actor


@pytest.mark.parametrize(
    "scheduler,failing_rank", [("tstream", 0), ("tstream", 1), ("morphstream", 1)]
)
def test_failure_in_one_executor_stops_the_team_and_cleans_up(scheduler, failing_rank):
    events, init = _sl_tables(30)
    if failing_rank == 1:  # event 13 in the second executor's share
        events = events.slice(0, 30).take(list(range(10, 30)) + list(range(10)))
    with pytest.raises(RuntimeFailure, match="on purpose"):
        Job(
            "failing_topology:build", scheduler=scheduler, executors=2, progress=False, timeout_s=60
        ).run(events, init)
    _clean()
    assert Job("sl", scheduler=scheduler, executors=2, progress=False).run(events, init)


def _kill_mid_run(scheduler: str, actor: str) -> BaseException | None:
    """Run a long job on two executors and SIGKILL ``actor``'s processes once it runs;
    what the run raised."""
    events, init = generate("sl", WorkloadSpec(events=200_000, seed=2))
    outcome: list[BaseException | None] = []
    assert not actor_processes(actor)  # those of earlier runs have exited

    def run() -> None:
        try:
            Job(
                "sl",
                transport="ray",  # an actor's process is killed
                scheduler=scheduler,
                executors=2,
                udf_cost_us=50,
                progress=False,
                timeout_s=600,
            ).run(events, init)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 120
    while not actor_processes(actor, wait_s=0) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the run (or the warm-up) is under way
    killed_at = time.monotonic()
    for pid in actor_processes(actor, wait_s=0)[:1]:
        os.kill(pid, signal.SIGKILL)
    runner.join(120)
    assert time.monotonic() - killed_at < 60  # not the run's 600 s timeout
    return outcome[0]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_dead_coordinator_fails_the_run_at_once_and_cleans_up(scheduler):
    outcome = _kill_mid_run(scheduler, "Coordinator")
    assert isinstance(outcome, RuntimeFailure), outcome
    assert "died" in str(outcome)
    _clean()


def test_a_killed_executor_fails_a_morphstream_run_at_once_and_cleans_up():
    outcome = _kill_mid_run("morphstream", "Executor")
    assert isinstance(outcome, RuntimeFailure), outcome
    assert "died" in str(outcome)
    _clean()
