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


def _python_block(section: str) -> str:
    """The first ```python block of the README's ``## section``."""
    text = README.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_the_session_example_runs_as_written(tmp_path):
    events, init = generate("sl", WorkloadSpec(events=20_000))
    write_workload(tmp_path / "data" / "sl", events, init)
    proc = subprocess.Popen([sys.executable, "-c", _python_block("Sessions")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
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
