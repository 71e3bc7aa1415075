"""`txstream top` in a real terminal (tmux) over a real run's metrics, and the Grafana
dashboard's queries against the names that run exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_command
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from txstream import Job
from txstream.cli.main import main
from txstream.monitor.top import figures, parse, quantile
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "docs" / "grafana-txstream.json"
TXSTREAM = str(Path(sys.executable).with_name("txstream"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drop(folder: Path, name: str, table) -> None:
    """Write a file as a well-behaved producer does: under a hidden name, then renamed."""
    pq.write_table(table, folder / f".{name}")
    os.replace(folder / f".{name}", folder / name)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


class Terminal:
    """A command in a tmux window of its own tmux server (so that nothing else's is
    touched), read as a person sees it."""

    def __init__(self, command: str, width: int = 110, height: int = 40):
        self.server = f"txstream-top-test-{os.getpid()}"
        shell = f'{command}; echo "[exit $?]"; sleep 600'
        self._tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), shell)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.server, *args], capture_output=True, text=True, check=True
        ).stdout

    def screen(self) -> str:
        """What the window shows now."""
        return self._tmux("capture-pane", "-p", "-t", "top")

    def wait_for(self, pattern: str, timeout_s: float = 60.0) -> str:
        """The screen once it matches ``pattern`` (an AssertionError with the screen if it
        does not within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if re.search(pattern, screen):
                return screen
            assert time.monotonic() < deadline, f"no {pattern!r} on the screen:\n{screen}"
            time.sleep(0.3)

    def keys(self, *keys: str) -> None:
        """Type ``keys`` (tmux's names: ``C-c`` is Ctrl-C)."""
        self._tmux("send-keys", "-t", "top", *keys)

    def close(self) -> None:
        """End the tmux server this terminal started, and what runs in it."""
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True)


