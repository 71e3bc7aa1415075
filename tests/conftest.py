"""One Ray for the whole test session (starting Ray per test costs ~5 s each)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
RUN_TAG = f"TXSTREAM_TEST_RUN={os.getpid()}"
"""Set in this process's environment and so inherited by every process it starts (Ray's
daemons and workers, CLI subprocesses and their Rays): tells this test run's processes
from those of other test runs on the same machine."""
os.environ["TXSTREAM_TEST_RUN"] = str(os.getpid())


@pytest.fixture(scope="session", autouse=True)
def nothing_left_after_the_suite():
    """After every test (this fixture is set up first, so torn down last): no shared
    memory of this process's runs, no Ray folder of its own left in the temporary folder,
    no temporary output of a process that is gone."""
    yield
    import shutil
    import tempfile

    # a failed run without an output keeps its log for its user (the error names it); the
    # suite's own deliberate failures are this process's runs: their logs go
    for log in Path(tempfile.gettempdir()).glob("txstream_log_*/txstream.log"):
        if f", pid {os.getpid()}\n" in log.read_text(errors="replace").split("\n", 1)[0] + "\n":
            shutil.rmtree(log.parent, ignore_errors=True)
    assert txstream_segments() == [], "the suite left shared memory behind"
    rays = [
        *Path(tempfile.gettempdir()).glob(f"txs-ray-*/session_*_{os.getpid()}"),
        *Path("/tmp/ray").glob(f"session_*_{os.getpid()}"),  # Ray's default: ~50 MB
    ]
    assert rays == [], "the suite left a Ray session folder behind"
    assert _abandoned_outputs() == [], "a killed process's temporary output stayed"


def _abandoned_outputs(wait_s: float = 10.0) -> list[str]:
    """Temporary outputs (``txs-out-<pid>-*``) of processes that are gone, after giving
    their reapers ``wait_s`` (the Ray shut down last may have killed node members)."""
    import tempfile
    import time

    deadline = time.monotonic() + wait_s
    while True:
        left = [
            p.name
            for p in Path(tempfile.gettempdir()).glob("txs-out-*")
            if not Path(f"/proc/{p.name.split('-')[2]}").exists()
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray, with the JVM flags Spark needs; actors see tests/ on their path
    (for test topologies)."""
    from ray.job_config import JobConfig
    from txstream.cluster.ray_runtime import ray_session
    from txstream.connectors.spark import ray_job_config

    job_config = JobConfig(
        jvm_options=ray_job_config().jvm_options,
        runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}},
    )
    with ray_session(job_config=job_config, log_to_driver=False):
        yield


@pytest.fixture(scope="session")
def spark(ray_cluster):
    """One Spark (RayDP) for the whole test session, on the session's Ray."""
    from txstream.connectors.spark import spark_session
    from txstream.connectors.spark_driver import java_available

    problem = java_available()
    if problem:
        pytest.fail(problem)
    with spark_session(app_name="txstream-test") as session:
        yield session


@pytest.fixture(scope="session")
def python_with_dashboard(tmp_path_factory) -> str:
    """An interpreter that sees this one's packages and those of ``ray[default]``: a
    virtualenv of its own, as in the project's Ray would start its dashboard's processes in
    full for every run; one for the whole test session (pip installs it in minutes)."""
    import subprocess
    import sysconfig
    import venv

    import ray

    folder = tmp_path_factory.mktemp("dashboard-venv")
    venv.create(folder, with_pip=True)
    (site_packages,) = (folder / "lib").glob("python*/site-packages")
    ours = sysconfig.get_paths()["purelib"]
    (site_packages / "txstream-packages.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n"
    )
    python = str(folder / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", f"ray[default]=={ray.__version__}"]
    subprocess.run(install, check=True, capture_output=True, timeout=900)
    return python


def txstream_segments(pid: int | None = None) -> list[str]:
    """Shared-memory segments that runs driven by process ``pid`` (default: this
    one) left behind. Other processes' runs may be going on at the same time."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"txstream_{pid or os.getpid()}_*"))


def actor_processes(cls: str, wait_s: float = 10.0) -> list[int]:
    """Pids of live Ray worker processes hosting a ``cls`` actor, after giving killed
    ones ``wait_s`` to exit (Ray titles them ``ray::<class>[.<method>]``)."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                title = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if (title == f"ray::{cls}" or title.startswith(f"ray::{cls}.")) and _ours(
                cmdline.parent
            ):
                pids.append(int(cmdline.parent.name))
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def _ours(proc: Path) -> bool:
    """Whether a process was started (directly or not) by this test run."""
    try:
        return RUN_TAG.encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def wait_for_team(pid: int, transport: str, timeout_s: float = 120.0) -> None:
    """Return once the run of process ``pid`` is past start-up (its team is up: Executor
    processes on Ray, its shared memory for threads), or after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if transport == "ray" and actor_processes("Executor", wait_s=0):
            return
        if transport == "threads" and txstream_segments(pid):
            return
        time.sleep(0.2)


def run_command(topology: str, events: str, init: str, output: str, *options: str) -> list[str]:
    """The command line of `txstream run` in this interpreter: ``topology`` over ``events``
    from ``init`` into ``output``, with more ``options``."""
    command = ["run", topology, "--input", events, "--init-state", init, "--output", output]
    return [sys.executable, "-m", "txstream", *command, *options]
