"""A PySpark 4 session feeds txstream through the public path (files: RayDP has no Spark 4),
in a virtualenv of its own whose pyspark is 4.x, txstream's core seen from this one's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

PYSPARK_4 = "4.3.0"
"""The pyspark 4 release the test runs: the latest, pinned so that every run tests one."""

SCRIPT = Path(__file__).with_name("pyspark4_session.py")


def pyspark4_python() -> Path:
    """The interpreter of a virtualenv with pyspark `PYSPARK_4`, which sees this one's
    packages after its own (its pyspark and py4j shadow those of the ``spark`` extra). Made
    once per installation, kept beside it: pyspark is a download of some 400 MB."""
    folder = Path(sys.prefix) / "test-venvs" / f"pyspark-{PYSPARK_4}"
    python = folder / "bin" / "python"
    if python.exists():
        return python
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    venv.create(partial, with_pip=True)
    (site_packages,) = (partial / "lib").glob("python*/site-packages")
    ours = sysconfig.get_paths()["purelib"]
    (site_packages / "txstream-packages.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n"
    )
    install = [partial / "bin" / "python", "-m", "pip", "install", "-q", f"pyspark=={PYSPARK_4}"]
    subprocess.run(install, check=True, capture_output=True, timeout=1500)
    partial.rename(folder)  # whole or not at all: a run cut short leaves only a partial one
    return python


@pytest.fixture(scope="module")
def pyspark4_run() -> str:
    """What tests/pyspark4_session.py printed under pyspark 4."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYTHONPATH")}
    run = subprocess.run(
        [str(pyspark4_python()), str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=SCRIPT.parent,
    )
    if run.returncode:
        print(run.stderr[-6000:], file=sys.stderr)
    return run.stdout


@pytest.mark.parametrize("check", [f"pyspark {PYSPARK_4}", "job", "session", "to_spark"])
def test_a_pyspark_4_session_in_and_out(pyspark4_run, check):
    assert f"ok {check}\n" in pyspark4_run, pyspark4_run
