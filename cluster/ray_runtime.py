"""Starting or attaching to Ray, starting txstream's actors on it, and saying which one failed.

A local Ray that txstream starts is started by ``ray.init``'s options alone, its dashboard
only when asked; what it still uses of Ray's internals is in `txstream.cluster.ray_private`.
It gets a private temporary folder for its session (logs, sockets, spilled objects),
removed at shutdown whatever the outcome; its workers' output is
forwarded to this process's stderr, which a run sends to its log (`txstream.monitor.logs`). An
address is first checked reachable (its GCS port, within seconds): `ray.init` would retry
for minutes.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from txstream.cluster import ray_private
from txstream.cluster.scratch import scratch, sweep_abandoned_rays
from txstream.cluster.topology import memory_bytes, usable_cores
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
    starts a Ray of its own. A Ray Client address is refused (`refuse_ray_client`)."""
    found = address or os.environ.get("RAY_ADDRESS") or None
    if found is not None:
        refuse_ray_client(found)
    return found


def refuse_ray_client(address: str) -> None:
    """`UsageError` for a Ray Client address (``ray://``): the driver shares files with the
    actors it starts (the input it names, the outputs they commit), which a client off the
    cluster cannot, and plain ``ray`` has no Ray Client."""
    if address.startswith("ray://"):
        raise UsageError(
            f"--address {address}: Ray Client is not supported; run txstream on a node of "
            "the cluster, with --address HOST:PORT of its GCS (or auto)"
        )


@contextmanager
def ray_session(
    address: str | None = None,
    job_config: object | None = None,
    *,
    phase: Phase | None = None,
    logging_level: int = logging.WARNING,
    log_to_driver: bool = True,
    dashboard: bool = False,
) -> Iterator[bool]:
    """A Ray session for one run: reuse an initialised one, attach to ``address`` (or
    ``$RAY_ADDRESS``), or start a local Ray, with Ray's ``dashboard`` if asked
    (`check_dashboard`). Yields whether this call started or attached it; shuts it down
    (and removes a local Ray's folder) only then. ``phase`` reports starting, connecting
    and stopping; ``log_to_driver``: the workers' output comes to this process's stdout
    and stderr (a run sends them to its log)."""
    import ray

    if ray.is_initialized():
        yield False
        return
    phase = phase or (lambda _name: nullcontext())
    address = ray_address(address)
    options = dict(
        logging_level=logging_level,
        log_to_driver=log_to_driver,
        configure_logging=True,
        job_config=job_config,
    )
    gone = threading.Event()
    with ExitStack() as stack:
        if address:
            gcs = reachable_address(address)
            with phase(f"connecting to Ray at {address}"):
                stack.callback(_shutdown, phase, "disconnecting from Ray", gone)
                _init(address=gcs, **options)
            stack.enter_context(
                watch_cluster(_gcs_address(), f"the Ray cluster at {address}", gone)
            )
        else:
            if dashboard:
                check_dashboard()
            sweep_abandoned_rays()
            folder = stack.enter_context(scratch("ray"))
            with phase("starting Ray"), ray_private.quick_connect():
                stack.callback(_shutdown, phase, "stopping Ray", gone)
                _init(
                    address="local",  # a Ray of its own, even if another one runs here
                    num_cpus=usable_cores(),
                    object_store_memory=_object_store_bytes(),
                    include_dashboard=dashboard,
                    **ray_private.temp_dir_option(folder),
                    **options,
                )
                session = ray_private.session_folder()
                if session and job_config is not None and job_config.jvm_options:
                    ray_private.java_library_placed(session, None, INSTALLATION_FILES)
            stack.enter_context(watch_cluster(_gcs_address(), "this run's local Ray", gone))
        yield True


OBJECT_STORE_SHARE = 0.3
"""Ray's default share of the memory for a local Ray's object store."""


