"""Spark input from a session that is not RayDP's: Arrow IPC files in a folder both sides see.

RayDP's executors are Ray workers and hand their partitions to a Ray actor
(`txstream.connectors.spark`); any other Spark (``local[*]``, a cluster not on Ray) has only
its public API. There, a `DataFrame.mapInArrow` task writes its partition into the
exchange folder as Arrow IPC streams, ``<partition>-<sequence>.arrow``, each renamed into
place once whole, then ``<partition>.end`` with the number of its files; the consumer
reads them in partition order, each as soon as it is in place, and removes it. Objects
that a Spark Python worker put in Ray's object store would die with that worker, so
nothing goes through Ray here.

The writer runs in Spark's Python workers: this module imports pyarrow and the standard
library only (and pyspark in those workers).
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from txstream.cluster.scratch import private_dir, remove_tree, written_whole
from txstream.errors import RuntimeFailure, UsageError

if TYPE_CHECKING:  # pyspark is imported only when Spark is used
    from pyspark.sql import DataFrame, SparkSession

PARTITION_SHIFT = 33
"""Input position of a row: partition index << 33 | row in the partition, as Spark's
`monotonically_increasing_id` numbers a DataFrame's rows."""
_FAILED = "_FAILED"
"""The file that holds the first line of the Spark job's failure."""
_DONE = "_DONE"
"""The file that holds the number of partitions once the Spark job has ended."""
_WRITTEN = "partition BIGINT, rows BIGINT"
"""What a writing task returns to the driver: its partition and rows."""


def chunk_path(folder: Path, partition: int, sequence: int) -> Path:
    """The ``sequence``-th file of ``partition``."""
    return folder / f"{partition:06d}-{sequence:06d}.arrow"


def end_path(folder: Path, partition: int) -> Path:
    """The file that says ``partition`` is written whole, and in how many files."""
    return folder / f"{partition:06d}.end"


def is_local(spark: SparkSession) -> bool:
    """Whether Spark's executors run on this host (``local``, ``local[N]``,
    ``local-cluster[...]``, or RayDP's Spark on a Ray of this host alone): then the
    exchange folder can be on local disk."""
    master = spark.sparkContext.master
    if master.startswith("local"):
        return True
    import ray

    if not master.startswith("ray://") or not ray.is_initialized():
        return False
    return len([node for node in ray.nodes() if node["Alive"]]) == 1


def exchange_folder(spark: SparkSession, exchange_dir: str | os.PathLike | None) -> Path:
    """A new folder for one input: under ``exchange_dir`` if given, else under the system's
    temporary folder when Spark runs on this host; a cluster without ``exchange_dir`` is
    refused (its executors write where this process cannot read)."""
    if exchange_dir is not None:
        base = Path(exchange_dir)
        if not base.is_dir():
            raise UsageError(f"spark_exchange_dir {base} is not a folder")
        return Path(tempfile.mkdtemp(prefix="txs-exchange-", dir=base))
    if not is_local(spark):
        raise UsageError(
            f"Spark at {spark.sparkContext.master} is not on Ray: give a folder that its "
            "executors and this process share (spark_exchange_dir / --spark-exchange-dir)"
        )
    return private_dir("exchange")


