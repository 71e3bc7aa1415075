"""Outputs committed in Spark's manner (contract §4): never half-written, never mixed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_command, txstream_segments, wait_for_team
from test_job import _sl_tables
from txstream import Job
from txstream.connectors.outputs import OutputDir, part_name
from txstream.errors import RuntimeFailure, UsageError
from txstream.monitor.logs import log_of

STATE = {"t": pa.table({"key": [0], "v": [1]})}


def _write_part(out: OutputDir, first_ts: int, rows: int) -> None:
    path = out.temporary / "x.inprogress"
    pq.write_table(pa.table({"ts": list(range(first_ts, first_ts + rows))}), path)
    out.stage_part(path, first_ts)


def test_a_one_shot_commit_moves_everything_into_place_then_writes_success(tmp_path):
    out = OutputDir(tmp_path / "out")
    out.prepare()
    _write_part(out, 0, 3)
    _write_part(out, 3, 2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_temporary"]
    out.commit(STATE, "{}\n")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["_SUCCESS", "events.parquet", "metrics.json", "state"]
    assert pq.read_table(tmp_path / "out" / "events.parquet").column("ts").to_pylist() == list(
        range(5)
    )


def test_a_session_commits_parts_as_they_complete(tmp_path):
    out = OutputDir(tmp_path / "out", progressive=True)
    out.prepare()
    _write_part(out, 0, 3)
    assert (tmp_path / "out" / "events" / part_name(0)).is_file()
    _write_part(out, 3, 2)
    out.drop_parts_from(3)
    assert [p.name for p in out.parts()] == [part_name(0)]
    out.commit(STATE, "{}\n")
    assert (tmp_path / "out" / "_SUCCESS").is_file()


def test_a_non_empty_output_is_refused_unless_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not empty.*--overwrite"):
        OutputDir(tmp_path / "out").prepare()
    out = OutputDir(tmp_path / "out", overwrite=True)
    out.prepare()
    _write_part(out, 0, 1)
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"  # until the commit
    out.commit(STATE, "{}\n")
    assert not (tmp_path / "out" / "mine.txt").exists()


def test_leftovers_of_a_failed_run_do_not_make_an_output_non_empty(tmp_path):
    (tmp_path / "out" / "_temporary" / "parts").mkdir(parents=True)
    (tmp_path / "out" / "_logs").mkdir()
    OutputDir(tmp_path / "out").prepare()
    assert not list((tmp_path / "out" / "_temporary" / "parts").iterdir())


def _unwritable(tmp_path):
    if os.geteuid() == 0:  # root writes anywhere but in /proc
        return "/proc/txstream-test-output"
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    return str(folder / "out")


def test_an_unwritable_output_is_a_usage_error_before_anything_starts(tmp_path):
    events, init = _sl_tables(30)
    begin = time.monotonic()
    with pytest.raises(UsageError, match="cannot write to output"):
        Job("sl", progress=False).run(events, init, output=_unwritable(tmp_path))
    assert time.monotonic() - begin < 5  # no Ray, no Spark


def _files(out: Path) -> dict[Path, bytes]:
    """The output's files (not the log of the latest run, in ``_logs``)."""
    files = (p for p in out.rglob("*") if p.is_file() and "_logs" not in p.parts)
    return {p.relative_to(out): p.read_bytes() for p in files}


@pytest.mark.usefixtures("ray_cluster")
def test_a_failed_run_leaves_the_previous_output_untouched(tmp_path):
    events, init = _sl_tables(30)
    out = tmp_path / "out"
    first = Job("sl", progress=False).run(events, init, output=out)
    before = _files(out)
    with pytest.raises(RuntimeFailure, match="on purpose") as failure:
        Job("failing_topology:build", progress=False, overwrite=True, timeout_s=60).run(
            events, init, output=out
        )
    assert _files(out) == before and first.metrics["events"] == 30
    assert log_of(failure.value) == out / "_logs" / "txstream.log"  # the latest run's log
    assert not (out / "_temporary").exists()


@pytest.mark.usefixtures("ray_cluster")
def test_a_result_reads_its_events_from_the_output_and_not_another_runs(tmp_path):
    events, init = _sl_tables(30)
    out = tmp_path / "out"
    first = Job("sl", progress=False, transport="threads").run(events, init, output=out)
    assert first.events.equals(pq.read_table(out / "events.parquet"))  # read when asked
    unread = Job("sl", progress=False, transport="threads").run(events, init, output=out / "b")
    Job("sl", progress=False, transport="threads", overwrite=True).run(
        events.slice(0, 10), init, output=out / "b"
    )
    with pytest.raises(UsageError, match="replaced or removed"):
        unread.events  # noqa: B018 - the property is what is tested
    private = Job("sl", progress=False, transport="threads").run(events, init)
    assert private.events.equals(first.events)  # its folder is gone: read before it went


@pytest.mark.parametrize("transport", ["ray", "threads"])
def test_ctrl_c_over_an_existing_output_leaves_it_untouched(tmp_path, transport):
    from txstream.topologies.generators import WorkloadSpec, generate, write_workload

    events, init = generate("sl", WorkloadSpec(events=300_000, seed=1))
    write_workload(tmp_path / "data", events, init)
    out = tmp_path / "out"
    out.mkdir()
    (out / "events.parquet").write_bytes(b"previous result")
    (out / "_SUCCESS").write_bytes(b"")
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.Popen(
        run_command(
            "sl",
            str(tmp_path / "data" / "events.parquet"),
            str(tmp_path / "data" / "init"),
            str(out),
            "--overwrite",
            "--udf-cost-us",
            "50",
            "--no-progress",
            "--source",
            "arrow",
            "--transport",
            transport,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for_team(proc.pid, transport)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert sorted(p.name for p in out.iterdir() if p.name != "_logs") == [
        "_SUCCESS",
        "events.parquet",
    ]
    assert (out / "events.parquet").read_bytes() == b"previous result"
    assert not txstream_segments(proc.pid)