@pytest.fixture
def terminal():
    assert shutil.which("tmux"), "tmux is missing: ./setup installs it"
    made: list[Terminal] = []

    def start(command: str) -> Terminal:
        made.append(Terminal(command))
        return made[-1]

    yield start
    for t in made:
        t.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A `txstream run --follow` with --metrics-port and checkpoints, fed a file a second
    by ``feed()``; ``stop()`` ends it and returns its exit code and output."""
    tmp = tmp_path_factory.mktemp("top")
    events, init = generate("sl", WorkloadSpec(events=200_000, keys=200, seed=9))
    write_workload(tmp / "data", events, init)
    incoming = tmp / "incoming"
    incoming.mkdir()
    port = _free_port()
    command = run_command(
        "sl",
        str(incoming),
        str(tmp / "data" / "init"),
        str(tmp / "out"),
        "--follow",
        "--source",
        "arrow",
        "--executors",
        "2",
        "--no-progress",
        "--name",
        "top-test",
        "--metrics-port",
        str(port),
        "--checkpoint-dir",
        str(tmp / "checkpoints"),
        "--checkpoint-every",
        "5",
    )
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    url = f"http://127.0.0.1:{port}/metrics"

    class Run:
        pass

    state = Run()
    state.url, state.proc, state.files = url, proc, 0

    def feed(events_per_file: int = 5000) -> None:
        start = state.files * events_per_file
        if start >= len(events):
            return
        _drop(incoming, f"e-{state.files:05d}.parquet", events.slice(start, events_per_file))
        state.files += 1

    def stop() -> tuple[int, str, str]:
        (incoming / "_STOP").touch()
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err

    state.feed, state.stop = feed, stop
    deadline = time.monotonic() + 120
    feed()
    while True:
        try:
            _scrape(url)
            break
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the run's metrics never answered"
            time.sleep(0.3)
    yield state
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _exported(text: str) -> set[str]:
    """The names of the series an exposition holds, as PromQL names them (a counter's with
    ``_total``, a histogram's ``_bucket``, ``_sum`` and ``_count``), families without
    samples included."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
        names.update(sample.name for sample in family.samples)
    return names


def test_the_grafana_dashboard_asks_only_for_what_a_run_exports(run):
    dashboard = json.loads(DASHBOARD.read_text())
    deadline = time.monotonic() + 60
    while "txstream_checkpoint_age_seconds" not in (exported := _exported(_scrape(run.url))):
        assert time.monotonic() < deadline, "no checkpoint written within 60 s"
        run.feed()  # checkpoints come with punctuation batches
        time.sleep(1.0)
    assert {"txstream_events_total", "txstream_latency_seconds_bucket"} <= exported
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"]]
    assert len(exprs) >= 15
    asked = set()
    for expr in exprs:
        assert 'run=~"$run"' in expr, expr  # every panel follows the templated run
        asked.update(re.findall(r"\btxstream_\w+", expr))
    assert asked <= exported, asked - exported
    wanted = {
        "txstream_events_total",
        "txstream_events_pushed_total",
        "txstream_latency_seconds_bucket",
        "txstream_backlog_events",
        "txstream_watermark_events",
        "txstream_executor_seconds_total",
        "txstream_checkpoints_total",
        "txstream_checkpoint_age_seconds",
        "txstream_recoveries_total",
    }
    assert wanted <= asked, wanted - asked
    assert any("histogram_quantile(0.99" in e for e in exprs)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["run"]["query"]["query"] == "label_values(txstream_up, run)"
    assert "txstream_up" in exported


def test_top_shows_a_running_run_and_says_when_it_is_gone(run, terminal):
    screen = terminal(f"{TXSTREAM} top {run.url}")
    deadline = time.monotonic() + 90
    while True:  # a file a second: the rate and the watermark move
        run.feed()
        shown = screen.screen()
        rate = re.search(r"rate\s+([\d,]+) events/s", shown)
        if rate and int(rate.group(1).replace(",", "")) > 0:
            break
        assert time.monotonic() < deadline, f"no rate on the screen:\n{shown}"
        time.sleep(1.0)
    shown = screen.wait_for(r"checkpoints\s+[1-9][\d,]*, newest \d+ s ago")
    watermark = int(re.search(r"watermark\s+([\d,]+) events", shown).group(1).replace(",", ""))
    assert 0 < watermark <= run.files * 5000, shown
    for figure in ("latency p50 / p99", "backlog", "recoveries", "executor", "useful"):
        assert figure in shown, shown
    assert re.search(r"latency p50 / p99 \(run\)\s+[\d.]+ ms / [\d.]+ ms", shown), shown
    assert "run top-test (sl)" in shown
    code, _, err = run.stop()
    assert code == 0, err
    gone = screen.wait_for(r"\[exit \d+\]")
    assert re.search(r"run top-test is gone \(.*\) at watermark [\d,]+\n", gone), gone
    assert "[exit 0]" in gone


@pytest.mark.usefixtures("ray_cluster")
def test_top_finds_a_named_session_and_ends_at_ctrl_c(terminal):
    import ray

    events, init = generate("sl", WorkloadSpec(events=3000, keys=50, seed=2))
    address = ray.get_runtime_context().gcs_address
    job = Job("sl", progress=False, source="arrow", metrics_port=_free_port())
    with job.start(init, name="top-named") as session:
        session.push(events)
        session.flush()
        screen = terminal(f"{TXSTREAM} top --address {address} --name top-named")
        shown = screen.wait_for(r"watermark\s+3,000 events")
        assert "run top-named (sl)" in shown and "committed" in shown, shown
        screen.keys("C-c")
        ended = screen.wait_for(r"\[exit \d+\]")
        assert "[exit 0]" in ended and "Traceback" not in ended, ended
        assert "watermark" in ended  # the last view stays on the screen


def test_top_of_a_url_where_no_run_answers_is_one_line_exit_2(capsys):
    assert main(["top", f"http://127.0.0.1:{_free_port()}/metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txstream: error: top: no run's metrics at") and err.count("\n") == 1
    assert main(["top", "localhost:9464"]) == 2
    assert "is not an http:// address" in capsys.readouterr().err
    assert main(["top", "--name", "x"]) == 2
    assert "or --address and --name" in capsys.readouterr().err


def test_rates_and_recent_latency_come_from_two_scrapes():
    registry = CollectorRegistry()
    labels = {"run": "r", "topology": "sl"}
    decided = Counter("txstream_events", "", [*labels, "status"], registry=registry)
    pushed = Counter("txstream_events_pushed", "", [*labels], registry=registry)
    latency = Histogram(
        "txstream_latency_seconds", "", [*labels], buckets=(0.01, 0.1, 1.0), registry=registry
    )
    pushed.labels(**labels).inc(100)
    decided.labels(**labels, status="committed").inc(90)
    decided.labels(**labels, status="aborted").inc(10)
    for _ in range(100):
        latency.labels(**labels).observe(0.5)  # the run's first second: slow
    before = parse(generate_latest(registry).decode(), at=10.0)
    decided.labels(**labels, status="committed").inc(400)
    for _ in range(100):
        latency.labels(**labels).observe(0.005)  # the last second: fast
    shown = figures(parse(generate_latest(registry).decode(), at=12.0), before)
    assert shown.rate_eps == pytest.approx(200.0)
    assert shown.decided == {"committed": 490.0, "aborted": 10.0}
    assert shown.recent_latency_ms["p99"] == pytest.approx(9.9)  # within the first bucket
    assert shown.latency_ms["p99"] > 100  # the whole run's includes the slow second
    assert (shown.run, shown.topology, shown.pushed) == ("r", "sl", 100.0)


def test_quantiles_interpolate_within_buckets_as_prometheus_does():
    buckets = [(0.1, 50.0), (0.2, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.75, buckets) == pytest.approx(0.15)
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.99, [(0.1, 0.0), (float("inf"), 10.0)]) == pytest.approx(0.1)


def test_a_starting_run_is_shown_not_ready():
    starting = 'txstream_up{run="r",topology="sl"} 1.0\ntxstream_ready{run="r",topology="sl"} 0.0\n'
    shown = figures(parse(starting, at=1.0), parse(starting, at=0.0))
    assert (shown.run, shown.ready, shown.watermark, shown.rate_eps) == ("r", False, None, None)


def test_metrics_of_another_program_are_refused():
    with pytest.raises(Exception, match="not the metrics of a txstream run"):
        parse("# TYPE up gauge\nup 1\n", at=0.0)
