"""The threads engine (the real ProgressController on ThreadTransport) cuts punctuations
by time and when the team is idle, not only by count, and deals chunks whole where the
scheduler asks; results stay the model's. No Ray."""

from __future__ import annotations

import time

import naive
import pytest
import ray
from compare import assert_same_run
from txstream import Job, schedulers
from txstream.actors.progress import share_bounds
from txstream.cluster.transport import ThreadTransport
from txstream.config import RunConfig
from txstream.topologies.generators import WorkloadSpec, generate

TIMEOUT_S = 30.0


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """The engine on threads starts no Ray."""
    running = ray.is_initialized()  # another test of this process may have started one

    def refuse(*args, **kwargs):
        raise AssertionError("the threads engine started Ray")

    monkeypatch.setattr(ray, "init", refuse)
    yield
    assert ray.is_initialized() == running


def _job(topology: str, **options) -> Job:
    return Job(
        topology,
        transport=ThreadTransport(),
        progress=False,
        timeout_s=TIMEOUT_S,
        punctuation_interval=10240,
        **options,
    )


def _wait_for_watermark(session, w: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while session.watermark < w:
        assert time.monotonic() < deadline, f"watermark {session.watermark}, want {w}"
        time.sleep(0.005)


def test_small_pushes_while_the_team_is_busy_are_cut_by_time():
    """Every chunk takes 20 ms (slow_topology): pushes 2 ms apart wait in the open batch
    longer than punctuation_ms while one is in flight, far fewer than the interval."""
    events, init = generate("sl", WorkloadSpec(events=600, keys=20, seed=1))
    with _job("slow_topology:build", punctuation_ms=5.0).start(init) as session:
        for first in range(0, events.num_rows, 10):
            session.push(events.slice(first, 10))
            time.sleep(0.002)
        result = session.close()
    cuts = result.metrics["punctuations"]
    assert cuts["by_count"] == 0
    assert cuts["by_time"] > 0
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))


def test_an_open_batch_is_cut_when_the_team_goes_idle():
    """No count or time cut can come (few events, no punctuation_ms), no flush: the
    outputs still arrive, each time the pushes pause."""
    events, init = generate("sl", WorkloadSpec(events=300, keys=20, seed=2))
    with _job("sl", punctuation_ms=None).start(init) as session:
        for end in (100, 101, 300):
            session.push(events.slice(session.pushed, end - session.pushed))
            _wait_for_watermark(session, end)
            assert session.watermark == end
        result = session.close()
    assert result.metrics["punctuations"] == {"by_count": 0, "by_time": 0}
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))


def test_a_team_of_threads_gets_its_chunks_whole_on_executor_0_where_the_scheduler_asks():
    """Under one GIL a share's Python steps cost about as much wall as the whole chunk's:
    serial and morphstream's `auto` (which walks chunks in order from their statements)
    ask for whole chunks; the schedulers that build operations on every executor do not."""
    assert share_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert share_bounds(10, 3, whole=True) == [(0, 10), (10, 10), (10, 10)]
    asks = {
        (scheduler, explore): schedulers.get(scheduler).whole_chunks(
            RunConfig(scheduler=scheduler, explore=explore)
        )
        for scheduler, explore in [("serial", None), ("tstream", None)]
        + [("morphstream", e) for e in (None, "auto", "bfs", "dfs", "ns")]
    }
    assert asks == {
        ("serial", None): True,
        ("tstream", None): False,
        ("morphstream", None): True,
        ("morphstream", "auto"): True,
        ("morphstream", "bfs"): False,
        ("morphstream", "dfs"): False,
        ("morphstream", "ns"): False,
    }
