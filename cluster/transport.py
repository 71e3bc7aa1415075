"""Transports: how a team's actors run — as Ray actors, or as threads of this process (the
same classes, wiring and shared memory, without Ray); `transport_for` picks one.

A handle's methods are called as Ray's are, ``handle.method.remote(*args)``, and return a
reference that `get`, `ended` and `wait_all` accept from either transport, so actors that
call each other (the ProgressController calls the executors and the Sink, executors call the
Sink) run unchanged on both. Threads run in parallel where it matters: the kernels release
the GIL.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from txstream.cluster.ray_runtime import (
    Phase,
    describe,
    ray_address,
    ray_session,
    start_actor,
    stop_actors,
)
from txstream.cluster.topology import keep_freed_memory, yield_to_executors
from txstream.errors import PeerFailed, RuntimeFailure, TxstreamError

_POLL_S = 0.001


class RayTransport:
    """Each actor a Ray actor in a process of its own."""

    separate_processes = True

    def session(
        self,
        address: str | None,
        job_config: object | None,
        phase: Phase,
        logging_level: int,
        dashboard: bool = False,
    ) -> AbstractContextManager[bool]:
        """Ray for the run (see `ray_session`)."""
        return ray_session(
            address, job_config, phase=phase, logging_level=logging_level, dashboard=dashboard
        )

    def start(
        self,
        cls: type,
        *args: object,
        label: str | None = None,
        feeder: bool = False,
        name: str | None = None,
        namespace: str | None = None,
        concurrency_groups: dict[str, int] | None = None,
    ) -> Any:
        """``cls(*args)`` as a Ray actor; a ``feeder`` (ProgressController, Sink) runs at a
        lower priority than the executors it feeds (`yield_to_executors`)."""
        actor = start_actor(
            cls,
            *args,
            label=label,
            name=name,
            namespace=namespace,
            concurrency_groups=concurrency_groups,
        )
        # the actor's first call, before any other
        actor.__ray_call__.remote(_prepare_feeder if feeder else _prepare_process)
        return actor

    def stop(self, actors: list) -> None:
        """Kill the actors without waiting for their queued calls."""
        stop_actors(actors)


def _prepare_process(_actor: object) -> None:
    keep_freed_memory()


def _prepare_feeder(_actor: object) -> None:
    keep_freed_memory()
    yield_to_executors()


class ThreadTransport:
    """Each actor an object of this process whose calls run on threads, in order per Ray
    concurrency group as on Ray. Nothing is reniced (that acts on the whole process); an
    executor pins its own thread (`Executor.warm_up`). No Ray is started; a failing call
    fails as a Ray actor's would (see `_Lane`)."""

    separate_processes = False

    def __init__(self) -> None:
        self._lanes: list[_Lane] = []

    @contextmanager
    def session(
        self,
        address: str | None,
        job_config: object | None,
        phase: Phase,
        logging_level: int,
        dashboard: bool = False,
    ) -> Iterator[bool]:
        """Nothing to start but this process's malloc (`keep_freed_memory`); the lanes
        of the actors end with it."""
        keep_freed_memory()
        try:
            yield False
        finally:
            self.stop([])

    def start(
        self,
        cls: type,
        *args: object,
        label: str | None = None,
        concurrency_groups: dict[str, int] | None = None,
        **_placement: object,
    ) -> LocalActor:
        """``cls(*args)`` in this process, its calls on a thread per concurrency group;
        ``label`` (default: the class name) names it in errors, as on Ray."""
        groups = ["", *(concurrency_groups or {})]
        actor = label or cls.__name__
        lanes = {group: _Lane(actor, group) for group in groups}
        self._lanes += lanes.values()
        return LocalActor(cls(*args), lanes)

    def stop(self, actors: list) -> None:
        """End the lanes once their queued calls are done (calls blocked on a team that was
        asked to stop return with it)."""
        for lane in self._lanes:
            lane.close()
        self._lanes = [lane for lane in self._lanes if lane.alive]


class LocalActor:
    """A thread-transport handle: ``actor.method.remote(*args)`` queues the call on the
    method's lane and returns a `Future`."""

    def __init__(self, instance: object, lanes: dict[str, _Lane]):
        self._instance = instance
        self._lanes = lanes

    def __getattr__(self, name: str) -> _LocalMethod:
        method = getattr(self._instance, name)
        group = getattr(method, "__ray_concurrency_group__", "")
        return _LocalMethod(self._lanes[group], method)


