"""Every option on every scheduler is honoured or refused (contract §5), and an honoured one
does what it says."""

from __future__ import annotations

import subprocess

import pytest
from conftest import run_command
from local_engine import run_local
from txstream.config import (
    ABORT,
    EXPLORE,
    GRANULARITY,
    HONOURED,
    PLACEMENTS,
    SCHEDULER_OPTIONS,
    SCHEDULERS,
    RunConfig,
)
from txstream.errors import UsageError
from txstream.topologies.generators import WorkloadSpec, generate

VALUES = {"explore": EXPLORE, "granularity": GRANULARITY, "abort": ABORT, "placement": PLACEMENTS}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("option", SCHEDULER_OPTIONS)
def test_every_option_is_honoured_or_refused(scheduler, option):
    honoured = HONOURED.get(scheduler, {})
    for value in VALUES[option]:
        if option in honoured:
            assert getattr(RunConfig(scheduler=scheduler, **{option: value}), option) == value
        else:
            with pytest.raises(UsageError, match=f"--{option} does not apply to"):
                RunConfig(scheduler=scheduler, **{option: value})
    # not given: the scheduler's default (None where it does not apply), as recorded
    effective = RunConfig(scheduler=scheduler)
    assert getattr(effective, option) == honoured.get(option)
    assert effective.as_dict()[option] == honoured.get(option)
    assert RunConfig(**effective.as_dict()) == effective


@pytest.mark.parametrize(
    "args",
    [
        ["--scheduler", "serial", "--placement", "shared-nothing"],
        ["--scheduler", "tstream", "--abort", "eager"],
    ],
)
def test_the_command_refuses_an_option_that_does_not_apply_in_one_line(tmp_path, args):
    proc = subprocess.run(
        run_command(
            "sl",
            str(tmp_path / "x"),
            str(tmp_path),
            str(tmp_path / "out"),
            *args,
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "does not apply" in proc.stderr


def test_morphstream_runs_every_batch_with_the_dimensions_it_is_given():
    events, init = generate("gs", WorkloadSpec(events=2000, keys=40, theta=0.8, seed=4))
    for explore, granularity, abort in [("dfs", "coarse", "lazy"), ("ns", "fine", "eager")]:
        decisions = run_local(
            "gs",
            events,
            init,
            scheduler="morphstream",
            executors=2,
            explore=explore,
            granularity=granularity,
            abort=abort,
            punctuation_interval=500,
            punctuation_ms=None,
        ).metrics["decisions"]
        assert decisions["explore"][explore] == 4 and decisions["granularity"][granularity] == 4
        assert decisions["abort"][abort] == 4


def test_the_transport_is_chosen_by_what_must_reach_the_team(monkeypatch):
    from txstream.cluster.transport import RayTransport, ThreadTransport, transport_for

    def chosen(choice, address=None, named=False, checkpoints=False, dashboard=False):
        return type(transport_for(choice, address, named, checkpoints, dashboard))

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert chosen("auto") is ThreadTransport
    assert chosen("auto", address="127.0.0.1:6379") is RayTransport
    assert chosen("auto", named=True) is RayTransport
    assert chosen("auto", checkpoints=True) is RayTransport
    assert chosen("auto", dashboard=True) is RayTransport
    assert chosen("ray") is RayTransport
    assert chosen("threads", checkpoints=True) is ThreadTransport
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert chosen("auto") is RayTransport
    with pytest.raises(UsageError, match="takes no --address"):
        RunConfig(transport="threads", address="127.0.0.1:6379")


def test_a_named_session_on_threads_is_refused_before_anything_starts(tmp_path):
    from txstream import Job

    events, init = generate("sl", WorkloadSpec(events=10))
    with pytest.raises(UsageError, match="takes no --name"):
        Job("sl", transport="threads", progress=False).start(init, name="ledger")
