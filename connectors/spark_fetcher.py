"""The Spark partition fetcher: takes a Spark source's converted chunks and hands them out in
input order.

Spark (through RayDP) converts a DataFrame's partitions to Arrow on its executors; each task
calls this actor with every chunk of its partition as soon as it has converted it
(`RayChunks`, ``connectors/java``), and a reader asks for the chunks in order, so reading
overlaps the conversion job (`txstream.connectors.spark` starts the actor with the Spark
application).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import ray
from txstream.errors import RuntimeFailure

Chunk = ray.ObjectRef | str
"""A converted chunk, an Arrow IPC stream: in the object store, or in a file on the fetcher's
node (its path)."""


@dataclass
class _Conversion:
    """The fetcher's view of one source's conversion job."""

    partitions: int
    chunks: dict[tuple[int, int], Chunk] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)  # chunks of each ended partition
    done: bool = False
    failure: str | None = None  # the job's: what is converted can still be read
    inconsistent: str | None = None  # nothing can be read

    def chunk(self, index: int) -> list[Chunk] | int:
        """The ``index``-th chunk in input order (``[chunk]``), ``[]`` past the last one, or
        the partition to wait for."""
        for partition in range(self.partitions):
            count = self.counts.get(partition)
            if count is not None and index >= count:
                index -= count
                continue
            ref = self.chunks.get((partition, index))
            return partition if ref is None else [ref]
        return []


@ray.remote(num_cpus=0, max_concurrency=64)
class PartitionFetcher:
    """Keeps every source's converted chunks and hands them out in input order, many calls
    at a time. One per Spark application, started with it, under the name its Spark tasks
    look it up by. A Spark task on this actor's node writes each chunk into a file and
    gives its path (`stored_file`): the chunk stays there, and a consumer on this node maps
    it, with no copy; one elsewhere gets it copied into the object store. A task on another
    node sends the chunk's bytes as a call's argument (`stored`), which this actor puts in
    the object store (owning it, so that it outlives the task). The chunks of a source are
    freed, and its files removed, when it is removed."""

    def __init__(self) -> None:
        self._conversions: dict[str, _Conversion] = {}
        self._changed = threading.Condition()
        self._node = ray.get_runtime_context().get_node_id()

    def node(self) -> str:
        """This actor's Ray node (its id in hex), once the actor runs: Spark's tasks there
        hand chunks over in files (`stored_file`)."""
        return self._node

    def add(self, source: str, partitions: int) -> None:
        """Take the chunks of ``source``, made by a job of ``partitions`` tasks."""
        with self._changed:
            self._conversions[source] = _Conversion(partitions)

    def remove(self, source: str) -> None:
        """Stop serving a source, free its chunks and remove its files; release its
        waiters."""
        with self._changed:
            conversion = self._conversions.pop(source, None)
            self._changed.notify_all()
        for chunk in conversion.chunks.values() if conversion else ():
            if isinstance(chunk, str):
                Path(chunk).unlink(missing_ok=True)

    def stored(self, source: str, partition: int, chunk: int, stream: bytes) -> None:
        """A Spark task's ``chunk``-th Arrow IPC stream of ``partition`` (the first one kept
        when a task runs again), put in the object store (out of band: a reader maps it)."""
        self._keep(source, partition, chunk, ray.put(pa.py_buffer(stream)))

    def stored_file(self, source: str, partition: int, chunk: int, path: str) -> None:
        """`stored`, the stream written whole by a task on this node into the file
        ``path``, kept there (the file of a chunk made twice, or of a removed source, is
        removed at once)."""
        if not self._keep(source, partition, chunk, path):
            Path(path).unlink(missing_ok=True)

    def _keep(self, source: str, partition: int, index: int, chunk: Chunk) -> bool:
        """Keep a chunk unless its source is gone or it was kept already; whether it was."""
        with self._changed:
            conversion = self._conversions.get(source)
            if conversion is None or (partition, index) in conversion.chunks:
                return False
            conversion.chunks[(partition, index)] = chunk
            self._changed.notify_all()
            return True

    def ended(self, source: str, partition: int, chunks: int) -> None:
        """A Spark task stored all its ``chunks`` chunks of ``partition``."""
        with self._changed:
            conversion = self._conversions.get(source)
            if conversion is None:
                return
            if conversion.counts.setdefault(partition, chunks) != chunks:
                conversion.inconsistent = f"Spark made partition {partition} twice, differently"
            self._changed.notify_all()

    def converted(self, source: str, failure: str | None) -> None:
        """The source's conversion job ended, with `failure` if it failed."""
        with self._changed:
            conversion = self._conversions.get(source)
            if conversion is not None:
                conversion.done = True
                conversion.failure = failure
                self._changed.notify_all()

    def fetch(self, source: str, index: int, node: str | None = None) -> list[Chunk]:
        """The ``index``-th chunk of ``source`` in input order (``[chunk]``) once Spark has
        converted it; ``[]`` past the last one. A chunk file goes to a consumer on ``node``
        (its id in hex) as its path if that is this actor's node, else copied into the
        object store."""
        with self._changed:
            while True:
                conversion = self._conversions.get(source)
                if conversion is None:
                    raise RuntimeFailure("the Spark source was closed")
                found = conversion.chunk(index)
                if isinstance(found, list) and conversion.inconsistent is None:
                    break
                failure = conversion.inconsistent or conversion.failure
                if failure or conversion.done:
                    raise RuntimeFailure(failure or f"Spark lost partition {found}")
                self._changed.wait()
        if found and isinstance(found[0], str) and node != self._node:
            with pa.memory_map(found[0]) as file:
                return [ray.put(file.read_buffer())]
        return found
