"""A run's live metrics and health (``--metrics-port``): what ``/metrics`` serves equals the
session's own counts, a real Prometheus server reads them back through its HTTP API, and
a killed executor shows in readiness and in the recoveries counter."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import actor_processes
from prometheus_client.parser import text_string_to_metric_families
from txstream import Job
from txstream.errors import UsageError
from txstream.monitor.live_metrics import Figures, Histogram, RunCollector, bounded_reasons
from txstream.topologies.generators import WorkloadSpec, generate

SCRAPE_MS = 500
RUN_LABELS = ("run", "topology")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def samples(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample ``/metrics`` serves, by name and labels (without run and topology)."""
    status, text = http(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in s.labels.items() if k not in ("run", "topology"))
            )
            found[s.name, labels] = s.value
    return found


def output_statuses(session) -> Counter:
    statuses = Counter()
    for batch in session.outputs():
        statuses.update(batch.column("status").to_pylist())
    return statuses


def wait_for(check: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.1)


# ----------------------------------------------------------------- the endpoint itself
def test_metrics_equal_the_sessions_own_counts_and_health_answers(tmp_path):
    events, init = generate("gs", WorkloadSpec(events=6000, keys=300, abort_ratio=0.1, seed=2))
    port = free_port()
    job = Job("gs", source="arrow", scheduler="morphstream", executors=2, metrics_port=port)
    with job.start(init, output=tmp_path / "out") as session:
        session.push(events)
        session.flush()
        got = samples(port)
        statuses = output_statuses(session)
        assert http(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert http(f"http://127.0.0.1:{port}/readyz")[0] == 200
        assert http(f"http://127.0.0.1:{port}/state")[0] == 404  # metrics and health only
        result = session.close()
    assert got["txstream_events_pushed_total", ()] == events.num_rows
    assert got["txstream_watermark_events", ()] == events.num_rows
    assert got["txstream_committed_watermark_events", ()] == events.num_rows
    assert got["txstream_backlog_events", ()] == 0
    for status in ("committed", "aborted", "rejected"):
        assert got["txstream_events_total", (("status", status),)] == statuses[status]
        assert statuses[status] == result.metrics[status]
    assert got["txstream_latency_seconds_count", ()] == events.num_rows
    assert got["txstream_latency_seconds_bucket", (("le", "+Inf"),)] == events.num_rows
    assert got["txstream_latency_seconds_sum", ()] > 0
    assert got["txstream_chunk_events_sum", ()] == events.num_rows
    assert got["txstream_chunk_events_count", ()] == result.metrics["chunks"]["count"]
    busy = [
        got["txstream_executor_seconds_total", (("activity", "useful"), ("executor", r))]
        for r in "01"
    ]
    assert busy[0] > 0  # executor 1 may step aside for every chunk (`executors_for`)
    operations = sum(got["txstream_executor_operations_total", (("executor", r),)] for r in "01")
    assert operations == result.metrics["operations"]
    decided = result.metrics["decisions"]
    for dimension, choices in decided.items():
        for choice, count in choices.items():
            key = (
                "txstream_scheduler_decisions_total",
                (("choice", choice), ("dimension", dimension)),
            )
            assert got[key] == count
    for table, rows in result.state.items():
        assert got["txstream_table_rows", (("table", table),)] == rows.num_rows
    assert got["txstream_recoveries_total", ()] == 0
    with pytest.raises(urllib.error.URLError):  # the port is free again once closed
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_rejections_are_counted_by_reason_with_few_labels():
    figures = dict.fromkeys((f"reason {i}" for i in range(40)), 1)
    kept = bounded_reasons(figures)
    assert len(kept) == 33 and kept["other"] == 8 and sum(kept.values()) == 40
    latency = Histogram([0] * 13, 0.0, 0)
    collector = RunCollector(
        "r",
        "sl",
        lambda: Figures(
            pushed=3,
            watermark=3,
            committed=3,
            backlog_bytes=0,
            statuses={"committed": 1, "aborted": 0, "rejected": 2},
            reasons={"null field: amount": 2},
            latency=latency,
            chunks=Histogram([0] * 8, 0, 0),
            executors=[],
            checkpoints=0,
            checkpoint_seconds=0.0,
            checkpoint_age_s=None,
            recoveries=0,
            rows={},
        ),
    )
    families = {f.name: f for f in collector.collect()}
    (sample,) = families["txstream_rejections"].samples
    assert sample.labels["reason"] == "null field: amount" and sample.value == 2


def test_a_port_in_use_or_out_of_range_is_one_line(tmp_path):
    _, init = generate("sl", WorkloadSpec(events=10, keys=10, seed=1))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"--metrics-port {port}: the port is in use"):
            Job("sl", source="arrow", metrics_port=port, progress=False).start(init)
    for bad in ("0", "65536", "x"):
        cli = [sys.executable, "-m", "txstream", "run", "sl", "--metrics-port", bad]
        cli += ["--input", "i", "--init-state", "s", "--output", str(tmp_path / "o")]
        proc = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ----------------------------------------------------------------- a real Prometheus
