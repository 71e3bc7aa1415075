"""The core without the ``spark`` extra: in processes where pyspark, py4j and RayDP cannot
be imported (as if not installed; Ray's workers included), Arrow and Parquet go through a
job, a session and the command, and whatever asks for Spark is refused in one line that
names the extra."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import run_command

ROOT = Path(__file__).resolve().parent.parent
SPARK = ("pyspark", "py4j", "raydp")

NO_SPARK = f"""
import sys


class NoSpark:
    \"\"\"{", ".join(SPARK)}: not installed, as far as any import can tell.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {SPARK!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NoSpark())
"""

EXTRA = "pip install 'txstream[spark]'"

_LIBRARY = """
import sys
import venv
from pathlib import Path

import pyarrow.parquet as pq
import ray
from txstream import Job, UsageError
from txstream.cluster.ray_runtime import ray_session


@ray.remote
def spark_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("pyspark") is not None
    except ImportError:
        return False


data, out = Path(sys.argv[1]), Path(sys.argv[2])
events = pq.read_table(data / "events.parquet")
with ray_session(log_to_driver=False):  # one Ray for the runs
    assert not ray.get(spark_importable.remote())  # in Ray's workers neither
    table = Job("sl", progress=False).run(events, data / "init")
    files = Job("sl", source="arrow", progress=False).run(data / "events.parquet", data / "init")
    assert table.events.equals(files.events) and table.state == files.state
    session = Job("sl", source="arrow", progress=False).start(data / "init", out)
    session.push(data / "events.parquet")
    assert session.close().events.equals(table.events)
print("ok arrow and parquet", flush=True)
for refused in (
    lambda: Job("sl", progress=False).run(data / "events.parquet", data / "init"),
    lambda: table.to_spark(None),
):
    try:
        refused()
    except UsageError as exc:
        print("refused:", exc, flush=True)
    else:
        raise AssertionError("Spark asked for without the extra, and nothing said so")
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("pyspark", "py4j", "raydp"))
assert not loaded, loaded
print("ok no spark loaded", flush=True)
"""


@pytest.fixture(scope="module")
def no_spark(tmp_path_factory) -> dict[str, str]:
    """The environment of a process (and of the Ray workers it starts) without Spark: a
    ``sitecustomize`` that refuses its imports, first on the module path."""
    folder = tmp_path_factory.mktemp("no-spark")
    (folder / "sitecustomize.py").write_text(NO_SPARK)
    return {"PYTHONPATH": str(folder)}


@pytest.fixture(scope="module")
def workload(tmp_path_factory, no_spark) -> Path:
    """An SL workload written by `txstream generate`, itself run without Spark."""
    data = tmp_path_factory.mktemp("workload")
    generate = ["generate", "sl", "--out", str(data), "--events", "3000", "--keys", "64"]
    proc = _txstream(no_spark, *generate)
    assert proc.returncode == 0, proc.stderr
    return data


def _python(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _txstream(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return _python(env, "-m", "txstream", *argv)


def test_the_blocker_blocks(no_spark):
    proc = _python(no_spark, "-c", "import pyspark")
    assert proc.returncode == 1 and "No module named 'pyspark'" in proc.stderr


def test_a_job_and_a_session_over_arrow_and_parquet(no_spark, workload, tmp_path):
    proc = _python(no_spark, "-c", _LIBRARY, str(workload), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ok arrow and parquet\n" in proc.stdout and "ok no spark loaded\n" in proc.stdout
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2, proc.stdout
    assert all(EXTRA in line for line in refusals), refusals
    assert "source='spark' (Parquet files read by Spark) needs Spark" in refusals[0]
    assert "to_spark needs Spark" in refusals[1]


def test_the_core_installs_and_runs_without_spark(workload, tmp_path):
    """``pip install txstream`` (the core, at CI's pins) in a virtualenv of its own."""
    folder = tmp_path / "core"
    venv.create(folder, with_pip=True)
    python = str(folder / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt")]
    proc = subprocess.run(
        [*install, "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    frozen = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True)
    installed = {line.split("==")[0].lower() for line in frozen.stdout.splitlines()}
    assert {"ray", "pyarrow", "numba"} <= installed and not installed & set(SPARK)
    command = run_command(
        "sl",
        str(workload / "events.parquet"),
        str(workload / "init"),
        str(tmp_path / "out"),
        "--source",
        "arrow",
    )
    proc = subprocess.run([python, *command[1:]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert proc.stdout.startswith("sl ") and "3,000 events" in proc.stdout
    proc = subprocess.run([python, *command[1:-2]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and EXTRA in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("source", [[], ["--source", "spark"]])
def test_the_command_asked_for_spark_is_exit_2_naming_the_extra(
    no_spark, workload, tmp_path, source
):
    command = run_command(
        "sl",
        str(workload / "events.parquet"),
        str(workload / "init"),
        str(tmp_path / "out"),
        *source,
    )
    proc = _python(no_spark, *command[1:])
    assert proc.returncode == 2
    assert proc.stderr == (
        "txstream: error: --source spark (the default) needs Spark, which is not installed "
        f"here (pyspark, py4j, raydp missing): {EXTRA}, or --source arrow\n"
    )
    assert not (tmp_path / "out").exists()
