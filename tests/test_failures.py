"""Clear failures: one line naming the actor and the cause; an unreachable address is a
usage error within seconds; executors against usable cores."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray
from ray.exceptions import ActorDiedError, RayTaskError
from txstream.cluster import ray_private, ray_runtime, topology
from txstream.cluster.ray_runtime import _LABELS, actor_failure, reachable_address
from txstream.cluster.topology import check_executors
from txstream.errors import RuntimeFailure, SchemaError, UsageError

EXECUTOR_ID = "e1" * 16
SINK_ID = "51" * 16


@pytest.fixture(autouse=True)
def labels():
    _LABELS.update({EXECUTOR_ID: "Executor 1", SINK_ID: "Sink"})
    yield
    _LABELS.pop(EXECUTOR_ID)
    _LABELS.pop(SINK_ID)


def _task_error(function: str, cause: BaseException, actor_id: str | None) -> RayTaskError:
    """As Ray makes it: ``repr`` is set for actors whose class has a ``__repr__``."""
    trace = f"Traceback (most recent call last):\n  ...\n{type(cause).__name__}: {cause}"
    return RayTaskError(
        function,
        trace,
        cause,
        proctitle=f"ray::{function}",
        actor_id=actor_id,
        actor_repr=_LABELS.get(actor_id),
    )


def test_an_error_in_an_actor_call_names_the_actor_and_the_cause():
    failure = actor_failure(_task_error("Executor.process", ValueError("boom\nmore"), EXECUTOR_ID))
    assert type(failure) is RuntimeFailure
    assert str(failure) == "Executor 1: ValueError: boom" and failure.actor == "Executor 1"


def test_the_innermost_actor_is_named_and_txstream_errors_keep_their_type():
    inner = _task_error("Executor.process", RuntimeFailure("the team waited 600 s"), EXECUTOR_ID)
    outer = _task_error("ProgressController.run", inner.as_instanceof_cause(), None)
    failure = actor_failure(outer)
    assert type(failure) is RuntimeFailure and str(failure) == "Executor 1: the team waited 600 s"
    cause = RuntimeError("user code failed")  # as Ray passes it on: the inner error as text
    inner = _task_error("Executor.process", cause, EXECUTOR_ID)
    trace = f"Traceback (most recent call last):\n  File x\n{inner}"
    outer = RayTaskError("ProgressController.run", trace, cause, actor_id="c0" * 16)
    assert str(actor_failure(outer)) == "Executor 1: RuntimeError: user code failed"
    schema = SchemaError("missing column 'kind'")
    assert actor_failure(_task_error("Executor.warm_up", schema, EXECUTOR_ID)) is schema


def test_an_actor_that_failed_to_start_or_died():
    error = OSError(30, "Read-only file system")
    died = ActorDiedError(_task_error("Sink.__init__", error, SINK_ID))
    assert str(actor_failure(died)) == "Sink: OSError: [Errno 30] Read-only file system"
    unknown = _task_error("Coordinator.serve", KeyError("x"), None)
    assert str(actor_failure(unknown)) == "Coordinator: KeyError: 'x'"
    lost = ray.exceptions.RayActorError(
        SINK_ID, "The actor died.\n\tclass_name: Sink\nThe actor is dead because it was killed."
    )
    assert str(actor_failure(lost)) == "Sink: The actor is dead because it was killed."


def test_an_unreachable_address_is_a_usage_error_within_seconds():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed once the block ends: nobody listens there
    start = time.monotonic()
    with pytest.raises(UsageError, match=f"no Ray at 127.0.0.1:{port}"):
        reachable_address(f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match="no Ray at 192.0.2.1:6379"):  # TEST-NET: never answers
        reachable_address("192.0.2.1:6379")
    assert time.monotonic() - start < 2 * ray_runtime.CONNECT_TIMEOUT_S + 1
    with pytest.raises(UsageError, match="expected auto or HOST:PORT"):
        reachable_address("nowhere")


def test_a_local_ray_starts_through_ray_init_alone(ray_cluster):
    """No part of Ray is replaced: a local Ray starts its processes as Ray does, without
    a dashboard unless asked."""
    from ray._private import ray_constants, worker

    started = worker._global_node.all_processes
    assert ray_constants.PROCESS_TYPE_RAYLET in started
    assert ray_constants.PROCESS_TYPE_GCS_SERVER in started
    assert ray_constants.PROCESS_TYPE_MONITOR in started


def test_quick_connect_settings_last_as_long_as_a_local_rays_start(monkeypatch):
    """They reach the processes a local Ray starts, not the rest of the user's program; a
    setting the user made stays theirs."""
    monkeypatch.delenv("RAY_raylet_client_connect_timeout_milliseconds", raising=False)
    monkeypatch.setenv("RAY_raylet_client_num_connect_attempts", "7")
    with ray_private.quick_connect():
        assert os.environ["RAY_raylet_client_connect_timeout_milliseconds"] == "20"
        assert os.environ["RAY_raylet_client_num_connect_attempts"] == "7"
    assert "RAY_raylet_client_connect_timeout_milliseconds" not in os.environ
    assert os.environ["RAY_raylet_client_num_connect_attempts"] == "7"


def test_auto_without_a_running_ray(monkeypatch):
    from ray._private import services

    def nothing_running(address):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(services, "canonicalize_bootstrap_address", nothing_running)
    with pytest.raises(UsageError, match="--address auto: no running Ray found"):
        reachable_address("auto")


def test_dashboard_refused_without_rays_default_extra(monkeypatch):
    """One line naming the install; the core packages alone pass."""
    from importlib.metadata import PackageNotFoundError

    installed = ray_runtime.version

    def without(name: str) -> str:
        if name.lower() in {"aiohttp", "aiohttp-cors", "aiohttp_cors"}:
            raise PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(ray_runtime, "version", without)
    with pytest.raises(UsageError, match=r"pip install 'ray\[default\]'") as refused:
        ray_runtime.check_dashboard()
    assert "\n" not in str(refused.value)


_DASHBOARD = """
import urllib.error
import urllib.request
from ray._private import worker
from txstream.cluster.ray_runtime import ray_session

