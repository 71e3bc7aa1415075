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


@dataclass
class _Conversion:
    """The fetcher's view of one source's conversion job."""

    partitions: int
    chunks: dict[tuple[int, int], ray.ObjectRef] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)  # chunks of each ended partition
    done: bool = False
    failure: str | None = None  # the job's: what is converted can still be read
    inconsistent: str | None = None  # nothing can be read

    def chunk(self, index: int) -> list[ray.ObjectRef] | int:
        """The ``index``-th chunk in input order (``[ref]``), ``[]`` past the last one, or
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
    """Keeps every source's converted chunks in the object store (owning them, so they
    outlive the Spark task that made them) and hands them out in input order, many calls at
    a time. One per Spark application, started with it, under the name its Spark tasks look
    it up by. A Spark task on this actor's node writes a chunk into a file, which this actor
    copies into the object store as the chunk the consumer reads without copying, then
    removes; a task on another node sends the chunk's bytes as a call's argument (through
    the object store, then a copy in this process). The chunks of a source are freed when
    it is removed."""

    def __init__(self) -> None:
        self._conversions: dict[str, _Conversion] = {}
        self._changed = threading.Condition()

    def ready(self) -> None:
        """Return once the actor runs."""

    def node(self) -> str:
        """This actor's Ray node (its id in hex): Spark's tasks there hand chunks over in
        files (`stored_file`)."""
        return ray.get_runtime_context().get_node_id()

    def add(self, source: str, partitions: int) -> None:
        """Take the chunks of ``source``, made by a job of ``partitions`` tasks."""
        with self._changed:
            self._conversions[source] = _Conversion(partitions)

    def remove(self, source: str) -> None:
        """Stop serving a source and free its chunks; release its waiters."""
        with self._changed:
            self._conversions.pop(source, None)
            self._changed.notify_all()

    def stored(self, source: str, partition: int, chunk: int, stream: bytes) -> None:
        """A Spark task's ``chunk``-th Arrow IPC stream of ``partition`` (the first one kept
        when a task runs again)."""
        self._keep(source, partition, chunk, ray.put(pa.py_buffer(stream)))

    def stored_file(self, source: str, partition: int, chunk: int, path: str) -> None:
        """`stored`, the stream written by a task on this node into the file ``path``,
        which is removed once its bytes are in the object store."""
        try:
            with pa.memory_map(path) as file:  # written whole before this call
                ref = ray.put(file.read_buffer())
        finally:
            Path(path).unlink(missing_ok=True)  # a missing file's error is memory_map's
        self._keep(source, partition, chunk, ref)

    def _keep(self, source: str, partition: int, chunk: int, ref: ray.ObjectRef) -> None:
        """Keep a chunk (out of band in the object store: the reader maps it)."""
        with self._changed:
            conversion = self._conversions.get(source)
            if conversion is not None:
                conversion.chunks.setdefault((partition, chunk), ref)
                self._changed.notify_all()

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

    def fetch(self, source: str, index: int) -> list[ray.ObjectRef]:
        """A reference to the ``index``-th chunk of ``source`` in input order (an Arrow IPC
        stream) once Spark has converted it; ``[]`` past the last one."""
        with self._changed:
            while True:
                conversion = self._conversions.get(source)
                if conversion is None:
                    raise RuntimeFailure("the Spark source was closed")
                found = conversion.chunk(index)
                if isinstance(found, list) and conversion.inconsistent is None:
                    return found
                failure = conversion.inconsistent or conversion.failure
                if failure or conversion.done:
                    raise RuntimeFailure(failure or f"Spark lost partition {found}")
                self._changed.wait()
