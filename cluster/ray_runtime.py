"""Starting or attaching to Ray, starting txstream's actors on it, and saying which one failed.

A local Ray that txstream starts gets a private temporary folder for its session (logs,
sockets, spilled objects), removed at shutdown whatever the outcome; its workers' output is
forwarded to this process's stderr, which a run sends to its log (`txstream.monitor.logs`). An
address is first checked reachable (its GCS port, within seconds): `ray.init` would retry
for minutes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path

from txstream.cluster.scratch import scratch, sweep_abandoned_rays, written_whole
from txstream.cluster.topology import usable_cores
from txstream.cluster.watch import watch_cluster
from txstream.errors import ActorDied, RuntimeFailure, TxstreamError, UsageError

OBJECT_STORE_BYTES = 2 * 1024**3
"""A local Ray's object store, at most 30% of the memory (Ray's own default share): a
Spark source keeps its chunks there until it closes, and a few hundred MiB would spill the
chunks of a 4M-event run to disk; larger inputs spill past 2 GiB, so memory stays bounded."""
CONNECT_TIMEOUT_S = 3.0
"""How long the GCS of a cluster given by address may take to accept a connection."""

Phase = Callable[[str], AbstractContextManager]
"""Reports a named phase for as long as its ``with`` block runs (the console's phases)."""

_LABELS: dict[str, str] = {}
"""Name of each actor txstream started (``"Executor 1"``), by actor id, for error messages."""


def ray_address(address: str | None) -> str | None:
    """The Ray a run is told to use: ``address``, else ``$RAY_ADDRESS``; None when it
    starts a Ray of its own."""
    return address or os.environ.get("RAY_ADDRESS") or None


@contextmanager
def ray_session(
    address: str | None = None,
    job_config: object | None = None,
    *,
    phase: Phase | None = None,
    logging_level: int = logging.WARNING,
    log_to_driver: bool = True,
) -> Iterator[bool]:
    """A Ray session for one run: reuse an initialised one, attach to ``address`` (or
    ``$RAY_ADDRESS``), or start a lean local Ray. Yields whether this call started or
    attached it; shuts it down (and removes a local Ray's folder) only then. ``phase``
    reports starting, connecting and stopping; ``log_to_driver``: the workers' output
    comes to this process's stdout and stderr (a run sends them to its log)."""
    import ray

    if ray.is_initialized():
        yield False
        return
    phase = phase or (lambda _name: nullcontext())
    address = ray_address(address)
    options = dict(
        include_dashboard=False,
        logging_level=logging_level,
        log_to_driver=log_to_driver,
        configure_logging=True,
        job_config=job_config,
    )
    with ExitStack() as stack:
        if address:
            gcs = reachable_address(address)
            with phase(f"connecting to Ray at {address}"):
                stack.callback(_shutdown, phase, "disconnecting from Ray")
                _init(address=gcs, **options)
            stack.enter_context(watch_cluster(_gcs_address(), f"the Ray cluster at {address}"))
        else:
            sweep_abandoned_rays()
            folder = stack.enter_context(scratch("ray"))
            with (
                phase("starting Ray"),
                _lean_head(),
                _lean_worker_setup(),
                _registration_polled(),
                _environment(QUICK_CONNECT),
            ):
                stack.callback(_shutdown, phase, "stopping Ray")
                _init(
                    address="local",  # a Ray of its own, even if another one runs here
                    num_cpus=usable_cores(),
                    object_store_memory=_object_store_bytes(),
                    _temp_dir=str(folder),
                    **options,
                )
                if job_config is not None and job_config.jvm_options:  # Java workers to come
                    java_library_placed(Path(_session_folder()))
            stack.enter_context(watch_cluster(_gcs_address(), "this run's local Ray"))
        yield True


def _object_store_bytes() -> int:
    """`OBJECT_STORE_BYTES`, or Ray's default share of the memory (30%) when that is smaller:
    the memory as Ray reads it, a container's limit included."""
    from ray._private import ray_constants
    from ray._private.utils import get_system_memory

    share = ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION * get_system_memory()
    return min(OBJECT_STORE_BYTES, int(share))


def _init(**options: object) -> None:
    """``ray.init``, keeping this process's SIGTERM handler: Ray replaces it with one that
    exits at once, where the command's own stops what the run started first."""
    import ray

    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**options)
    except ConnectionError as exc:
        raise UsageError(f"cannot connect to Ray: {_first_line(str(exc))}") from exc
    finally:
        if sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)


QUICK_CONNECT = {
    "RAY_raylet_client_connect_timeout_milliseconds": "20",
    "RAY_raylet_client_num_connect_attempts": "500",
    "RAY_grpc_client_check_connection_status_interval_milliseconds": "20",
}
"""A local Ray's processes retry connecting to a socket not yet listening every 20 ms (for
10 s, as Ray's default 10 tries a second apart): the raylet connects to its own object
store as the store's thread starts, and when it comes first it would wait a whole second;
and a gRPC call that found its server's channel not yet ready is sent again after 20 ms
instead of a second: a Java worker's first calls (for the system config to its raylet,
then to the GCS) can find it so, and a stall there puts RayDP's app master's address, or
Spark's executor, a second late. In the environment while Ray starts, not in its system
config: every process of it, workers included, reads them as it starts, before its first
connection (a worker gets the system config only once connected to the raylet). The second a
Java worker can still lose at that first call is gRPC's own
(`worker_setup.JAVA_ENVIRONMENT`)."""


@contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` in this process's environment (those the user set stay as set), for
    the processes started meanwhile; the environment as it was afterwards."""
    added = {k: v for k, v in variables.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextmanager
def _lean_head() -> Iterator[None]:
    """While ``ray.init`` starts a local Ray, its head starts neither the autoscaler
    monitor nor the API server (the dashboard's head, which ``include_dashboard=False``
    only makes minimal). A local Ray has nothing to scale, and txstream uses neither job
    submission nor the state API; the API server is on the start's path (``ray.init``
    waits until it has published its address) and the two cost about a CPU-second of a
    start that keeps both cores busy. ``ray start --head
    --no-monitor`` is Ray's own switch for the first; ``ray.init`` has none."""
    from ray._private.node import Node

    start_monitor, start_api_server = Node.start_monitor, Node.start_api_server
    Node.start_monitor = lambda self: None
    Node.start_api_server = lambda self, **_options: None
    try:
        yield
    finally:
        Node.start_monitor, Node.start_api_server = start_monitor, start_api_server


@contextmanager
def _lean_worker_setup() -> Iterator[None]:
    """While ``ray.init`` starts a local Ray, its raylet is given `txstream.cluster.
    worker_setup` to start its workers through instead of Ray's own setup script, which
    imports Ray first: ~0.5 s before each Java worker's JVM starts (RayDP's app master,
    then Spark's executor, one after the other on the way to Spark's first event), and
    ~0.5 CPU-s for every Python worker, two of which start with Ray."""
    import inspect

    from ray._private import services
    from txstream.cluster import worker_setup

    start_raylet = services.start_raylet
    signature = inspect.signature(start_raylet)

    def lean_setup(*args: object, **kwargs: object) -> object:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["setup_worker_path"] = worker_setup.__file__
        return start_raylet(*bound.args, **bound.kwargs)

    services.start_raylet = lean_setup
    try:
        yield
    finally:
        services.start_raylet = start_raylet


REGISTRATION_POLL_S = 0.02
"""How often a starting local Ray's GCS is asked whether its raylet has registered."""


@contextmanager
def _registration_polled() -> Iterator[None]:
    """While ``ray.init`` starts a local Ray, its wait for the raylet to register asks the
    GCS every `REGISTRATION_POLL_S`: Ray 2.60 asks once a second
    (``GlobalStateAccessor::GetNode`` sleeps a whole second between tries), so a raylet
    that registered just after a try would be seen up to a second late, and the start with
    it. Ray's own wait then finds the node at its first try."""
    from ray._private import services
    from ray._private.state import GlobalState

    get_node = services.get_node

    def registered_first(gcs_address: str, node_id: str) -> dict:
        state = GlobalState()
        try:
            state._initialize_global_state(services._get_gcs_client_options(gcs_address))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                node["NodeID"] == node_id and node["Alive"] for node in state.node_table()
            ):
                time.sleep(REGISTRATION_POLL_S)
        except Exception:  # whatever went wrong: Ray's own wait, and its error
            logging.getLogger(__name__).debug("polling the raylet's registration failed")
        finally:
            state.disconnect()
        return get_node(gcs_address, node_id)

    services.get_node = registered_first
    try:
        yield
    finally:
        services.get_node = get_node


INSTALLATION_FILES = Path(sys.prefix) / "share" / "txstream"
"""What txstream makes once per installation, in its prefix (the virtualenv): Spark's class
archive and converter jar (``./setup``), Ray's native library for Java (the first run)."""
JAVA_LIBRARY = "native/linux/libcore_worker_library_java.so"
"""Ray's native library for its Java workers, in Ray's jar."""


def java_library_placed(
    session: Path, jar: Path | None = None, kept: Path = INSTALLATION_FILES
) -> None:
    """Link Ray's native library for Java into the ``session`` folder, where Ray's Java
    workers load it from: the first of them (RayDP's app master, on the way to Spark's
    first event) would otherwise extract it from Ray's jar, tens of MB inflated on the way.
    It is extracted once, into ``kept``, under a name that carries the jar's size and time;
    with no such entry in the jar, or nowhere to keep it, Ray extracts it itself. ``jar``:
    Ray's own by default."""
    if not sys.platform.startswith("linux"):
        return
    import ray

    jar = jar or Path(ray.__file__).parent / "jars" / "ray_dist.jar"
    try:
        stat = jar.stat()
        library = kept / f"ray-java-{stat.st_size}-{int(stat.st_mtime)}.so"
        if not library.is_file():
            _extract(jar, library)
        target = session / Path(JAVA_LIBRARY).name
        if not target.exists():
            target.symlink_to(library)
    except (OSError, KeyError, zipfile.BadZipFile):  # Ray's own extraction then
        logging.getLogger(__name__).debug("Ray's Java library not placed", exc_info=True)


def _extract(jar: Path, library: Path) -> None:
    """The jar's `JAVA_LIBRARY` written to ``library`` (whole or not at all), in place of
    those extracted from other jars."""
    library.parent.mkdir(parents=True, exist_ok=True)
    for stale in library.parent.glob("ray-java-*.so"):
        if stale != library:  # another run may have just made this one
            stale.unlink(missing_ok=True)
    with written_whole(library) as partial:
        with zipfile.ZipFile(jar) as archive, archive.open(JAVA_LIBRARY) as src:
            with open(partial, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)


def _session_folder() -> str:
    """The session folder of the local Ray this process started."""
    import ray

    return ray._private.worker._global_node.get_session_dir_path()


def _gcs_address() -> str:
    """``host:port`` of the GCS of the Ray this process is connected to."""
    import ray

    return ray.get_runtime_context().gcs_address


def _shutdown(phase: Phase, name: str) -> None:
    import ray

    if ray.is_initialized():
        with phase(name):
            ray.shutdown()


def reachable_address(address: str) -> str:
    """The ``host:port`` of ``address`` (``auto``: the Ray running here), once its GCS
    port accepts a connection; a `UsageError` within seconds otherwise."""
    target = address
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            target = canonicalize_bootstrap_address("auto")
        except ConnectionError as exc:
            raise UsageError(
                "--address auto: no running Ray found here (start one with `ray start "
                "--head`, or leave --address out for a local Ray)"
            ) from exc
    host, _, port = target.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address}: expected auto or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--address {address}: no Ray at {host}:{port} ({reason})") from exc
    return target


