"""Sessions from the command line: `run --follow`, `query` and `status` of a named session."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import naive
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from conftest import run_command, txstream_segments
from test_job import _sl_tables
from txstream import Job
from txstream.topologies.generators import WorkloadSpec, generate, write_workload


def _drop(folder, name, table):
    """Write a file as a well-behaved producer does: under a hidden name, then renamed."""
    pq.write_table(table, folder / f".{name}")
    os.replace(folder / f".{name}", folder / name)


def _follow(incoming: Path, init: Path, out: Path, env: dict, *options: str) -> subprocess.Popen:
    """`txstream run sl --follow` over ``incoming`` (read with pyarrow), in the background."""
    command = run_command("sl", str(incoming), str(init), str(out), "--follow", "--source", "arrow")
    return subprocess.Popen(
        [*command, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _wait_for_a_part(out: Path, timeout_s: float = 120.0) -> None:
    """Return once a part file of ``out``'s events is committed, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not list((out / "events").glob("part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.2)


def test_follow_pushes_new_files_in_name_order_until_stop(tmp_path):
    events, init = generate("sl", WorkloadSpec(events=6000, keys=50, abort_ratio=0.05, seed=4))
    write_workload(tmp_path / "data", events, init)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    _drop(incoming, "a-000.parquet", events.slice(0, 2000))
    out = tmp_path / "out"
    env = {**os.environ, "RAY_ADDRESS": ""}
    options = ("--executors", "2", "--scheduler", "tstream", "--no-progress")
    proc = _follow(incoming, tmp_path / "data" / "init", out, env, *options)
    _wait_for_a_part(out)  # the first file's outputs are committed while the session runs
    assert list((out / "events").glob("part-*.parquet")), proc.stderr
    assert not (out / "_SUCCESS").exists()
    (incoming / "_ignored.parquet").write_bytes(b"not parquet")  # hidden: never read
    _drop(incoming, "a-001.parquet", events.slice(2000, 3000))
    _drop(incoming, "a-002.parquet", events.slice(5000))
    (incoming / "_STOP").touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert not (incoming / "_STOP").exists()  # consumed: the next run would end at once
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
    return subprocess.run(
        [sys.executable, "-m", "txstream", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.usefixtures("ray_cluster")
def test_query_and_status_of_a_named_session_from_another_process():
    import ray

    events, init = _sl_tables(30)
    address = ray.get_runtime_context().gcs_address
    with Job("sl", progress=False).start(init, name="ledger-test") as session:
        session.push(events)
        session.flush()
        query = _cli(
            "query", "accounts", "--address", address, "--name", "ledger-test", "--keys", "2,0"
        )
        assert query.returncode == 0, query.stderr
        w, rows = session.query("accounts", keys=[2, 0])
        expected = ["watermark 30", "key,balance"] + [
            f"{k},{b}"
            for k, b in zip(rows["key"].to_pylist(), rows["balance"].to_pylist(), strict=True)
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


def _processes_with(text: str) -> list[int]:
    """Pids of live processes whose command line mentions ``text``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_follow_on_a_cluster_that_dies_fails_at_once_with_one_line(tmp_path):
    events, init = generate("sl", WorkloadSpec(events=2000, keys=50, seed=5))
    write_workload(tmp_path / "data", events, init)
    incoming, out = tmp_path / "incoming", tmp_path / "out"
    incoming.mkdir()
    cluster = Path(tempfile.mkdtemp(prefix="txs-test-ray-", dir="/tmp"))  # short: sockets
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    ray = [str(Path(sys.executable).parent / "ray")]
    try:
        subprocess.run(
            [
                *ray,
                "start",
                "--head",
                "--port",
                str(port),
                "--node-ip-address",
                "127.0.0.1",
                "--temp-dir",
                str(cluster),
                "--num-cpus",
                "2",
                "--include-dashboard",
                "false",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        address = f"127.0.0.1:{port}"
        proc = _follow(incoming, tmp_path / "data" / "init", out, env, "--address", address)
        _drop(incoming, "a-000.parquet", events)
        _wait_for_a_part(out)
        for pid in _processes_with(str(cluster)):  # the cluster dies
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            _, stderr = proc.communicate(timeout=45)  # Ray itself would wait 60 s, silently
        finally:
            proc.kill()
        assert time.monotonic() - killed < 30
    finally:
        for pid in _processes_with(str(cluster)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(cluster, ignore_errors=True)
    log = out / "_logs" / "txstream.log"
    assert proc.returncode == 1
    assert re.fullmatch(  # the GCS's host is the address the cluster gives for itself
        rf"txstream: failed: Ray: the Ray cluster at 127\.0\.0\.1:{port} is gone: its GCS at "
        rf"\S+:{port} refuses connections \(Connection refused\) \(log: {re.escape(str(log))}\)",
        stderr.splitlines()[-1],
    ), stderr
    assert not (out / "_temporary").exists() and not (out / "_SUCCESS").exists()
    assert not txstream_segments(proc.pid)
