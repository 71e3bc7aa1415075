"""The `txstream` command: generate, run, output files (contract §4) and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TESTS, run_command, txstream_segments, wait_for_team
from tmp_watch import TmpWatch
from txstream.cli.main import main
from txstream.cluster import ray_runtime
from txstream.cluster.scratch import descendants
from txstream.cluster.topology import usable_cores
from txstream.monitor.console import _si

OUTPUT_COLUMNS = {
    "sl": [],
    "gs": ["sum"],
    "ob": [],
    "tp": ["toll", "avg_speed", "vehicle_count"],
}
STATE_COLUMNS = {
    "sl": {"accounts": ["key", "balance"], "assets": ["key", "balance"]},
    "gs": {"records": ["key", "value"]},
    "ob": {"items": ["key", "price", "quantity"]},
    "tp": {
        "segment_speed": ["key", "speed_sum", "speed_count"],
        "segment_vehicles": ["key", "vehicle_count"],
    },
}
METRIC_KEYS = {
    "events",
    "committed",
    "aborted",
    "rejected",
    "seconds",
    "throughput_eps",
    "latency_ms",
    "breakdown_s",
    "config",
}


def _run_sl(data, out, *options: str) -> int:
    """`txstream run sl` in this process over the workload in ``data`` into ``out``."""
    run = ["run", "sl", "--input", str(data / "events.parquet"), "--init-state"]
    return main([*run, str(data / "init"), "--output", str(out), *options])


def _generate(tmp_path, topology, events=3000):
    data = tmp_path / "data"
    assert (
        main(
            [
                "generate",
                topology,
                "--out",
                str(data),
                "--events",
                str(events),
                "--keys",
                "64",
                "--abort-ratio",
                "0.05",
            ]
        )
        == 0
    )
    return data


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("topology", ["sl", "gs", "ob", "tp"])
def test_generate_then_run_writes_spec_files(tmp_path, topology):
    data = _generate(tmp_path, topology)
    out = tmp_path / "out"
    code = main(
        [
            "run",
            topology,
            "--input",
            str(data / "events.parquet"),
            "--init-state",
            str(data / "init"),
            "--output",
            str(out),
            "--punctuation-interval",
            "500",
            "--source",
            "arrow",
            "--no-progress",
        ]
    )
    assert code == 0
    events = pq.read_table(out / "events.parquet")
    assert events.schema == pa.schema(
        [
            ("ts", pa.int64()),
            ("event_id", pa.int64()),
            ("status", pa.string()),
            ("reason", pa.string()),
        ]
        + [(c, pa.int64()) for c in OUTPUT_COLUMNS[topology]]
    )
    assert events.column("ts").to_pylist() == list(range(3000))
    statuses = set(events.column("status").to_pylist())
    assert statuses <= {"committed", "aborted", "rejected"} and "aborted" in statuses
    for table, columns in STATE_COLUMNS[topology].items():
        state = pq.read_table(out / "state" / f"{table}.parquet")
        assert state.column_names == columns
        assert all(t == pa.int64() for t in state.schema.types)
    metrics = json.loads((out / "metrics.json").read_text())
    assert METRIC_KEYS <= metrics.keys()
    assert set(metrics["breakdown_s"]) == {
        "useful",
        "sync",
        "lock",
        "construct",
        "explore",
        "abort",
    }
    assert metrics["committed"] + metrics["aborted"] + metrics["rejected"] == 3000
    assert metrics["config"]["punctuation_interval"] == 500


def _cli(*args, timeout=300, env=(), watch=None):
    """Run the command in a new process (``env``: more variables); the result also carries
    its ``pid`` and, with ``watch`` (a folder whose contents may stay), what it held under
    /tmp and left there (``left``)."""
    env = {**os.environ, "RAY_ADDRESS": "", **dict(env)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "txstream", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    watcher = TmpWatch(proc.pid, keep=watch) if watch else None
    ended: dict = {}
    noting = threading.Thread(target=_note_exit, args=(proc.pid, ended), daemon=True)
    noting.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # a hung command fails its test, and does not outlive it
        proc.communicate()
        raise
    result = SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=stderr, pid=proc.pid)
    noting.join(timeout=5)  # it sees the process gone within its next poll
    result.outlived = ended.get("outlived")
    if watcher is not None:
        watcher.stop()
        result.held, result.left = watcher.paths, watcher.left()
    return result


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _note_exit(pid: int, ended: dict) -> None:
    """Which JVMs process ``pid`` started (seen while it ran, polled every 10 ms) were still
    alive when it ended (gone, or a zombie not reaped yet)."""
    seen: set[int] = set()
    while _state(pid) not in ("Z", "X", "gone"):
        seen.update(descendants(pid))
        time.sleep(0.01)
    alive = [p for p in seen if _state(p) not in ("Z", "X", "gone")]
    ended["outlived"] = [p for p in alive if b"java" in _command_line(p)]


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_schema_error_exits_2_with_one_line(tmp_path):
    """Refused before Spark starts: the driver launched early (a Spark run by default)
    ends with the command, its folder removed, and it said nothing."""
    data = _generate(tmp_path, "sl", events=100)
    table = pq.read_table(data / "events.parquet").drop_columns(["asset"])
    pq.write_table(table, tmp_path / "bad.parquet")
    private_tmp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: used as it is
    try:
        proc = _cli(
            "run",
            "sl",
            "--input",
            str(tmp_path / "bad.parquet"),
            "--init-state",
            str(data / "init"),
            "--output",
            str(tmp_path / "out"),
            env={"TMPDIR": str(private_tmp)},
        )
        assert list(private_tmp.iterdir()) == []
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)
    assert proc.returncode == 2 and proc.outlived == []
    assert proc.stderr.strip().count("\n") == 0 and "missing column 'asset'" in proc.stderr


def test_unreadable_input_and_bad_usage_exit_2(tmp_path):
    (tmp_path / "junk.parquet").write_text("not parquet")
    data = _generate(tmp_path, "sl", events=10)
    proc = _cli(
        "run",
        "sl",
        "--input",
        str(tmp_path / "junk.parquet"),
        "--init-state",
        str(data / "init"),
        "--output",
        str(tmp_path / "out"),
    )
    assert proc.returncode == 2 and "cannot read" in proc.stderr
    assert _cli("run", "sl").returncode == 2
    assert _cli("generate", "sl", "--out", str(tmp_path / "x"), "--keys", "0").returncode == 2


def test_the_executable_runs_exit_handlers_and_flushes_before_it_ends(tmp_path):
    """`command` skips the interpreter's teardown, not what the process registered to run
    at exit (logging's flush, temporary folders) nor the output still buffered."""
    script = (
        "import atexit, sys; from txstream.cli import command; "
        "atexit.register(lambda: print('exit handler ran', flush=True)); "
        "sys.stdout.write('buffered'); command()"
    )
    out = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-c", script, "generate", "sl", "--out", str(out), "--events", "100"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "buffered" in proc.stdout and proc.stdout.rstrip().endswith("exit handler ran")
    assert (out / "events.parquet").exists()
    bad = subprocess.run(
        [sys.executable, "-c", script, "generate", "sl", "--out", str(out), "--keys", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "exit handler ran" in bad.stdout


PHASES = [
    "starting Ray",
    "starting Spark",
    "staging the input",
    "starting 1 executor",
    "running",
    "stopping Spark",
    "stopping Ray",
]


SPARK_DRIVER_ENDED = """
import gc, sys, time
from pyspark.sql import SparkSession
from txstream.connectors.spark_driver import end_spark_driver
spark = SparkSession.builder.master("local[1]").config("spark.local.dir", sys.argv[1])
spark = spark.config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={sys.argv[1]}")
spark = spark.getOrCreate()
held = spark.sparkContext._jvm.java.util.ArrayList()
spark.stop()
end_spark_driver()
del held
gc.collect()
time.sleep(1)  # py4j's finalizer thread tells the JVM of dropped objects
print("ended", file=sys.stderr)
"""


def test_a_java_object_dropped_after_spark_driver_ended_logs_nothing(tmp_path):
    """`end_spark_driver` shuts py4j's gateway before the driver's JVM: a Java object
    dropped afterwards is not sent to the dead JVM, whose failure py4j logs with its
    traceback on stderr (it once reached the output of `txstream run`)."""
    proc = subprocess.run(
        [sys.executable, "-c", SPARK_DRIVER_ENDED, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0 and "ended" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr


@pytest.mark.usefixtures("ray_cluster")
def test_default_run_goes_through_spark_on_its_own_ray(tmp_path):
    """The README's main command: Spark source by default, own Ray, all cleaned up;
    stdout holds the summary alone, stderr txstream's phases alone (Ray's, Spark's and
    the JVMs' output is in the log), and nothing it made is left under /tmp."""
    data = _generate(tmp_path, "tp", events=5000)
    out = tmp_path / "out"
    private_tmp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: Ray's sockets
    try:
        proc = _cli(
            "run",
            "tp",
            "--input",
            str(data / "events.parquet"),
            "--init-state",
            str(data / "init"),
            "--output",
            str(out),
            env={"TMPDIR": str(private_tmp)},
            watch=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert list(private_tmp.iterdir()) == []
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)
    assert proc.stdout.startswith("tp serial: 5,000 events") and proc.stdout.count("\n") == 1
    lines = proc.stderr.splitlines()
    assert all(line.startswith("txstream: ") for line in lines), proc.stderr
    shown = [next(p for p in PHASES if line.startswith(f"txstream: {p}")) for line in lines]
    assert shown == PHASES, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    bar = next(line for line in lines if line.startswith("txstream: running  100%"))
    rate = f"{_si(metrics['throughput_eps'])} events/s in {metrics['seconds']:.1f} s"
    assert bar.endswith(rate) and f"= {metrics['throughput_eps']:,.0f} events/s" in proc.stdout
    assert sum(metrics["timeline"]["events"]) == 5000  # every event in the per-second series
    assert main(["report", str(out)]) == 0 and (out / "report.html").is_file()
    assert any("txs-" in str(p) for p in proc.held)
    # no JVM joined Ray as a Java driver, which extracts Ray's native library to /tmp/ray
    assert not any("/ray/" in str(p) for p in proc.held)
    assert proc.left == []
    assert proc.outlived == []  # no JVM it started (Spark's driver) outlives it
    assert "starting Spark: done in" in (out / "_logs" / "txstream.log").read_text()
    assert not txstream_segments(proc.pid)
    assert {"startup_s", "staging_s"} <= json.loads((out / "metrics.json").read_text())[
        "spark"
    ].keys()
    arrow = tmp_path / "arrow"
    assert (
        main(
            [
                "run",
                "tp",
                "--input",
                str(data / "events.parquet"),
                "--init-state",
                str(data / "init"),
                "--output",
                str(arrow),
                "--source",
                "arrow",
                "--no-progress",
            ]
        )
        == 0
    )
    assert pq.read_table(out / "events.parquet").equals(pq.read_table(arrow / "events.parquet"))


@pytest.mark.parametrize(
    ("signum", "code", "line", "transport"),
    [
        (signal.SIGINT, 130, "txstream: interrupted", "threads"),
        (signal.SIGTERM, 143, "txstream: terminated", "threads"),
        (signal.SIGINT, 130, "txstream: interrupted", "ray"),
    ],
)
def test_ctrl_c_and_sigterm_stop_the_run_and_clean_up(tmp_path, signum, code, line, transport):

    data = _generate(tmp_path, "sl", events=400_000)
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.Popen(
        run_command(
            "sl",
            str(data / "events.parquet"),
            str(data / "init"),
            str(tmp_path / "out"),
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
        # as from a terminal: a shell without job control (CI, `cmd &`) hands its
        # background commands SIGINT ignored, and Python keeps it ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for_team(proc.pid, transport)  # the run itself takes over a minute
    time.sleep(3)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert stderr.splitlines()[-1].startswith(line)
    assert not txstream_segments(proc.pid)


def test_engine_failure_is_one_line_naming_the_actor_with_the_log(tmp_path):
    data = _generate(tmp_path, "sl", events=100)
    out = tmp_path / "out"
    proc = _cli(
        "run",
        "failing_topology:build",
        "--input",
        str(data / "events.parquet"),
        "--init-state",
        str(data / "init"),
        "--output",
        str(out),
        "--source",
        "arrow",
        env={"PYTHONPATH": str(TESTS)},
    )
    assert proc.returncode == 1
    log = out / "_logs" / "txstream.log"
    assert proc.stderr.splitlines()[-1] == (
        f"txstream: failed: Executor 0: RuntimeError: user code failed on purpose (log: {log})"
    )
    assert "Traceback" not in proc.stderr and "Traceback" in log.read_text()


def test_unreachable_address_is_exit_2_with_one_line_within_seconds(tmp_path):
    data = _generate(tmp_path, "sl", events=100)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nobody listens there once closed
    start = time.monotonic()
    proc = _cli(
        "run",
        "sl",
        "--input",
        str(data / "events.parquet"),
        "--init-state",
        str(data / "init"),
        "--output",
        str(tmp_path / "out"),
        "--source",
        "arrow",
        "--address",
        f"127.0.0.1:{port}",
    )
    assert time.monotonic() - start < 30  # Python's start-up included; Ray would retry for minutes
    assert proc.returncode == 2
    assert proc.stderr == (
        f"txstream: error: --address 127.0.0.1:{port}: no Ray at 127.0.0.1:{port} "
        "(Connection refused)\n"
    )


def test_absurd_executor_count_is_refused_before_anything_starts(tmp_path, capsys):
    data = _generate(tmp_path, "sl", events=10)
    capsys.readouterr()
    code = _run_sl(data, tmp_path / "out", "--executors", str(4 * usable_cores() + 1))
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usable cores: the executors would mostly wait" in err
    assert not (tmp_path / "out").exists()


def test_dashboard_without_rays_default_extra_is_exit_2_with_one_line(
    tmp_path, capsys, monkeypatch
):
    from importlib.metadata import PackageNotFoundError

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(ray_runtime, "version", missing)
    data = _generate(tmp_path, "sl", events=10)
    capsys.readouterr()
    code = _run_sl(data, tmp_path / "out", "--source", "arrow", "--dashboard")
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ray[default]'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("verb", [["status"], ["query", "accounts"]])
def test_query_and_status_on_an_unreachable_address_are_exit_2_at_once(verb):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nobody listens there once closed
    start = time.monotonic()
    proc = _cli(*verb, "--address", f"127.0.0.1:{port}", "--name", "ledger", timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 2
    assert proc.stderr == (
        f"txstream: error: --address 127.0.0.1:{port}: no Ray at 127.0.0.1:{port} "
        "(Connection refused)\n"
    )


RAY_CLIENT = "ray://127.0.0.1:10001"
RAY_CLIENT_REFUSED = (
    f"txstream: error: --address {RAY_CLIENT}: Ray Client is not supported; run txstream on "
    "a node of the cluster, with --address HOST:PORT of its GCS (or auto)\n"
)


@pytest.mark.parametrize("source", ["arrow", "spark"])
def test_a_ray_client_address_is_exit_2_with_one_line(tmp_path, capsys, monkeypatch, source):
    data = _generate(tmp_path, "sl", events=10)
    capsys.readouterr()
    assert _run_sl(data, tmp_path / "out", "--source", source, "--address", RAY_CLIENT) == 2
    assert capsys.readouterr().err == RAY_CLIENT_REFUSED
    monkeypatch.setenv("RAY_ADDRESS", RAY_CLIENT)
    assert _run_sl(data, tmp_path / "out", "--source", source) == 2
    assert capsys.readouterr().err == RAY_CLIENT_REFUSED
    assert not (tmp_path / "out").exists()


def test_status_at_a_ray_client_address_is_exit_2_with_one_line():
    proc = _cli("status", "--address", RAY_CLIENT, "--name", "ledger", timeout=60)
    assert proc.returncode == 2 and proc.stderr == RAY_CLIENT_REFUSED


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_end_a_query_that_waits_on_a_silent_address(signum):
    with socket.socket() as silent:  # accepts connections and never answers: not a Ray
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "txstream",
                "query",
                "accounts",
                "--address",
                f"127.0.0.1:{port}",
                "--name",
                "ledger",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(6)  # well into Ray's connection attempts
        proc.send_signal(signum)
        try:
            _, stderr = proc.communicate(timeout=10)
        finally:
            proc.kill()  # no-op once it has ended
    assert proc.returncode == 128 + signum
    assert stderr == "txstream: interrupted\n"


@pytest.mark.parametrize(
    "argv, line",
    [
        (["run", "sl", "--explore", "xyz"], "argument --explore: invalid choice: 'xyz'"),
        (["run", "sl"], "the following arguments are required: --input, --init-state"),
        ([], "the following arguments are required: VERB"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(argv, line, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"txstream: error: {line}")
