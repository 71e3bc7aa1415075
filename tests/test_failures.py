"""Clear failures: one line naming the actor and the cause; an unreachable address is a
usage error within seconds; executors against usable cores."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import ray
from ray.exceptions import ActorDiedError, RayTaskError
from txstream.cluster import ray_runtime, topology
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


def test_a_local_ray_starts_without_a_monitor_or_an_api_server(ray_cluster):
    """Neither has work in a local Ray of txstream's; its head starts the rest as usual,
    and Ray's own methods are back in place once it has started."""
    from ray._private import ray_constants, worker
    from ray._private.node import Node

    started = worker._global_node.all_processes
    assert ray_constants.PROCESS_TYPE_RAYLET in started
    assert ray_constants.PROCESS_TYPE_GCS_SERVER in started
    assert ray_constants.PROCESS_TYPE_MONITOR not in started
    assert ray_constants.PROCESS_TYPE_DASHBOARD not in started
    assert Node.start_monitor.__qualname__ == "Node.start_monitor"
    assert Node.start_api_server.__qualname__ == "Node.start_api_server"


_START_WITH_BROKEN_POLL = """
import ray
from ray._private import services, state
from txstream.cluster.ray_runtime import ray_session

def broken(self):
    raise RuntimeError("no node table")

state.GlobalState.node_table = broken
get_node = services.get_node
with ray_session(log_to_driver=False) as started:
    assert started and ray.cluster_resources()["CPU"] >= 1
assert services.get_node is get_node and not ray.is_initialized()
print("started")
"""


def test_a_local_ray_starts_when_polling_its_registration_fails():
    """The raylet's registration is polled only to see it sooner: if polling fails, Ray's
    own wait still starts Ray, and Ray's function is back in place afterwards."""
    proc = subprocess.run(
        [sys.executable, "-c", _START_WITH_BROKEN_POLL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr[-2000:]


def test_quick_connect_settings_last_as_long_as_a_local_rays_start(monkeypatch):
    """They reach the processes a local Ray starts, not the rest of the user's program; a
    setting the user made stays theirs."""
    monkeypatch.delenv("RAY_raylet_client_connect_timeout_milliseconds", raising=False)
    monkeypatch.setenv("RAY_raylet_client_num_connect_attempts", "7")
    with ray_runtime._environment(ray_runtime.QUICK_CONNECT):
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


def test_executors_against_usable_cores(monkeypatch):
    monkeypatch.setattr(topology, "usable_cores", lambda: 2)
    assert check_executors(2) is None
    assert "3 executors on 2 usable cores: executors share cores" in check_executors(3)
    assert check_executors(8) is not None
    with pytest.raises(UsageError, match="--executors 9 is over 4 times the 2 usable cores"):
        check_executors(9)
