"""Exactly-once recovery (contract §7): a killed actor, a killed driver, a kill during a
checkpoint write or during a recovery - outputs and state as a run without failure, and
nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import naive
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from conftest import actor_processes, txstream_segments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from txstream import Job
from txstream.errors import UsageError
from txstream.state.checkpoints import (
    ASKED,
    COPIED,
    TEMPORARY,
    WRITTEN,
    CheckpointBuffer,
    CheckpointStore,
)
from txstream.state.sync import STRIDE, publish
from txstream.topologies.generators import WorkloadSpec, generate

pytestmark = pytest.mark.usefixtures("ray_cluster")

TEAMS = {"serial": 1, "tstream": 2, "morphstream": 2, "lock": 2, "mvlk": 2, "sstore": 2}
KINDS = ["Executor", "Coordinator", "Sink", "ProgressController"]
# (scheduler, actor killed, checkpoint every, topology): every actor kind meets every
# interval {1 (every batch), 100 (every hundredth)}, every scheduler but nolock (not
# serial-equivalent) is killed, the Coordinator under both schedulers that have one, every
# topology twice.
CASES = [
    ("lock", "Executor", 1, "gs"),
    ("mvlk", "Executor", 100, "ob"),
    ("tstream", "Coordinator", 1, "ob"),
    ("morphstream", "Coordinator", 100, "gs"),
    ("sstore", "Sink", 1, "tp"),
    ("tstream", "Sink", 100, "sl"),
    ("morphstream", "ProgressController", 1, "tp"),
    ("serial", "ProgressController", 100, "sl"),
]
SLICES = 6


def _workload(topology: str, seed: int) -> tuple[pa.Table, dict[str, pa.Table]]:
    return generate(topology, WorkloadSpec(events=6000, keys=300, theta=0.8, seed=seed))


def _kill_one(kind: str) -> int:
    """SIGKILL one process of this test run hosting a ``kind`` actor; its pid."""
    deadline = time.monotonic() + 60
    while not (pids := actor_processes(kind, wait_s=0)):
        assert time.monotonic() < deadline, f"no {kind} to kill"
        time.sleep(0.05)
    os.kill(pids[-1], signal.SIGKILL)
    return pids[-1]


def _assert_nothing_left() -> None:
    assert not txstream_segments()
    for kind in KINDS:
        assert not actor_processes(kind), kind


@pytest.mark.parametrize("scheduler, kind, every, topology", CASES)
@settings(
    max_examples=1,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_killed_actor_is_recovered_exactly_once(
    tmp_path_factory, scheduler, kind, every, topology, data
):
    """Pushes in slices; one actor is SIGKILLed after a hypothesis-chosen slice, idle or
    busy; the session recovers and ends as a run without failure."""
    events, init = _workload(topology, data.draw(st.integers(0, 3), label="seed"))
    after = data.draw(st.integers(0, SLICES - 1), label="kill after slice")
    idle = data.draw(st.booleans(), label="idle when killed")
    interval = data.draw(st.sampled_from([7, 97]), label="punctuation interval")
    ckpt = tmp_path_factory.mktemp("ckpt")
    job = Job(
        topology,
        transport="ray",  # actors' processes are killed
        scheduler=scheduler,
        executors=TEAMS[scheduler],
        udf_cost_us=20,
        punctuation_interval=interval,
        checkpoint_dir=str(ckpt),
        checkpoint_every=every,
        progress=False,
        timeout_s=120,
    )
    size = -(-events.num_rows // SLICES)
    with job.start(init) as session:
        for i in range(SLICES):
            session.push(events.slice(i * size, size))
            if i == after:
                if idle:
                    session.flush()
                _kill_one(kind)
        result = session.close()
    assert result.metrics["recoveries"], "the kill went unnoticed"
    for recovery in result.metrics["recoveries"]:
        phases = [recovery[p] for p in ("stop_s", "restore_s", "launch_s")]
        assert recovery["seconds"] is not None and sum(phases) <= recovery["seconds"] + 0.003
    assert_same_run(result.events, result.state, *naive.run_model(topology, events, init))
    _assert_nothing_left()


def test_an_actor_killed_during_a_recovery_is_recovered_again(tmp_path):
    events, init = _workload("sl", 5)
    job = Job(
        "sl",
        transport="ray",  # executors' processes are killed
        scheduler="tstream",
        executors=2,
        udf_cost_us=20,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=1,
        progress=False,
        timeout_s=120,
    )
    killed = []

    def kill_the_next_team(team: set[int]) -> None:  # while the session recovers
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if new := [p for p in actor_processes("Executor", wait_s=0) if p not in team]:
                os.kill(new[0], signal.SIGKILL)
                killed.append(new[0])
                return
            time.sleep(0.005)

    with job.start(init) as session:
        session.push(events.slice(0, 3000))
        killer = threading.Thread(
            target=kill_the_next_team, args=(set(actor_processes("Executor", wait_s=0)),)
        )
        killer.start()
        _kill_one("Executor")
        session.push(events.slice(3000))
        result = session.close()
        killer.join()
    assert killed and len(result.metrics["recoveries"]) >= 2
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))
    _assert_nothing_left()


# ----------------------------------------------------------------- the driver killed
def _cli(*args: str, tag: str) -> subprocess.Popen:
    env = {**os.environ, "TXSTREAM_TEST_RUN": tag}
    return subprocess.Popen(
        [sys.executable, "-m", "txstream", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _tagged(tag: str) -> list[int]:
    """Processes of a driver started with ``tag`` (its Ray included) still alive."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"TXSTREAM_TEST_RUN={tag}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                if (proc / "stat").read_text().split()[2] != "Z":
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def _newest_checkpoint(folder: Path) -> int:
    """ts of the newest complete checkpoint in ``folder`` (0: none yet, or the initial one)."""
    return max((int(p.name.removeprefix("ckpt-")) for p in folder.glob("ckpt-*")), default=0)


