"""The lean worker setup a local Ray starts its workers through: Ray's command, without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from ray._private.runtime_env.context import RuntimeEnvContext
from ray.core.generated.common_pb2 import Language
from txstream.cluster import worker_setup

CONTEXT = json.dumps(
    {
        "command_prefix": ["source", "/x/activate", "&&"],
        "env_vars": {"TXS_SETUP_A": "a ${TXS_SETUP_B} ${TXS_SETUP_UNSET}"},
        "py_executable": "/x/python",
        "java_jars": ["/j/one"],
    }
)


def rays_command(args: list[str], monkeypatch) -> str:
    """The shell command Ray's own setup script would exec for ``args``."""
    options, rest = worker_setup.split(args)
    seen = []
    monkeypatch.setattr(os, "execvp", lambda file, args: seen.append(args[2]))
    context = RuntimeEnvContext.deserialize(options["--serialized-runtime-env-context"] or "{}")
    context.exec_worker(rest, Language.Value(options["--language"]))
    return seen[0]


def _cleared_after(name: str, monkeypatch) -> None:
    """No ``name`` in the environment now, and none after the test, whatever the code under
    test sets (``delenv`` of a variable that is not set records nothing to restore)."""
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


@pytest.mark.parametrize("language", ["PYTHON", "JAVA", "CPP"])
@pytest.mark.parametrize("context", [CONTEXT, "{}"])
def test_the_command_is_rays(language, context, monkeypatch):
    _cleared_after("GRPC_EXPERIMENTS", monkeypatch)  # a Java worker's is set below
    _cleared_after("TXS_SETUP_A", monkeypatch)  # set from the context below
    monkeypatch.setenv("TXS_SETUP_B", "b")
    args = [
        "-s",
        f"--language={language}",
        "/w/worker.py",
        "--serialized-runtime-env-context",
        context,
        "--arg=with space",
        "it's",
    ]
    ours = worker_setup.command(args)
    ours_env = os.environ.pop("TXS_SETUP_A", None)
    assert ours == rays_command(args, monkeypatch)
    assert ours_env == os.environ.get("TXS_SETUP_A")


@pytest.mark.parametrize("language", ["PYTHON", "JAVA"])
def test_java_workers_get_grpcs_work_stealing_pool(language, monkeypatch):
    """Only Java workers, and a user's own choice of gRPC's experiments stays."""
    _cleared_after("GRPC_EXPERIMENTS", monkeypatch)
    worker_setup.command([f"--language={language}", "/w/worker"])
    expected = "work_stealing" if language == "JAVA" else None
    assert os.environ.get("GRPC_EXPERIMENTS") == expected
    monkeypatch.setenv("GRPC_EXPERIMENTS", "-work_stealing")
    worker_setup.command([f"--language={language}", "/w/worker"])
    assert os.environ["GRPC_EXPERIMENTS"] == "-work_stealing"


def test_it_imports_no_ray_and_execs_the_worker(tmp_path):
    """Run by path as the raylet runs it: the standard library only, then the worker."""
    probe = tmp_path / "probe.py"
    probe.write_text("import sys; print('ray' in sys.modules, sys.argv[1:])")
    script = Path(worker_setup.__file__)
    done = subprocess.run(
        [sys.executable, str(script), "--language=PYTHON", str(probe), "x y"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False ['x y']"
    listed = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), "--language=CPP", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in listed.stderr.splitlines()]
    assert "ray" not in imported and not any(m.startswith("txstream") for m in imported)


def test_a_local_ray_starts_its_workers_through_it(ray_cluster):
    """Python workers of the test session's Ray (a local one) run, set up by it."""

    @ray.remote(num_cpus=0)
    def environment() -> str | None:
        return os.environ.get("PYTHONPATH")

    assert "tests" in (ray.get(environment.remote(), timeout=120) or "")