def _object_store_bytes() -> int:
    """`OBJECT_STORE_BYTES`, or Ray's default share of the memory when that is smaller (a
    container's limit included)."""
    return min(OBJECT_STORE_BYTES, int(OBJECT_STORE_SHARE * memory_bytes()))


DASHBOARD_EXTRA = "default"
"""The extra of Ray's package that brings what its dashboard needs."""


def check_dashboard() -> None:
    """`UsageError` unless the packages of Ray's ``default`` extra are installed: without
    them ``ray.init(include_dashboard=True)`` fails only after starting Ray."""
    extra = f'extra == "{DASHBOARD_EXTRA}"'
    for line in requires("ray") or []:
        name = re.match(r"[A-Za-z0-9._-]+", line)
        if name is None or extra not in line:
            continue
        try:
            version(name[0])
        except PackageNotFoundError:
            raise UsageError(
                f"--dashboard needs Ray's dashboard ({name[0]} is missing): "
                f"pip install 'ray[{DASHBOARD_EXTRA}]'"
            ) from None


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


INSTALLATION_FILES = Path(sys.prefix) / "share" / "txstream"
"""What txstream makes once per installation, in its prefix (the virtualenv): Spark's class
archive and converter jar (``./setup``), Ray's native library for Java (the first run)."""


def _gcs_address() -> str:
    """``host:port`` of the GCS of the Ray this process is connected to."""
    import ray

    return ray.get_runtime_context().gcs_address


GONE_SHUTDOWN_S = 10.0
"""How long ``ray.shutdown`` may take once the cluster is gone. It then waits on the dead
GCS: normally 5 s, for its task events, but at times past the minute after which Ray's
client ends the process itself, before the run has said why it failed."""


def _shutdown(phase: Phase, name: str, gone: threading.Event) -> None:
    """``ray.shutdown``; once the cluster is ``gone``, for at most `GONE_SHUTDOWN_S`, after
    which the process leaves Ray's client as it is and does not run it again at exit."""
    import ray

    if not ray.is_initialized():
        return
    with phase(name):
        if not gone.is_set():
            ray.shutdown()
            return
        shutdown = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
        shutdown.start()
        shutdown.join(GONE_SHUTDOWN_S)
        if shutdown.is_alive():
            atexit.unregister(ray.shutdown)
            logging.getLogger(__name__).warning(
                "Ray's client did not shut down within %g s of its cluster's loss; left as is",
                GONE_SHUTDOWN_S,
            )


def reachable_address(address: str) -> str:
    """The ``host:port`` of ``address`` (``auto``: the Ray running here), once its GCS
    port accepts a connection; a `UsageError` within seconds otherwise, and at once for a
    Ray Client address (`refuse_ray_client`)."""
    refuse_ray_client(address)
    target = address
    if address == "auto":
        try:
            target = ray_private.running_ray()
        except ConnectionError as exc:
            raise UsageError(
                "--address auto: no running Ray found here (start one with `ray start "
                "--head`, or leave --address out for a local Ray)"
            ) from exc
        if target is None:  # ray.init looks for it
            return address
    host, _, port = target.rpartition(":")
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
    known_as = ray_private.actor_id(actor)
    if known_as is not None:
        _LABELS[known_as] = label or cls.__name__
    return actor


def stop_actors(actors: list) -> None:
    """Kill actors without waiting for queued calls (used on success and on failure)."""
    import ray

    for actor in actors:
        _LABELS.pop(ray_private.actor_id(actor), None)
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
    """The txstream name of the actor an error comes from, else its class name: from Ray's
    error text (`ray_private.innermost_actor`), else from the error's attributes (a dead
    actor's id, the called method's class)."""
    import ray

    found = ray_private.innermost_actor(exc)
    if found is None:
        method = exc.function_name if isinstance(exc, ray.exceptions.RayTaskError) else ""
        found = getattr(exc, "actor_id", None), method.partition(".")[0] or None
    actor_id, class_name = found
    return _LABELS.get(actor_id, class_name) if actor_id else class_name


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
