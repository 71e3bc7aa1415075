"""The README's session example runs as written, on small data, and gives the model's run.

It runs as a program of its own in a folder holding ``data/sl`` (its paths are relative),
with a Ray of its own, as a user runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import naive
import pyarrow.parquet as pq
from compare import assert_same_run
from conftest import txstream_segments
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

README = Path(__file__).parent.parent / "README.md"


def _section(section: str) -> str:
    text = README.read_text()
    return text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]


def _python_block(section: str, index: int = 0) -> str:
    """The ``index``-th ```python block of the README's ``## section``."""
    return re.findall(r"```python\n(.*?)```", _section(section), re.S)[index]


def _text_after(section: str, index: int) -> str:
    """The ```text block that follows the ``index``-th ```python block of ``section``
    (what the README says the example prints)."""
    after = _section(section).split("```python\n")[index + 1].split("```", 1)[1]
    return re.search(r"```text\n(.*?)```", after, re.S).group(1)


def test_the_session_example_runs_as_written(tmp_path):
    events, init = generate("sl", WorkloadSpec(events=20_000))
    write_workload(tmp_path / "data" / "sl", events, init)
    proc = subprocess.Popen(
        [sys.executable, "-c", _python_block("Sessions")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert stderr == ""  # progress=False: nothing of txstream's, nor of Ray's start
    assert "flushed up to: 20000" in stdout
    assert "output rows from ts 40,000 on: 0" in stdout  # fewer events than the example's
    out = tmp_path / "out" / "session"
    assert (out / "_SUCCESS").is_file() and list((out / "events").glob("part-*.parquet"))
    state = {name: pq.read_table(out / "state" / f"{name}.parquet") for name in init}
    assert_same_run(pq.read_table(out / "events"), state, *naive.run_model("sl", events, init))
    assert not txstream_segments(proc.pid)


def test_the_spark_examples_run_in_readme_order_and_print_what_it_shows(tmp_path):
    """As a user follows the README in one folder, on its 50,000 generated events: the
    `--follow` example leaves its input files (its `_STOP` is consumed), then the two
    Spark examples run as written; each prints exactly what the README shows (no
    leftover input read, no Spark or Ray chatter on stdout) and leaves no Ray session in
    /tmp/ray."""
    follow = _section("Outside readers and `--follow`")
    data = re.search(r"generate sl --out (\S+) --events 50000", follow)[1]
    events, init = generate("sl", WorkloadSpec(events=50_000))
    write_workload(tmp_path / data, events, init)
    follow_input = re.search(r"mkdir (\S+)\n", follow)[1]
    (tmp_path / follow_input).mkdir()  # what the --follow example leaves there
    pq.write_table(events.slice(0, 20_000), tmp_path / follow_input / "part-000.parquet")
    pq.write_table(events.slice(20_000, 10_000), tmp_path / follow_input / "part-001.parquet")
    for index in (0, 1):
        proc = subprocess.Popen(
            [sys.executable, "-c", _python_block("Spark", index)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=600)
        finally:
            proc.kill()
        assert proc.returncode == 0, stderr[-3000:]
        shown = re.search(r"It prints `([^`]+)` and commits", _section("Spark"))[1] + "\n"
        expected = _text_after("Spark", 0) if index == 0 else shown
        assert stdout.rstrip("\n") == expected.rstrip("\n")  # show() ends with a blank line
        assert not list(Path("/tmp/ray").glob(f"session_*_{proc.pid}"))  # Ray's 40 MB
