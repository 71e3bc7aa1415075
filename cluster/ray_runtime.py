"""Starting or attaching to Ray, and starting txstream's actors on it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

OBJECT_STORE_BYTES = 512 * 1024**2


@contextmanager
def ray_session(address: str | None = None, job_config: object | None = None) -> Iterator[bool]:
    """A Ray session for one run: reuse an initialised one, attach to ``address``, or
    start a lean local Ray. Yields whether this call started it; shuts down only then."""
    import ray

    if ray.is_initialized():
        yield False
        return
    options = dict(
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        configure_logging=True,
        job_config=job_config,
    )
    if address:
        ray.init(address=address, **options)
    else:
        ray.init(
            num_cpus=os.cpu_count() or 1,
            object_store_memory=OBJECT_STORE_BYTES,
            **options,
        )
    try:
        yield True
    finally:
        ray.shutdown()


def start_actor(
    cls: type,
    *args: object,
    name: str | None = None,
    namespace: str | None = None,
    concurrency_groups: dict[str, int] | None = None,
    **kwargs: object,
) -> object:
    """Start ``cls`` (a plain class) as a Ray actor, named if ``name`` (in ``namespace``),
    with ``concurrency_groups`` if it serves calls on several threads. txstream's actors
    reserve no Ray CPU: executors pin themselves to cores, the others mostly wait."""
    import ray

    groups = {"concurrency_groups": concurrency_groups} if concurrency_groups else {}
    actor = ray.remote(num_cpus=0, max_restarts=0, **groups)(cls)
    options = {"name": name, "namespace": namespace} if name else {}
    return actor.options(**options).remote(*args, **kwargs)


def stop_actors(actors: list) -> None:
    """Kill actors without waiting for queued calls (used on success and on failure)."""
    import ray

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead or Ray gone: nothing left to stop
            pass


def wait_all(calls: list, timeout_s: float) -> list:
    """The results of ``calls``, each awaited as it ends; the first failure that is a
    root cause is raised at once (a dead actor leaves its peers waiting for it: do not
    wait for them), a peer's `PeerFailed` (raised once it learns of another's failure)
    only if nothing else failed. GetTimeoutError if one takes over ``timeout_s``."""
    import ray
    from txstream.errors import PeerFailed

    pending, results, peer_failed = list(calls), {}, None
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not ready:
            raise ray.exceptions.GetTimeoutError(f"a call took over {timeout_s} s")
        try:
            results[ready[0]] = ray.get(ready[0])
        except ray.exceptions.RayTaskError as exc:
            if not isinstance(exc.cause, PeerFailed):
                raise exc from None
            peer_failed = exc
    if peer_failed is not None:
        raise peer_failed
    return [results[call] for call in calls]