@pytest.fixture
def prometheus(tmp_path) -> Iterator[Callable[[str], str]]:
    """``start(scrape_config)``: a Prometheus server of its own (its config, storage and
    a free port) scraping every `SCRAPE_MS`; its HTTP API's URL. Killed at the end."""
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is missing: ./setup installs Debian's prometheus package"
    started: list[subprocess.Popen] = []

    def start(scrape: str) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_MS}ms\n  scrape_timeout: {SCRAPE_MS}ms\n"
            f"scrape_configs:\n  - job_name: txstream\n{scrape}"
        )
        log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed with the process)
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(server)
        api = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(api, server, tmp_path), "Prometheus ready", 60)
        return api

    yield start
    for server in started:
        server.send_signal(signal.SIGKILL)
        server.wait(30)


def _ready(api: str, server: subprocess.Popen, tmp_path) -> bool:
    assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
    try:
        return http(f"{api}/-/ready")[0] == 200
    except OSError:
        return False


def query(api: str, promql: str) -> dict[tuple, float]:
    """An instant query's values, by labels (without run, topology, job and instance)."""
    url = f"{api}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    status, body = http(url)
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", body
    drop = ("run", "topology", "job", "instance", "__name__")
    return {
        tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)): float(r["value"][1])
        for r in answer["data"]["result"]
    }


def scraped(api: str, promql: str, want: float) -> None:
    wait_for(lambda: query(api, promql).get(()) == want, f"{promql} == {want} in Prometheus", 60)


def test_prometheus_reads_a_sessions_counts_latency_and_recovery(tmp_path, prometheus):
    """A session on Ray (its executors' processes can be killed) with checkpoints: what
    Prometheus scraped equals the session's own counts; a killed executor makes it not
    ready, then the recovery counts and it is ready again."""
    events, init = generate("sl", WorkloadSpec(events=20000, keys=500, abort_ratio=0.05, seed=4))
    port = free_port()
    job = Job(
        "sl",
        source="arrow",
        transport="ray",
        scheduler="tstream",
        executors=2,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        checkpoint_every=1,
        metrics_port=port,
        progress=False,
        timeout_s=120,
    )
    first, rest = events.slice(0, 12000), events.slice(12000)
    with job.start(init, output=tmp_path / "out", name="watched") as session:
        api = prometheus(f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        session.push(first)
        session.flush()
        scraped(api, 'sum(txstream_events_total{run="watched",topology="sl"})', 12000)
        assert query(api, "txstream_events_pushed_total")[()] == 12000
        statuses = output_statuses(session)
        by_status = query(api, "txstream_events_total")
        assert by_status == {(("status", s),): float(statuses[s]) for s in statuses} | {
            (("status", s),): 0.0 for s in ("committed", "aborted", "rejected") if s not in statuses
        }
        assert query(api, "txstream_watermark_events")[()] == 12000
        assert query(api, "txstream_latency_seconds_count")[()] == 12000
        p99 = query(api, "histogram_quantile(0.99, txstream_latency_seconds_bucket)")[()]
        assert 0 < p99 < 60
        assert query(api, "txstream_recoveries_total")[()] == 0
        assert query(api, "txstream_ready")[()] == 1

        (victim, *_) = actor_processes("Executor", wait_s=0)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: http(f"http://127.0.0.1:{port}/readyz")[0] == 503, "not ready", 30)
        assert http(f"http://127.0.0.1:{port}/healthz")[0] == 200  # alive: it recovers
        session.push(rest)
        session.flush()
        assert http(f"http://127.0.0.1:{port}/readyz")[0] == 200
        scraped(api, "txstream_recoveries_total", 1)
        scraped(api, "sum(txstream_events_total)", 20000)  # the scrape after the flush
        assert query(api, "txstream_events_pushed_total")[()] == 20000
        statuses = output_statuses(session)
        by_status = query(api, "txstream_events_total")
        for status in ("committed", "aborted", "rejected"):
            assert by_status[(("status", status),)] == statuses[status]
        assert query(api, "txstream_latency_seconds_count")[()] >= 20000
        result = session.close()
    assert len(result.metrics["recoveries"]) == 1
    assert sum(statuses.values()) == result.metrics["events"] == 20000


