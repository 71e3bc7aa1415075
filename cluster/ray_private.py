"""Ray's private interfaces that txstream uses, each for a gain the public API does not give.

Each is checked against the installed Ray when used (`tested`): on a Ray these were not
checked against, the public way is taken instead, and one log line says so. docs/design.md
("Private interfaces") lists them with their gains and fallbacks.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from txstream.cluster.scratch import written_whole

TESTED = ((2, 60), (2, 61))
"""Ray versions whose internals this module was checked against: 2.60 up to, not
including, 2.61."""

_LOG = logging.getLogger(__name__)
_REPORTED: set[str] = set()
"""The interfaces whose fallback has been logged (once per process each)."""


def tested(what: str) -> bool:
    """Whether the installed Ray is one this module was checked against; if not, one log
    line (once per ``what``) saying that ``what`` takes the public way."""
    import ray

    parts = re.match(r"(\d+)\.(\d+)", ray.__version__)
    version = (int(parts[1]), int(parts[2])) if parts else (0, 0)
    if TESTED[0] <= version < TESTED[1]:
        return True
    if what not in _REPORTED:
        _REPORTED.add(what)
        _LOG.warning("Ray %s is not one txstream was checked with: %s", ray.__version__, what)
    return False


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
Spark's executor, a second late. Ray reads its settings from ``RAY_<name>`` in every
process it starts, workers included, before their first connection (a worker gets the
system config only once connected to the raylet)."""


@contextmanager
def quick_connect() -> Iterator[None]:
    """`QUICK_CONNECT` in this process's environment while a local Ray starts (those the
    user set stay as set), for the processes started meanwhile; Ray's own timings on an
    unchecked Ray."""
    with environment(QUICK_CONNECT if tested("Ray's own connection retries") else {}):
        yield


@contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` in this process's environment (those the user set stay as set), for
    the processes started meanwhile; the environment as it was afterwards."""
    added = {k: v for k, v in variables.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def temp_dir_option(folder: Path) -> dict[str, str]:
    """``ray.init``'s option that puts a local Ray's session in ``folder`` (private, so
    removed whole at the end: Ray leaves ~50 MB per session in its temporary folder); on an
    unchecked Ray, none: Ray's own temporary folder."""
    if tested("a local Ray's session in Ray's own temporary folder"):
        return {"_temp_dir": str(folder)}
    return {}


def session_folder() -> Path | None:
    """The session folder of the local Ray this process started; None on an unchecked Ray."""
    import ray

    if not tested("Ray's Java library extracted by Ray"):
        return None
    node = getattr(ray._private.worker, "_global_node", None)
    return Path(node.get_session_dir_path()) if node is not None else None


JAVA_LIBRARY = "native/linux/libcore_worker_library_java.so"
"""Ray's native library for its Java workers, in Ray's jar."""


def java_library_placed(session: Path, jar: Path | None, kept: Path) -> None:
    """Link Ray's native library for Java into the ``session`` folder, where Ray's Java
    workers load it from: the first of them (RayDP's app master, on the way to Spark's
    first event) would otherwise extract it from Ray's jar, tens of MB inflated on the way.
    It is extracted once, into ``kept``, under a name that carries the jar's size and time;
    with no such entry in the jar, or nowhere to keep it, Ray extracts it itself. ``jar``:
    Ray's own if None."""
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
        _LOG.debug("Ray's Java library not placed", exc_info=True)


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


def running_ray() -> str | None:
    """``host:port`` of the Ray started here with ``ray start`` (what ``--address auto``
    names), so that it is checked reachable within seconds; ConnectionError if none runs;
    None on an unchecked Ray (``ray.init`` then finds it itself)."""
    if not tested("--address auto not checked reachable"):
        return None
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address("auto")


def actor_id(actor: object) -> str | None:
    """The hex id of an actor handle, which Ray's errors name; None on an unchecked Ray."""
    if not tested("errors name actors by class"):
        return None
    found = getattr(actor, "_actor_id", None)
    return found.hex() if found is not None else None


def innermost_actor(exc: BaseException) -> tuple[str | None, str | None] | None:
    """The id and class name of the actor whose call raised ``exc`` first, read from Ray's
    error text; None on an unchecked Ray.

    An error raised by an actor call that waited on another actor carries the other's
    error only as text: its innermost header reads ``ray::Executor.process() (pid=...,
    actor_id=<hex>, repr=...)``.
    """
    if not tested("errors name actors by class"):
        return None
    text = str(exc)
    headers = [line for line in text.splitlines() if "ray::" in line]
    innermost = headers[-1] if headers else ""
    found = re.search(r"actor_id=([0-9a-f]+)", innermost)
    named = re.search(r"ray::(\w+)\.|class_name: (\w+)", innermost or text)
    nested = len(headers) > 1
    return (
        found[1] if found else (None if nested else getattr(exc, "actor_id", None)),
        (named[1] or named[2]) if named else None,
    )


def job_jvm_options() -> list[str] | None:
    """The JVM options of this driver's Ray job (its ``JobConfig``); None on an unchecked
    Ray or a Ray client (Ray publishes no accessor for them)."""
    if not tested("RayDP's app master started by RayDP"):
        return None
    import ray

    try:
        config = ray._private.worker.global_worker.core_worker.get_job_config()
    except Exception:  # a Ray client, or no job yet
        return None
    return list(config.jvm_options)


@contextmanager
def java_calls() -> Iterator[None]:
    """Ray's Python refuses calls to Java unless the driver loads its code from local
    modules (a job with a code search path), a flag it checks only when it formats such a
    call's arguments; set for the calls within only, as this driver's Python functions are
    exported to the workers otherwise. Only after `job_jvm_options` found a checked Ray."""
    import ray

    worker = ray._private.worker.global_worker
    before = worker.load_code_from_local
    worker.set_load_code_from_local(True)
    try:
        yield
    finally:
        worker.set_load_code_from_local(before)


def java_actor_class(class_name: str, constructor: str) -> object:
    """The Java actor class ``class_name``, made by its constructor of JNI signature
    ``constructor``: Ray's public `ray.cross_language.java_actor_class` names none, which
    Ray's Java refuses for a class with overloaded constructors (RayDP's app master has
    three). Only after `job_jvm_options` found a checked Ray."""
    from ray import Language
    from ray._raylet import JavaFunctionDescriptor
    from ray.actor import ActorClass

    descriptor = JavaFunctionDescriptor(class_name, "<init>", constructor)
    return ActorClass._ray_from_function_descriptor(Language.JAVA, descriptor, {})
