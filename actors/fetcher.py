"""The Spark partition fetcher: hands a Spark source's converted partitions to its reader.

Spark (through RayDP) converts a DataFrame's partitions to Arrow on its executors; this
actor tells a reader where each partition is as soon as Spark has it, so reading overlaps
the conversion job (`txstream.connectors.spark` starts it with the Spark application).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import ray
from txstream.errors import RuntimeFailure

POLL_S = 0.01
"""How often a fetch asks Spark where a partition is while the conversion job runs."""


@dataclass(frozen=True)
class Staging:
    """Where the converted Arrow partitions go: plain values, so the fetcher pickles."""

    rdd_id: int
    num_partitions: int
    schema_json: str
    agent_url: str  # RayDP's driver agent, which recomputes a lost block; "" if none
    executor: str  # any Spark executor: it tells where each partition is


@dataclass
class _Conversion:
    """The fetcher's view of one source's conversion job."""

    staging: Staging
    locations: list[str | None]
    done: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None


@ray.remote(num_cpus=0, max_concurrency=64)
class PartitionFetcher:
    """Hands out converted partitions as soon as Spark has them, many calls at a time.

    One per Spark application, started with it, so no source waits for a Ray worker to
    start. Cross-language calls need `load_code_from_local`, which stays set in the calling
    process and changes how it loads any actor class Ray later starts there; an actor's
    process dies with it instead of going back to Ray's worker pool. A partition's Arrow
    bytes go from the Spark executor to the consumer through the object store, never
    through this actor.
    """

    def __init__(self) -> None:
        ray._private.worker.global_worker.set_load_code_from_local(True)
        self._conversions: dict[int, _Conversion] = {}

    def ready(self) -> None:
        """Return once the actor runs."""

    def add(self, staging: Staging) -> None:
        """Serve a source's partitions."""
        locations: list[str | None] = [None] * staging.num_partitions
        self._conversions[staging.rdd_id] = _Conversion(staging, locations)

    def remove(self, rdd_id: int) -> None:
        """Stop serving a source; release its waiters."""
        conversion = self._conversions.pop(rdd_id)
        conversion.failure = "the Spark source was closed"
        conversion.done.set()

    def converted(self, rdd_id: int, failure: str | None) -> None:
        """The source's conversion job ended, with `failure` if it failed."""
        if rdd_id in self._conversions:
            self._conversions[rdd_id].failure = failure
            self._conversions[rdd_id].done.set()

    def fetch(self, rdd_id: int, partition: int) -> list[ray.ObjectRef]:
        """A reference to the partition's Arrow IPC stream, once Spark has converted it."""
        conversion = self._conversions.get(rdd_id)
        if conversion is None:
            raise RuntimeFailure("the Spark source was closed")
        staging = conversion.staging
        executor = ray.get_actor(f"raydp-executor-{self._location(conversion, partition)}")
        ipc = executor.getRDDPartition.remote(
            staging.rdd_id, partition, staging.schema_json, staging.agent_url
        )
        return [ipc]

    @staticmethod
    def _location(conversion: _Conversion, partition: int) -> str:
        """The executor holding `partition`, polled for until the conversion job ends."""
        staging = conversion.staging
        executor = ray.get_actor(f"raydp-executor-{staging.executor}")
        while conversion.locations[partition] is None:
            done = conversion.done.is_set()
            conversion.locations = ray.get(
                executor.getBlockLocations.remote(staging.rdd_id, staging.num_partitions)
            )
            if conversion.locations[partition] is None:
                if done:
                    message = conversion.failure or f"Spark lost partition {partition}"
                    raise RuntimeFailure(message)
                conversion.done.wait(POLL_S)
        return conversion.locations[partition]