def _cmdlines(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120])
        except OSError:
            continue
    return [n.decode(errors="replace") for n in names]


def _wait_gone(tag: str, seconds: float = 60) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("when", ["after-3", "writing"])
def test_a_run_whose_driver_was_killed_resumes_from_its_last_checkpoint(tmp_path, when):
    """`txstream run` SIGKILLed after some checkpoints (or while it writes one); the same
    command again continues the run's output and ends as a run without failure; the
    killed driver leaves no process or segment behind."""
    events, init = generate("sl", WorkloadSpec(events=200_000, seed=3))
    pq.write_table(events, tmp_path / "events.parquet")
    (tmp_path / "init").mkdir()
    for name, table in init.items():
        pq.write_table(table, tmp_path / "init" / f"{name}.parquet")
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    args = [
        "run",
        "sl",
        "--input",
        str(tmp_path / "events.parquet"),
        "--init-state",
        str(tmp_path / "init"),
        "--output",
        str(out),
        "--source",
        "arrow",
        "--scheduler",
        "tstream",
        "--executors",
        "2",
        "--udf-cost-us",
        "10",
        "--punctuation-interval",
        "500",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--no-progress",
    ]
    tag = f"{os.getpid()}-driver-{when}"
    driver = _cli(*args, tag=tag)
    seen: set[str] = set()  # checkpoints written (the oldest are pruned)
    deadline = time.monotonic() + 300
    while driver.poll() is None and time.monotonic() < deadline:
        if ckpt.is_dir():
            if when == "writing" and list(ckpt.glob(f"{TEMPORARY}*")):
                break
            seen.update(p.name for p in ckpt.glob("ckpt-*"))
            if when != "writing" and len(seen) > int(when.split("-")[1]):
                break
        time.sleep(0.001)
    assert driver.poll() is None, f"the run ended before the kill: {driver.communicate()}"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    left = _wait_gone(tag, 20)  # the killed driver's reaper stops what its Ray left
    assert not left, f"the killed driver's processes are still alive: {_cmdlines(left)}"
    assert not list(Path("/dev/shm").glob(f"txstream_{driver.pid}_*"))
    assert not list(Path(tempfile.gettempdir()).glob(f"txs-ray-*/session_*_{driver.pid}"))
    assert not (out / "_SUCCESS").exists() and not (out / "events.parquet").exists()
    resumed = _cli(*args, tag=tag + "-again")
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["resumed_from"] > 0 or when == "writing"
    log = (out / "_logs" / "txstream.log").read_text()
    assert log.count(", pid ") == 2  # the killed run's log is kept, the next one appended
    resumed_from = metrics["config"]["resumed_from"]
    assert not resumed_from or f"at event {resumed_from:,}" in log  # said at the start
    state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
    want = Job("sl", progress=False, source="arrow").run(events, init)
    assert_same_run(pq.read_table(out / "events.parquet"), state, want.events, want.state)
    assert not _wait_gone(tag + "-again")
    assert not list(Path("/dev/shm").glob(f"txstream_{driver.pid}_*"))


def test_an_interrupted_session_resumes_and_a_replayed_spark_batch_is_applied_once(spark, tmp_path):
    """Spark micro-batches into a checkpointed session; the driver stops mid-stream (the
    session is torn down, not closed); a new session on the same folders resumes after
    the last batch applied, and Spark delivering that batch again changes nothing."""
    from txstream.connectors.streaming import foreach_batch

    events, init = _workload("sl", 9)
    for i in range(3):
        pq.write_table(events.slice(i * 2000, 2000), tmp_path / f"batch-{i}.parquet")
    frames = [spark.read.parquet(str(tmp_path / f"batch-{i}.parquet")) for i in range(3)]
    job = Job(
        "sl",
        scheduler="tstream",
        executors=2,
        checkpoint_dir=str(tmp_path / "ckpt"),
        progress=False,
    )
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), job.start(init, output=out) as session:
        push = foreach_batch(session)
        push(frames[0], 0)
        push(frames[1], 1)
        raise KeyboardInterrupt
    assert not (out / "_SUCCESS").exists()
    with job.start(init, output=out) as session:
        assert session.resumed_from == 4000
        push = foreach_batch(session)
        push(frames[1], 1)  # replayed by Spark after the crash
        push(frames[2], 2)
        result = session.close()
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))
    parts = sorted((out / "events").glob("part-*.parquet"))
    assert pa.concat_tables(pq.read_table(p) for p in parts).equals(result.events)


