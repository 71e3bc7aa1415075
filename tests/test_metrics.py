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
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import actor_processes
from prometheus_client.parser import text_string_to_metric_families
from txstream import Job
from txstream.errors import UsageError
from txstream.monitor.live_metrics import (
    CHUNK_BOUNDS,
    Figures,
    Histogram,
    RunCollector,
    bounded_reasons,
)
from txstream.monitor.metrics import SizeHistogram
from txstream.monitor.report import render
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
    job = Job(
        "gs",
        source="arrow",
        scheduler="morphstream",
        executors=2,
        transport="threads",  # without Ray
        metrics_port=port,
    )
    with job.start(init, output=tmp_path / "out") as session:
        session.push(events)
        session.flush()
        got = samples(port)
        text = http(f"http://127.0.0.1:{port}/metrics")[1]
        statuses = output_statuses(session)
        assert f'txstream_up{{run="run-{os.getpid()}",topology="gs"}} 1.0' in text
        assert not _answers_on(_outward_address(), port)  # 127.0.0.1 only by default
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


def _outward_address() -> str:
    """This host's address on its way out (not the loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the route
        return probe.getsockname()[0]


def _answers_on(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_metrics_host_chooses_where_they_are_served_and_a_starting_run_is_not_ready(
    tmp_path,
):
    """``--metrics-host`` opens the metrics to other hosts (here: on every address); while
    the team starts, ``/readyz`` answers 503 and ``/healthz`` 200."""
    _, init = generate("sl", WorkloadSpec(events=10, keys=10, seed=1))
    port, outward = free_port(), _outward_address()
    assert outward != "127.0.0.1"
    job = Job(
        "sl",
        source="arrow",
        transport="threads",
        metrics_port=port,
        metrics_host="0.0.0.0",
        progress=False,
    )
    answers: list[tuple[int, int]] = []
    started = threading.Event()

    def probe() -> None:
        while not started.is_set():
            try:
                answers.append((http(f"{url}/readyz")[0], http(f"{url}/healthz")[0]))
            except OSError:  # not listening yet
                time.sleep(0.01)

    url = f"http://{outward}:{port}"
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with job.start(init, output=tmp_path / "out"):
            started.set()
            prober.join()
            assert http(f"{url}/readyz")[0] == 200
    finally:
        started.set()
        prober.join()
    assert (503, 200) in answers, answers


def test_chunk_sizes_are_counted_as_they_come_in_bounded_memory():
    sizes = SizeHistogram()
    drawn = np.random.default_rng(3).integers(1, 2_000_000, 20_000)
    for size in drawn:
        sizes.add(int(size))
    buckets, count = sizes.buckets(CHUNK_BOUNDS)
    assert buckets == np.searchsorted(np.sort(drawn), CHUNK_BOUNDS, side="right").tolist()
    assert count == sizes.count == len(drawn) and sizes.sum == drawn.sum()
    assert sizes.max == drawn.max() and sizes.counts.nbytes < 20_000
    assert sizes.median() == pytest.approx(np.median(drawn), rel=0.012)
    assert SizeHistogram().median() == 0


def test_a_table_of_natural_keys_counts_the_keys_that_exist(tmp_path):
    """Keys created and deleted: ``txstream_table_rows`` is the keys that exist while the
    session runs, and metrics.json and the report say so at the end."""
    init = {"kv": pa.table({"key": ["a", "b", "c"], "value": pa.array([1, 2, 3], pa.int64())})}
    rows = [("put", "d"), ("put", "e"), ("delete", "a"), ("put", "f"), ("delete", "e")]
    rows += [("delete", "zz"), ("put", "a")]  # a missing key deleted; a deleted one again
    events = pa.table(
        {
            "event_id": pa.array(range(len(rows)), pa.int64()),
            "kind": [kind for kind, _ in rows],
            "key": [key for _, key in rows],
            "value": pa.array([5] * len(rows), pa.int64()),
            "other": pa.array([None] * len(rows), pa.string()),
        }
    )
    port = free_port()
    job = Job("kv_topology:string_keys", source="arrow", metrics_port=port, progress=False)
    with job.start(init, output=tmp_path / "out") as session:
        session.push(events.slice(0, 5))
        session.flush()
        assert samples(port)["txstream_table_rows", (("table", "kv"),)] == 4  # b c d f
        session.push(events.slice(5))
        session.flush()
        assert samples(port)["txstream_table_rows", (("table", "kv"),)] == 5  # and a
        result = session.close()
    assert result.state["kv"].column("key").to_pylist() == ["a", "b", "c", "d", "f"]
    assert result.metrics["table_rows"] == {"kv": 5}
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["table_rows"] == {"kv": 5}
    assert "<th>rows per table</th><td>kv 5</td>" in render(result.metrics)


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


def _decided(got: dict[tuple[str, tuple], float]) -> float:
    return sum(v for (name, _), v in got.items() if name == "txstream_events_total")


def _recoverable_job(tmp_path, port: int) -> Job:
    """SL on Ray actors (a killed one is recovered) checkpointing every batch, served at
    ``port``."""
    return Job(
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


def test_a_recovery_counts_every_event_once(tmp_path):
    """A session fed in slices and scraped between them, whose Coordinator is SIGKILLed
    mid-stream: no scrape counts more events than are decided, and at the end the events
    by status are the session's own counts, each event once."""
    events, init = generate("sl", WorkloadSpec(events=24000, keys=500, abort_ratio=0.05, seed=6))
    port = free_port()
    job = _recoverable_job(tmp_path, port)
    size, killed = 400, False
    with job.start(init, output=tmp_path / "out") as session:
        for start in range(0, events.num_rows, size):
            session.push(events.slice(start, size))
            if not killed and start >= events.num_rows // 3:
                (coordinator,) = actor_processes("Coordinator", wait_s=0)
                os.kill(coordinator, signal.SIGKILL)
                killed = True
            got = samples(port)
            if got["txstream_ready", ()] == 1:
                assert _decided(got) <= got["txstream_watermark_events", ()], start
            time.sleep(0.02)
        session.flush()
        wait_for(lambda: samples(port)["txstream_ready", ()] == 1, "ready after the flush")
        got = samples(port)
        statuses = output_statuses(session)
        result = session.close()
    assert len(result.metrics["recoveries"]) == 1
    assert _decided(got) == got["txstream_watermark_events", ()] == events.num_rows
    for status in ("committed", "aborted", "rejected"):
        assert got["txstream_events_total", (("status", status),)] == statuses[status]
        assert statuses[status] == result.metrics[status]


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
    job = _recoverable_job(tmp_path, port)
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

