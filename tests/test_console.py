"""The console: phases, the event bar (rate and ETA from the first events out), warnings."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from txstream.monitor import console as console_module
from txstream.monitor.console import Console, _si


class Clock:
    """A settable stand-in for time.perf_counter."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(console_module.time, "perf_counter", clock)
    return clock


def test_phases_are_lines_with_their_seconds(clock):
    out = io.StringIO()
    console = Console(stream=out)
    with console.phase("starting Ray"):
        clock.now += 2.5
    with pytest.raises(RuntimeError), console.phase("starting Spark"):
        clock.now += 1.0
        raise RuntimeError("no Java")
    assert out.getvalue() == (
        "txstream: starting Ray ... 2.5 s\ntxstream: starting Spark ... failed after 1.0 s\n"
    )
    assert console.phases == {"starting Ray": 2.5, "starting Spark": 1.0}


def test_a_warning_during_a_phase_gets_its_own_line_and_shows_when_disabled(clock):
    out = io.StringIO()
    console = Console(stream=out)
    with console.phase("starting Ray"):
        console.warn("3 executors on 2 usable cores")
        clock.now += 1
    assert out.getvalue().splitlines() == [
        "txstream: starting Ray ...",
        "txstream: warning: 3 executors on 2 usable cores",
        "txstream: starting Ray ... 1.0 s",
    ]
    quiet = io.StringIO()
    console = Console(enabled=False, stream=quiet)
    with console.phase("starting Ray"):
        console.warn("careful")
    assert quiet.getvalue() == "txstream: warning: careful\n"


def test_rate_is_the_runs_own_from_its_start_and_its_base(clock):
    start = clock.now
    clock.now += 10  # the pipeline fills (Spark converts the first partition)
    bar = Console(stream=io.StringIO()).progress(1_000_000, "running", start, base=200_000)
    assert bar.rate(clock.now) is None and bar.eta(clock.now) is None
    bar.update(300_000)  # 100k events of this run in 10 s (a resumed run: 200k before)
    assert bar.rate(clock.now) == pytest.approx(10_000)
    assert bar.eta(clock.now) == pytest.approx(70)


def test_bar_lines_when_not_a_terminal(clock):
    out = io.StringIO()
    with Console(stream=out).progress(2_000_000, "running") as bar:
        clock.now += 1
        bar.update(500_000)  # before 10 s: nothing printed
        clock.now += 10
        bar.update(1_000_000)
        clock.now += 1
        bar.update(2_000_000)
    bar.close(166_666.7, 12.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "50% |" in lines[0] and "1.00M/2.00M events" in lines[0] and "ETA" in lines[0]
    assert lines[1].endswith("2.00M/2.00M events  167k events/s in 12.0 s")


def test_bar_without_a_total_and_a_disabled_bar(clock):
    out = io.StringIO()
    with Console(stream=out).progress(None, "running") as bar:
        clock.now += 2
        bar.update(1234)
    bar.close(617.0, 2.0)
    assert out.getvalue() == "txstream: running  1.23k events  617 events/s in 2.0 s\n"
    quiet = io.StringIO()
    with Console(enabled=False, stream=quiet).progress(10, "running") as bar:
        bar.update(10)
    bar.close(10.0, 1.0)
    assert quiet.getvalue() == ""


def test_terminal_redraws_the_current_line(clock):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    console = Console(stream=out)
    with console.phase("starting Ray"):
        clock.now += 1
    assert out.getvalue() == "\rtxstream: starting Ray ...\rtxstream: starting Ray ... 1.0 s\n"


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "?"), (0, "0"), (950, "950"), (1000, "1.00k"), (12_345, "12.3k"), (4e6, "4.00M")],
)
def test_si(value, text):
    assert _si(value) == text


def test_a_warning_before_any_log_is_set_up_is_shown_once():
    code = "from txstream.monitor.console import Console; Console().warn('too many executors')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stderr == "txstream: warning: too many executors\n"