def start_actor(
    cls: type,
    *args: object,
    label: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    concurrency_groups: dict[str, int] | None = None,
    node_id: str | None = None,
    **kwargs: object,
) -> object:
    """Start ``cls`` (a plain class) as a Ray actor, known as ``label`` (default: the
    class name) in error messages, named if ``name`` (in ``namespace``), with
    ``concurrency_groups`` if it serves calls on several threads, on the Ray node
    ``node_id`` if given (else where Ray places it). txstream's actors reserve no Ray
    CPU: executors pin themselves to cores, the others mostly wait."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    groups = {"concurrency_groups": concurrency_groups} if concurrency_groups else {}
    options: dict[str, object] = {"name": name, "namespace": namespace} if name else {}
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    actor = ray.remote(num_cpus=0, max_restarts=0, **groups)(cls).options(**options)
    actor = actor.remote(*args, **kwargs)
    _LABELS[actor._actor_id.hex()] = label or cls.__name__
    return actor


def stop_actors(actors: list) -> None:
    """Kill actors without waiting for queued calls (used on success and on failure)."""
    import ray

    for actor in actors:
        _LABELS.pop(actor._actor_id.hex(), None)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead or Ray gone: nothing left to stop
            pass


def actor_failure(exc: BaseException) -> TxstreamError:
    """What to raise for a Ray error: one line naming the actor and the cause.

    An error raised inside an actor call that itself waited on another actor is the
    innermost one (an executor's, not the ProgressController's that waited on it).
    txstream's own errors keep their type (a `RuntimeFailure` gains the actor's name); the
    death of an actor's process is `ActorDied`.
    """
    import ray

    while isinstance(exc, ray.exceptions.RayTaskError) and isinstance(
        exc.cause, ray.exceptions.RayError
    ):
        exc = exc.cause
    actor = _actor_label(exc)
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        if isinstance(cause, RuntimeFailure) and cause.actor is None:
            return type(cause)(cause.cause, actor)
        if isinstance(cause, TxstreamError):
            return cause
        return RuntimeFailure(describe(cause), actor)
    if isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.WorkerCrashedError):
        return ActorDied(_death(exc), actor)
    return RuntimeFailure(describe(exc), actor or "Ray")


def _actor_label(exc: BaseException) -> str | None:
    """The txstream name of the actor an error comes from, else its class name.

    An error raised by an actor call that waited on another actor carries the other's
    error only as text: its innermost header reads ``ray::Executor.process() (pid=...,
    actor_id=<hex>, repr=...)``.
    """
    headers = [line for line in str(exc).splitlines() if "ray::" in line]
    innermost = headers[-1] if headers else ""
    found = re.search(r"actor_id=([0-9a-f]+)", innermost)
    actor_id = found[1] if found else None
    if len(headers) <= 1 and actor_id is None:
        actor_id = getattr(exc, "_actor_id", None) or getattr(exc, "actor_id", None)
    if actor_id in _LABELS:
        return _LABELS[actor_id]
    found = re.search(r"ray::(\w+)\.|class_name: (\w+)", innermost or str(exc))
    return (found[1] or found[2]) if found else None


def _death(exc: BaseException) -> str:
    """Why an actor died: the error its creation raised, or Ray's reason."""
    text = str(exc)
    if getattr(exc, "actor_init_failed", False):
        return _last_line(text)
    reasons = [line.strip() for line in text.splitlines() if "The actor is dead because" in line]
    return reasons[0] if reasons else _first_line(text)


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line."""
    message = _first_line(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:500] if lines else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""