NODES = int(sys.argv[1])
events, init = generate("sl", WorkloadSpec(events=5000, keys=200, abort_ratio=0.05, seed=5))
options = dict(source="arrow", progress=False, timeout_s=120)
if NODES == 1:
    job, cluster = Job("sl", transport="ray", dashboard=True, **options), None
else:  # a cluster of NODES Ray nodes on this host, its head with the dashboard
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(1, NODES):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    job = Job("sl", nodes=NODES, address=cluster.address, **options)
try:
    with job.start(init, name="on-ray") as session:
        session.push(events)
        session.flush()
        statuses = {}
        for batch in session.outputs():
            for status in batch.column("status").to_pylist():
                statuses[status] = statuses.get(status, 0) + 1
        node = cluster.head_node if cluster else worker._global_node
        folders = [node.get_session_dir_path(), node.get_temp_dir_path()]
        told = {"folders": folders, "statuses": statuses, "agent": metrics_agent_running()}
        print(json.dumps(told))
        sys.stdout.flush()
        sys.stdin.readline()  # until Prometheus has read the counts
        session.close()
finally:
    if cluster:
        cluster.shutdown()
print("closed")
"""


@pytest.mark.parametrize("nodes", [1, 2])
def test_prometheus_reads_a_session_on_ray_through_rays_endpoint(
    tmp_path, prometheus, python_with_dashboard, nodes
):
    """A session on a Ray with its metrics agent (``ray[default]``, with its dashboard), on
    one host or over ``nodes`` Ray nodes: Prometheus finds Ray's endpoint through Ray's
    service discovery file and reads the session's counts there (Ray prefixes the names
    with ``ray_``); a run over nodes exports the driver's figures, its latencies included."""
    env = {**os.environ, "RAY_metrics_report_interval_ms": "500"}
    session = subprocess.Popen(
        [python_with_dashboard, "-c", _ON_RAY, str(nodes)],
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
        ray_latency = 'sum(ray_txstream_latency_seconds_count{run="on-ray"})'
        wait_for(lambda: query(api, ray_latency) == {(): 5000.0}, "latencies through Ray", 60)
        by_bound = 'sum by (le) (ray_txstream_latency_seconds_bucket{run="on-ray"})'
        buckets = query(api, by_bound)
        ordered = [buckets[(("le", le),)] for le in sorted_bounds(buckets)]
        assert ordered == sorted(ordered) and ordered[-1] == 5000.0, buckets
        assert 0 < query(api, f"histogram_quantile(0.99, {by_bound})")[()] < 60
        session.stdin.write("close\n")
        session.stdin.flush()
        out, err = session.communicate(timeout=180)
        assert session.returncode == 0 and "closed" in out, err[-3000:]
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(30)


def sorted_bounds(buckets: dict[tuple, float]) -> list[str]:
    """The ``le`` labels of a histogram's buckets, ascending (``+Inf`` last)."""
    return sorted((dict(labels)["le"] for labels in buckets), key=float)


def _subset(want: dict, got: dict) -> bool:
    return all(got.get(key) == value for key, value in want.items())
