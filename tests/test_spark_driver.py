"""Spark's driver launched before Ray (`spark_driver.launch_early`): taken by a session with
its output, or ended with its folder when nobody takes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="no java")


@pytest.fixture
def short_tmp():
    """A private TMPDIR short enough to be used as it is (`scratch._base`): the early
    driver's folder is made in it."""
    path = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


TAKEN = """
import os, sys, time
from pathlib import Path
from pyspark import SparkContext
from txstream.cluster.scratch import remove_tree
from txstream.connectors import spark_driver

spark_driver.launch_early("info")
while SparkContext._gateway is None:  # launched: its output is held from here on
    time.sleep(0.05)
SparkContext._gateway.jvm.System.err.println("said before it was taken")
time.sleep(0.5)
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 2)  # as a run's log does
folder = spark_driver.take_early()
assert folder is not None and folder.is_dir() and (folder / "log4j2.properties").is_file()
assert folder.parent == Path(os.environ["TMPDIR"])
assert spark_driver.take_early() is None  # taken once
SparkContext._gateway.jvm.System.err.println("said after it was taken")
time.sleep(0.5)
spark_driver.end_spark_driver()
remove_tree(folder)
"""


def test_an_early_driver_says_what_it_said_where_stderr_is_when_taken(tmp_path, short_tmp):
    """Until a session takes it, the driver's output is held (the command's stderr is the
    terminal then); taken, it goes where stderr points: the run's log."""
    log = tmp_path / "log"
    run = subprocess.run(
        [sys.executable, "-c", TAKEN, str(log)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(short_tmp)},
    )
    assert run.returncode == 0, run.stderr
    assert "said" not in run.stderr
    said = log.read_text()
    assert 0 <= said.index("said before it was taken") < said.index("said after it was taken")
    assert list(short_tmp.iterdir()) == []


ABANDONED = """
from pyspark import SparkContext
from txstream.connectors import spark_driver

spark_driver.launch_early("info")
folder = spark_driver._early.folder
assert folder.is_dir() and folder.parent.name.startswith("t")
spark_driver.end_spark_driver()  # while it launches: once launched, ended
assert SparkContext._gateway.proc.poll() is not None and not folder.exists()
print("ended")
"""


def test_an_early_driver_nobody_takes_is_ended_with_its_folder(short_tmp):
    """A run that fails before Spark starts (its input refused) ends the driver it
    launched early and removes its folder."""
    run = subprocess.run(
        [sys.executable, "-c", ABANDONED],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(short_tmp)},
    )
    assert run.returncode == 0 and run.stdout == "ended\n", run.stderr
    assert list(short_tmp.iterdir()) == []


REFUSED_IN_PROCESS = """
import os, sys
from pathlib import Path
from txstream.cli.main import main
from txstream.cluster.scratch import descendants
from txstream.cluster.topology import usable_cores

data = sys.argv[1]
code = main([
    "run", "sl", "--input", f"{data}/events.parquet", "--init-state", f"{data}/init",
    "--output", f"{data}/out", "--executors", str(4 * usable_cores() + 1),
])
assert code == 2
assert list(Path(os.environ["TMPDIR"]).iterdir()) == []
java = [p for p in descendants(os.getpid()) if b"java" in Path(f"/proc/{p}/cmdline").read_bytes()]
assert java == [], java
print("refused")
"""


def test_a_run_refused_in_process_leaves_no_early_driver(tmp_path, short_tmp):
    """`main` (the command line called in a Python process) ends the driver it launched
    early when the run is refused before Spark starts, and removes its folder: no JVM
    and no folder outlive the call, though the process goes on."""
    from txstream.cli.main import main

    data = tmp_path / "data"
    assert main(["generate", "sl", "--out", str(data), "--events", "10"]) == 0
    run = subprocess.run(
        [sys.executable, "-c", REFUSED_IN_PROCESS, str(data)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TMPDIR": str(short_tmp), "RAY_ADDRESS": ""},
    )
    assert run.returncode == 0 and run.stdout == "refused\n", run.stderr
    assert list(short_tmp.iterdir()) == []