def write_partition(
    folder: str, chunk_rows: int, position: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A `mapInArrow` function (in a Spark Python worker): this task's partition written
    into ``folder`` in files of about ``chunk_rows`` rows, each with its rows' input
    positions in column ``position``; then its end marker. Yields the partition and its
    rows (`_WRITTEN`)."""
    from pyspark import TaskContext

    partition = TaskContext.get().partitionId()
    files = rows = pending_rows = 0
    pending: list[pa.RecordBatch] = []

    def write() -> None:
        nonlocal files, rows, pending_rows
        table = pa.Table.from_batches(pending)
        first = (partition << PARTITION_SHIFT) + rows
        positions = np.arange(first, first + table.num_rows, dtype=np.int64)
        table = table.append_column(position, pa.array(positions))
        with written_whole(chunk_path(Path(folder), partition, files)) as partial:
            with pa.OSFile(str(partial), "wb") as sink:
                with pa.ipc.new_stream(sink, table.schema) as stream:
                    stream.write_table(table)
        files += 1
        rows += table.num_rows
        pending.clear()
        pending_rows = 0

    for batch in batches:
        pending.append(batch)
        pending_rows += batch.num_rows
        if pending_rows >= chunk_rows:
            write()
    if pending:
        write()
    with written_whole(end_path(Path(folder), partition)) as partial:
        partial.write_text(str(files))
    yield pa.RecordBatch.from_pydict({"partition": [partition], "rows": [rows]})


class ExchangeReader:
    """The consumer's side: the chunks in partition order, each once it is in place, its
    file removed once mapped (its pages stay until the chunk is dropped). Pickles as the
    folder and the timeout: it reads in whichever process of this host (or of the shared
    folder's hosts) iterates the source."""

    def __init__(self, folder: Path, timeout_s: float):
        self.folder = folder
        self.timeout_s = timeout_s

    def chunks(self) -> Iterator[pa.Buffer]:
        """Each partition's files in order, partitions in index order, until the job's
        partitions are all read."""
        partition = 0
        while True:
            sequence = 0
            while (path := self._next(partition, sequence)) is not None:
                with pa.memory_map(str(path)) as file:  # the buffer keeps the mapping
                    buffer = file.read_buffer()
                path.unlink()
                yield buffer
                sequence += 1
            total = self._partitions()
            if total is not None and partition + 1 >= total:
                return
            partition += 1

    def _next(self, partition: int, sequence: int) -> Path | None:
        """The path of the partition's ``sequence``-th file once it is in place; None when
        the partition has no more (or the job ended with fewer partitions)."""
        chunk, end = chunk_path(self.folder, partition, sequence), end_path(self.folder, partition)
        deadline = time.monotonic() + self.timeout_s
        pause = 0.001
        while True:
            if chunk.exists():
                return chunk
            if end.exists():  # written after every file of the partition is in place
                if sequence >= int(end.read_text()):
                    return None
                if not chunk.exists():
                    raise RuntimeFailure(f"Spark's partition {partition} lost a file")
                return chunk
            failed = self.folder / _FAILED
            if failed.exists():
                raise RuntimeFailure(failed.read_text())
            total = self._partitions()
            if total is not None and partition >= total:
                return None
            if not self.folder.is_dir():
                raise RuntimeFailure("the Spark input was closed")
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"no Spark partition within {self.timeout_s} s")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)

    def _partitions(self) -> int | None:
        """The job's number of partitions once it has ended, else None."""
        try:
            return int((self.folder / _DONE).read_text())
        except (FileNotFoundError, ValueError):
            return None


class SparkExchange:
    """The driver's side: the Spark job that writes ``frame``'s partitions into a new
    exchange folder (`exchange_folder`), run on a thread of its own as soon as it is
    created; `close` cancels it if it still runs and removes the folder."""

    def __init__(
        self,
        frame: DataFrame,
        position: str,
        chunk_rows: int,
        exchange_dir: str | os.PathLike | None,
        timeout_s: float,
    ):
        self._spark = frame.sparkSession
        self.folder = exchange_folder(self._spark, exchange_dir)
        self.reader = ExchangeReader(self.folder, timeout_s)
        write = functools.partial(write_partition, str(self.folder), chunk_rows, position)
        try:
            self._written = frame.mapInArrow(write, _WRITTEN)
        except BaseException:
            remove_tree(self.folder)
            raise
        self._group = f"txstream-exchange-{uuid.uuid4().hex}"
        self._job = threading.Thread(target=self._run, name="spark-exchange", daemon=True)
        self._job.start()

    def _run(self) -> None:
        """Run the job; say how it ended in the folder (`_DONE` or `_FAILED`)."""
        context = self._spark.sparkContext
        try:
            context.setJobGroup(self._group, "txstream input", interruptOnCancel=True)
            written = self._written.collect()
        except Exception as exc:  # any failure goes to the consumer
            message = f"Spark failed to convert the input: {first_line(exc)}"
            _write_whole(self.folder / _FAILED, message)
            return
        _write_whole(self.folder / _DONE, str(len(written)))

    def close(self) -> None:
        """Cancel the job if it still runs, wait for it, remove the folder."""
        if self._job.is_alive():
            try:
                self._spark.sparkContext.cancelJobGroup(self._group)
            except Exception:  # Spark already stopped: the job with it
                pass
        self._job.join(timeout=60)
        remove_tree(self.folder)


def _write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless the folder is gone (the input was closed)."""
    try:
        with written_whole(path) as partial:
            partial.write_text(text)
    except FileNotFoundError:
        pass


def first_line(exc: Exception) -> str:
    """The gist of an error, the Java one for a failed Spark call (its cause for a job's
    future, which wraps a job's failure in an `ExecutionException`), the Python one for a
    failed Python worker (the last line of its traceback)."""
    java = getattr(exc, "java_exception", None)
    if java is not None and java.getCause() is not None:
        if java.getClass().getName() == "java.util.concurrent.ExecutionException":
            java = java.getCause()
    text = str(java.toString() if java is not None else exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Traceback (most recent call last):" in lines:
        return lines[-1][:500]
    return lines[0][:500] if lines else type(exc).__name__
