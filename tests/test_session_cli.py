"""Sessions from the command line: `run --follow`, `query` and `status` of a named session."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import naive
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from conftest import txstream_segments
from test_job import _sl_tables
from txstream import Job
from txstream.topologies.generators import WorkloadSpec, generate, write_workload


def _drop(folder, name, table):
    """Write a file as a well-behaved producer does: under a hidden name, then renamed."""
    pq.write_table(table, folder / f".{name}")
    os.replace(folder / f".{name}", folder / name)


def test_follow_pushes_new_files_in_name_order_until_stop(tmp_path):
    events, init = generate("sl", WorkloadSpec(events=6000, keys=50, abort_ratio=0.05, seed=4))
    write_workload(tmp_path / "data", events, init)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    _drop(incoming, "a-000.parquet", events.slice(0, 2000))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "txstream", "run", "sl", "--input", str(incoming),
         "--init-state", str(tmp_path / "data" / "init"), "--output", str(out), "--follow",
         "--source", "arrow", "--executors", "2", "--scheduler", "tstream", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((out / "events").glob("part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the first file's outputs are committed while the session runs
    assert list((out / "events").glob("part-*.parquet")), proc.stderr
    assert not (out / "_SUCCESS").exists()
    (incoming / "_ignored.parquet").write_bytes(b"not parquet")  # hidden: never read
    _drop(incoming, "a-001.parquet", events.slice(2000, 3000))
    _drop(incoming, "a-002.parquet", events.slice(5000))
    (incoming / "_STOP").touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "6,000 events" in stdout
    got = pq.read_table(out / "events")
    want = naive.run_model("sl", events, {k: pq.read_table(v) for k, v in _init(tmp_path)})
    state = {name: pq.read_table(out / "state" / f"{name}.parquet") for name in want[1]}
    assert_same_run(got, state, *want)
    assert (out / "_SUCCESS").is_file()
    assert not txstream_segments(proc.pid)


def _init(tmp_path):
    folder = tmp_path / "data" / "init"
    return [(p.stem, p) for p in folder.glob("*.parquet")]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "txstream", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.usefixtures("ray_cluster")
def test_query_and_status_of_a_named_session_from_another_process():
    import ray

    events, init = _sl_tables(30)
    address = ray.get_runtime_context().gcs_address
    with Job("sl", progress=False).start(init, name="ledger-test") as session:
        session.push(events)
        session.flush()
        query = _cli("query", "accounts", "--address", address, "--name", "ledger-test",
                     "--keys", "2,0")  # fmt: skip
        assert query.returncode == 0, query.stderr
        w, rows = session.query("accounts", keys=[2, 0])
        expected = ["watermark 30", "key,balance"] + [
            f"{k},{b}"
            for k, b in zip(
                rows["key"].to_pylist(), rows["balance"].to_pylist(), strict=True
            )  # fmt: skip
        ]
        assert w == 30 and query.stdout.splitlines() == expected
        status = _cli("status", "--address", address, "--name", "ledger-test")
        assert status.returncode == 0, status.stderr
        assert "watermark: 30" in status.stdout.splitlines()
        assert any(line.startswith("latency_ms.p50: ") for line in status.stdout.splitlines())
        assert "{" not in status.stdout  # one figure a line, no Python dictionaries
        table = _cli("query", "nosuchtable", "--address", address, "--name", "ledger-test")
        assert table.returncode == 2 and table.stderr == (
            "txstream: error: query: no table 'nosuchtable'; the tables are accounts, assets\n"
        )
        missing = _cli("status", "--address", address, "--name", "nobody")
        assert missing.returncode == 2 and "no session named 'nobody'" in missing.stderr
    assert isinstance(session.close().events, pa.Table)
