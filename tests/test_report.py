"""`txstream report`: the page opens in a real headless browser with every plot drawn."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from txstream.cli.main import main
from txstream.monitor.metrics import LatencyHistogram, Timeline, equal_runs
from txstream.monitor.report import render

# Run in the page by the browser: each figure says whether its plot has a size and shapes
# laid out in it (an SVG the browser could not draw has neither).
CHECK = """<script>
for (const figure of document.querySelectorAll("figure.plot")) {
  const svg = figure.querySelector("svg");
  const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  const drawn = svg ? [...svg.querySelectorAll("path")].filter(path => {
    const shape = path.getBBox();
    return shape.width + shape.height > 0;
  }).length : 0;
  figure.dataset.rendered = box.width > 100 && box.height > 50 && drawn > 10 ? "yes" : "no";
}
</script>"""


def _metrics(morphstream: bool) -> dict:
    """A run's metrics.json as the engine writes it, small."""
    timeline = Timeline(start=1000.0)
    for second in range(5):
        timeline.add(1000.0 + second + 0.5, [0.01 * (second + 1)] * (100 * (second + 1)))
    breakdown = {
        "useful": 1.0,
        "sync": 0.2,
        "lock": 0.0,
        "construct": 0.1,
        "explore": 0.05,
        "abort": 0.01,
    }
    metrics = {
        "events": 1500,
        "committed": 1490,
        "aborted": 10,
        "rejected": 0,
        "seconds": 5.0,
        "throughput_eps": 300.0,
        "latency_ms": {"p50": 30.0, "p99": 50.0},
        "timeline": timeline.as_dict(),
        "breakdown_s": breakdown,
        "breakdown_per_executor_s": [breakdown, breakdown],
        "startup_s": 2.0,
        "recoveries": [
            {"cause": "Executor 1 died", "watermark": 900, "checkpoint": 500, "seconds": 1.5}
        ],
        "checkpoints": {"written": 3, "seconds": 0.2},
        "config": {
            "topology": "sl",
            "scheduler": "morphstream" if morphstream else "serial",
            "resumed_from": 0,
        },
    }
    if morphstream:
        metrics["decision_batches"] = {
            "explore": ["bfs", "dfs", "bfs"],
            "granularity": ["fine", "fine", "coarse"],
            "abort": ["lazy", "eager", "lazy"],
        }
    return metrics


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("no chromium to open the report in: install Debian's chromium (./setup does)")
    return found


@pytest.mark.parametrize("morphstream", [True, False])
def test_the_report_opens_in_a_browser_with_every_plot_drawn(tmp_path, morphstream, capsys):
    out = tmp_path / "out"
    out.mkdir()
    metrics = _metrics(morphstream)
    (out / "metrics.json").write_text(json.dumps(metrics))
    assert main(["report", str(out)]) == 0
    page = out / "report.html"
    assert capsys.readouterr().out == f"{page}\n"
    text = page.read_text()
    links = re.findall(r'(?:src|href)="([^"#][^"]*)"', text)
    assert "<script" not in text and links == []  # self-contained: nothing fetched
    checked = tmp_path / "checked.html"
    checked.write_text(text.replace("</body>", CHECK + "</body>"))
    dom = subprocess.run(
        [
            _browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            checked.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    figures = re.findall(r'<figure class="plot" id="(\w+)" data-rendered="(\w+)"', dom)
    expected = ["throughput", "latency", "breakdown"] + ["decisions"] * morphstream + ["recovery"]
    assert figures == [(name, "yes") for name in expected], dom[:2000]


def test_timeline_counts_events_and_latency_per_bin():
    timeline = Timeline(start=100.0)
    timeline.add(100.002, [0.010] * 3)
    timeline.add(100.009, [0.030])
    timeline.add(100.025, [0.5, 0.5])  # nothing came out in the bin after the first
    series = timeline.as_dict()
    assert series["bin_s"] == Timeline.FIRST_BIN_S
    assert series["second"] == [0, 0.02] and series["events"] == [4, 2]
    assert series["latency_p50_ms"][0] == pytest.approx(10, rel=0.02)
    assert series["latency_p99_ms"][0] == pytest.approx(30, rel=0.02)
    assert series["latency_p50_ms"][1] == pytest.approx(500, rel=0.02)


@pytest.mark.parametrize("seconds", [0.2, 3.0, 3600.0])
def test_the_timeline_bins_follow_the_run_length(seconds):
    rng = np.random.default_rng(5)
    start = 50.0
    timeline = Timeline(start)
    moments = np.sort(rng.uniform(0, seconds, 5000))
    latencies = rng.uniform(0.001, 0.1, (len(moments), 3))
    for moment, these in zip(moments, latencies, strict=True):
        timeline.add(start + moment, these)
    series = timeline.as_dict()
    width = series["bin_s"]
    if width > Timeline.FIRST_BIN_S:
        assert Timeline.MAX_BINS / 2 <= seconds / width <= Timeline.MAX_BINS
    assert len(series["events"]) >= 10  # a 0.2-s run is many bars, not one
    # the merged bins hold exactly the events and latencies that came out in them
    index = ((start + moments) - start) // width
    for second, events, p50, p99 in zip(
        series["second"],
        series["events"],
        series["latency_p50_ms"],
        series["latency_p99_ms"],
        strict=True,
    ):
        expected = LatencyHistogram()
        expected.add(np.sort(latencies[index == round(second / width)].ravel()))
        assert events == expected.counts.sum()
        assert (p50, p99) == (expected.percentile_ms(50), expected.percentile_ms(99))
    assert sum(series["events"]) == latencies.size


def test_a_short_run_is_drawn_in_many_bars():
    timeline = Timeline(start=0.0)
    for moment in np.linspace(0, 0.2, 200, endpoint=False):
        timeline.add(moment, [0.005] * 10)
    metrics = {**_metrics(morphstream=False), "timeline": timeline.as_dict(), "seconds": 0.2}
    page = render(metrics)
    throughput = page[page.index('id="throughput"') : page.index('id="latency"')]
    bars = re.findall(r'<g id="patch_\d+">', throughput)
    assert len(bars) >= 20, len(bars)  # 20 bins of 10 ms, each a bar (plus the axes' frame)
    assert "bins of 10 ms" in throughput


def test_latencies_counted_by_runs_are_counted_as_one_by_one():
    rng = np.random.default_rng(3)
    latencies = np.repeat(rng.random(50), rng.integers(1, 20, 50))
    one_by_one, by_runs = LatencyHistogram(), LatencyHistogram()
    for value in latencies:
        one_by_one.add([value])
    values, counts = equal_runs(latencies)
    assert len(values) < len(latencies) and counts.sum() == len(latencies)
    by_runs.add(values, counts)
    assert np.array_equal(by_runs.counts, one_by_one.counts)


def test_report_of_a_folder_without_metrics_is_exit_2_with_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"txstream: error: report: no metrics.json at {tmp_path}/metrics.json "
        "(has the run committed?)\n"
    )