def test_checkpoints_of_another_run_are_refused_and_incomplete_ones_ignored(tmp_path, caplog):
    events, init = _workload("sl", 1)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = Job("sl", checkpoint_dir=str(ckpt), checkpoint_every=1, progress=False)
    with pytest.raises(KeyboardInterrupt), job.start(init, output=out) as session:
        session.push(events)
        session.checkpoint()
        raise KeyboardInterrupt
    store = CheckpointStore(ckpt)
    latest = store.latest()
    assert latest.ts == events.num_rows
    (ckpt / f"{TEMPORARY}{latest.ts + 10:012d}").mkdir()  # a write a crash interrupted
    assert store.latest() == latest
    assert "incomplete checkpoint" in caplog.text
    with pytest.raises(UsageError, match="another topology"):
        Job("gs", checkpoint_dir=str(ckpt)).start(generate("gs", WorkloadSpec(events=10))[1], out)
    smaller = {"accounts": init["accounts"].slice(0, 10), "assets": init["assets"].slice(0, 10)}
    with pytest.raises(UsageError, match="table sizes"):
        job.start(smaller, output=out)
    with pytest.raises(UsageError, match="belongs to the output"):
        job.start(init, output=tmp_path / "elsewhere")
    with job.start(init, output=out) as session:  # the right one resumes
        assert session.resumed_from == events.num_rows
        result = session.close()
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))


def test_a_killed_follow_resumes_and_applies_every_file_once(tmp_path):
    """`txstream run --follow` with checkpoints, its driver SIGKILLed after a checkpoint;
    the same command again pushes what the checkpoint does not cover, then the new files,
    and every event is applied once."""
    events, init = generate("sl", WorkloadSpec(events=9000, keys=500, seed=4))
    (tmp_path / "init").mkdir()
    for name, table in init.items():
        pq.write_table(table, tmp_path / "init" / f"{name}.parquet")
    incoming, ckpt, out = tmp_path / "incoming", tmp_path / "ckpt", tmp_path / "out"
    incoming.mkdir()
    for i in range(2):
        pq.write_table(events.slice(i * 3000, 3000), incoming / f"part-{i}.parquet")
    args = [
        "run",
        "sl",
        "--input",
        str(incoming),
        "--init-state",
        str(tmp_path / "init"),
        "--output",
        str(out),
        "--source",
        "arrow",
        "--follow",
        "--scheduler",
        "tstream",
        "--executors",
        "2",
        "--punctuation-interval",
        "500",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "1",
        "--no-progress",
    ]
    tag = f"{os.getpid()}-follow"
    driver = _cli(*args, tag=tag)
    deadline = time.monotonic() + 180
    while _newest_checkpoint(ckpt) == 0:
        assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
        time.sleep(0.01)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    pq.write_table(events.slice(6000), incoming / "part-2.parquet")
    (incoming / "_STOP").write_bytes(b"")
    resumed = _cli(*args, tag=tag + "-again")
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr[-2000:]
    left = _wait_gone(tag, 10)  # what Ray left of the killed run, stopped by the next
    assert not left, f"the killed driver's processes are still alive: {_cmdlines(left)}"
    parts = sorted((out / "events").glob("part-*.parquet"))
    got = pa.concat_tables(pq.read_table(p) for p in parts)
    state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
    assert_same_run(got, state, *naive.run_model("sl", events, init))
    assert json.loads((out / "metrics.json").read_text())["config"]["resumed_from"] > 0
    assert not _wait_gone(tag + "-again")


def test_a_resumed_checkpoint_is_not_overwritten_while_the_team_launches(tmp_path, monkeypatch):
    """Launching a team empties the checkpoint buffer in two steps; the checkpoint writer,
    polling every 5 ms, must not see them apart: it would write the buffer, never filled,
    over the very checkpoint being resumed (after a lost Ray node, the next attempt would
    resume a state of zeros). Here the gap is widened past many polls."""
    events, init = _workload("sl", 2)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = Job("sl", checkpoint_dir=str(ckpt), checkpoint_every=1, progress=False)
    with pytest.raises(KeyboardInterrupt), job.start(init, output=out) as session:
        session.push(events.slice(0, 3000))
        session.checkpoint()
        raise KeyboardInterrupt

    def reset_slowly(buffer: CheckpointBuffer, ts: int) -> None:
        publish(buffer.words, ASKED * STRIDE, ts)
        publish(buffer.words, COPIED * STRIDE, ts)
        time.sleep(0.2)
        publish(buffer.words, WRITTEN * STRIDE, ts)

    store = CheckpointStore(ckpt)
    resumed = store.latest().load("values")
    assert resumed.any()
    monkeypatch.setattr(CheckpointBuffer, "reset", reset_slowly)
    with job.start(init, output=out) as session:
        assert session.resumed_from == 3000
        assert (store.latest().load("values") == resumed).all()
        session.push(events.slice(3000))
        result = session.close()
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))