with ray_session(log_to_driver=False, dashboard=True):
    url = worker._global_node.webui_url
    try:
        with urllib.request.urlopen(f"http://{url}/api/version", timeout=30) as answer:
            status = answer.status
    except urllib.error.HTTPError as refused:  # Ray's token authentication, when on
        status = refused.code
    assert status in (200, 401), status
print("served")
"""


def test_a_local_ray_with_its_dashboard(python_with_dashboard):
    proc = subprocess.run(
        [python_with_dashboard, "-c", _DASHBOARD], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stderr[-2000:]


def _untested(monkeypatch) -> None:
    """This process takes for an unchecked Ray: every private interface's fallback."""
    monkeypatch.setattr(ray_private, "TESTED", ((0, 0), (0, 1)))
    monkeypatch.setattr(ray_private, "_REPORTED", set())


def test_on_an_unchecked_ray_errors_name_actors_by_class(monkeypatch, caplog):
    _untested(monkeypatch)
    caplog.set_level(logging.WARNING, logger=ray_private.__name__)
    failure = actor_failure(_task_error("Executor.process", ValueError("boom"), EXECUTOR_ID))
    assert str(failure) == "Executor: ValueError: boom"
    lost = ray.exceptions.RayActorError(SINK_ID, "The actor died.")
    assert str(actor_failure(lost)) == "Sink: The actor died."
    assert ray_private.actor_id(object()) is None
    assert ray_private.innermost_actor(lost) is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == ray_private.__name__]
    assert "not one txstream was checked with: errors name actors by class" in line


def test_on_an_unchecked_ray_the_public_ways_are_taken(monkeypatch):
    _untested(monkeypatch)
    assert ray_private.temp_dir_option(Path("/x")) == {}
    assert ray_private.session_folder() is None
    assert ray_private.running_ray() is None
    assert reachable_address("auto") == "auto"  # ray.init finds it
    monkeypatch.delenv("RAY_raylet_client_connect_timeout_milliseconds", raising=False)
    with ray_private.quick_connect():
        assert "RAY_raylet_client_connect_timeout_milliseconds" not in os.environ


_START_UNCHECKED = """
import ray
from txstream.cluster import ray_private
from txstream.cluster.ray_runtime import ray_session, start_actor, stop_actors

ray_private.TESTED = ((0, 0), (0, 1))

class Echo:
    def echo(self, x):
        return x

with ray_session(log_to_driver=False) as started:
    actor = start_actor(Echo)
    assert started and ray.get(actor.echo.remote(7)) == 7
    stop_actors([actor])
assert not ray.is_initialized()
print("started")
"""


def test_a_local_ray_starts_on_an_unchecked_ray(tmp_path):
    """With every private interface's fallback: Ray's own temporary folder (here the
    test's, which Ray takes from ``TMPDIR``), its own retries, actors named by class."""
    folder = Path(tempfile.mkdtemp(prefix="txs-unchecked-"))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _START_UNCHECKED],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "TMPDIR": str(folder)},
        )
        assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr[-2000:]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_executors_against_usable_cores(monkeypatch):
    monkeypatch.setattr(topology, "usable_cores", lambda: 2)
    assert check_executors(2) is None
    assert "3 executors on 2 usable cores: executors share cores" in check_executors(3)
    assert check_executors(8) is not None
    with pytest.raises(UsageError, match="--executors 9 is over 4 times the 2 usable cores"):
        check_executors(9)