class _LocalMethod:
    def __init__(self, lane: _Lane, method: Callable):
        self._lane = lane
        self._method = method

    def remote(self, *args: object, **kwargs: object) -> Future:
        """Queue the call; its future."""
        return self._lane.submit(self._method, args, kwargs)


class _Lane:
    """A daemon thread running calls in the order they were queued; a call's error is
    what a Ray actor's would be (`actor_failure`): txstream's own keep their type, any
    other is a `RuntimeFailure` naming the ``actor``."""

    def __init__(self, actor: str, group: str):
        self._actor = actor
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        name = f"{actor}:{group}" if group else actor
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread still runs (a call blocked past the end of its team)."""
        return self._thread.is_alive()

    def submit(self, method: Callable, args: tuple, kwargs: dict) -> Future:
        """Queue a call; its future."""
        future: Future = Future()
        self._calls.put((future, method, args, kwargs))
        return future

    def close(self) -> None:
        """End the thread after the calls queued so far."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, method, args, kwargs = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(method(*args, **kwargs))
            except RuntimeFailure as exc:
                named = exc.actor is None
                future.set_exception(type(exc)(exc.cause, self._actor) if named else exc)
            except (TxstreamError, KeyboardInterrupt, SystemExit) as exc:  # the caller's
                future.set_exception(exc)
            except BaseException as exc:
                failure = RuntimeFailure(describe(exc), self._actor)
                failure.__cause__ = exc
                future.set_exception(failure)


def transport_for(
    choice: str, address: str | None, named: bool, checkpoints: bool, dashboard: bool = False
) -> RayTransport | ThreadTransport:
    """The transport of a run told ``--transport choice``: ``auto`` is Ray where something
    outside this process must reach the team (a cluster at ``address`` or ``$RAY_ADDRESS``,
    a ``named`` session, Ray's ``dashboard``) or where the run must outlive one of its
    actors (``checkpoints``: a dead actor's team is recovered without the driver); threads
    otherwise (no Ray start-up for a local run)."""
    if choice == "auto":
        ray_needed = ray_address(address) or named or checkpoints or dashboard
        choice = "ray" if ray_needed else "threads"
    return RayTransport() if choice == "ray" else ThreadTransport()


def get(refs: Any, timeout_s: float | None = None) -> Any:
    """The result of a reference or a list of them, from either transport: ``ray.get``'s
    exceptions for Ray's, the call's own for threads'; TimeoutError past ``timeout_s``."""
    if isinstance(refs, list):
        return [get(ref, timeout_s) for ref in refs]
    if isinstance(refs, Future):
        return refs.result(timeout_s)
    import ray

    return ray.get(refs, timeout=timeout_s)


def ended(refs: list, timeout_s: float = 0.0) -> list:
    """Some of ``refs`` that have ended — at least one if any ends within ``timeout_s`` —
    or none."""
    if not any(isinstance(ref, Future) for ref in refs):
        import ray

        return ray.wait(refs, num_returns=1, timeout=timeout_s)[0] if refs else []
    remote = [ref for ref in refs if not isinstance(ref, Future)]
    if not remote:  # threads only: sleep until one ends, no polling
        done, _ = futures_wait(refs, timeout_s, return_when=FIRST_COMPLETED)
        return [ref for ref in refs if ref in done]
    deadline = time.monotonic() + timeout_s
    while True:
        done = [ref for ref in refs if isinstance(ref, Future) and ref.done()]
        if remote:
            import ray

            done += ray.wait(remote, num_returns=1, timeout=0)[0]
        if done or time.monotonic() >= deadline:
            return done
        time.sleep(_POLL_S)


def wait_all(calls: list, timeout_s: float) -> list:
    """The results of ``calls``, each awaited as it ends; the first failure that is a
    root cause is raised at once (a dead actor leaves its peers waiting for it: do not
    wait for them), a peer's `PeerFailed` (raised once it learns of another's failure)
    only if nothing else failed. TimeoutError if nothing ends for ``timeout_s``."""
    pending, results, peer_failed = list(calls), {}, None
    while pending:
        done = ended(pending, timeout_s)
        if not done:
            raise TimeoutError(f"a call took over {timeout_s} s")
        for call in done:
            pending.remove(call)
            try:
                results[id(call)] = get(call)
            except BaseException as exc:
                if not _peer_failed(exc):
                    raise
                peer_failed = exc
    if peer_failed is not None:
        raise peer_failed
    return [results[id(call)] for call in calls]


def _peer_failed(exc: BaseException) -> bool:
    if isinstance(exc, PeerFailed):
        return True
    return isinstance(getattr(exc, "cause", None), PeerFailed)  # a RayTaskError's