# ----------------------------------------------------------------- through Ray's endpoint
_ON_RAY = """
import json
import sys

from ray._private import worker
from txstream import Job
from txstream.monitor.ray_metrics import metrics_agent_running
from txstream.topologies.generators import WorkloadSpec, generate

events, init = generate("sl", WorkloadSpec(events=5000, keys=200, abort_ratio=0.05, seed=5))
job = Job("sl", source="arrow", transport="ray", dashboard=True, progress=False, timeout_s=120)
with job.start(init, name="on-ray") as session:
    session.push(events)
    session.flush()
    statuses = {}
    for batch in session.outputs():
        for status in batch.column("status").to_pylist():
            statuses[status] = statuses.get(status, 0) + 1
    node = worker._global_node
    folders = [node.get_session_dir_path(), node.get_temp_dir_path()]
    print(json.dumps({"folders": folders, "statuses": statuses, "agent": metrics_agent_running()}))
    sys.stdout.flush()
    sys.stdin.readline()  # until Prometheus has read the counts
    session.close()
print("closed")
"""


def test_prometheus_reads_a_session_on_ray_through_rays_endpoint(
    tmp_path, prometheus, python_with_dashboard
):
    """A session on a Ray with its metrics agent (``ray[default]``, with its dashboard):
    Prometheus finds Ray's endpoint through Ray's service discovery file and reads the
    session's counts there (Ray prefixes the names with ``ray_``)."""
    env = {**os.environ, "RAY_metrics_report_interval_ms": "500"}
    session = subprocess.Popen(
        [python_with_dashboard, "-c", _ON_RAY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = session.stdout.readline()
        assert line, session.stderr.read()[-3000:]
        told = json.loads(line)
        assert told["agent"], "Ray's metrics agent does not run with ray[default]"
        found = [Path(f) / "prom_metrics_service_discovery.json" for f in told["folders"]]
        wait_for(lambda: any(f.exists() for f in found), "Ray's service discovery file", 60)
        discovery = next(f for f in found if f.exists())
        api = prometheus(f"    file_sd_configs:\n      - files: ['{discovery}']\n")
        promql = 'sum by (status) (ray_txstream_events_total{run="on-ray"})'
        want = {(("status", s),): float(n) for s, n in told["statuses"].items()}
        wait_for(lambda: _subset(want, query(api, promql)), "the counts through Ray", 120)
        session.stdin.write("close\n")
        session.stdin.flush()
        out, err = session.communicate(timeout=120)
        assert session.returncode == 0 and "closed" in out, err[-3000:]
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(30)


def _subset(want: dict, got: dict) -> bool:
    return all(got.get(key) == value for key, value in want.items())
