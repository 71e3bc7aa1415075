"""Spark input through RayDP: Spark on the current Ray session and an ordered event source.

`SparkSource` does not use `ray.data.from_spark`. In RayDP 1.6.5 that persists the whole
DataFrame in Spark (MEMORY_AND_DISK), then starts one fetch task per partition at once, so
every partition lands in the object store together, in Spark's partition order; and the fetch
tasks leave their pooled Ray workers set to `load_code_from_local`. Instead, the input is
range-partitioned by input position and staged on the Spark executor's disk, and the consumer
pulls the partitions in position order, a few at a time, through its own fetcher actor.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.job_config import JobConfig
from txstream.errors import RuntimeFailure, SchemaError, UsageError
from txstream.sources import parquet_files

if TYPE_CHECKING:  # pyspark is imported only when Spark is used
    from pyspark.sql import DataFrame, SparkSession

_OPENED_PACKAGES = """
    java.lang java.lang.invoke java.lang.reflect java.io java.net java.nio java.math java.text
    java.time java.util java.util.concurrent java.util.concurrent.atomic java.util.regex
    java.security jdk.internal.misc jdk.internal.ref sun.nio.ch sun.nio.cs sun.security.action
    sun.util.calendar
""".split()

JVM_OPTIONS: tuple[str, ...] = tuple(
    f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in _OPENED_PACKAGES
)
"""Flags every JVM of Spark-on-Ray needs on Java 17, else `InaccessibleObjectException`."""

POSITION = "__txstream_position"
"""Column that carries each row's input position through Spark; never handed to the engine."""

_FILE_SHIFT = 40  # position of a file row = file index << 40 | row index within the file


def java_available() -> str | None:
    """Say why Spark cannot start here, or None when Java 17+ is usable.

    RayDP's app master runs `java` from PATH and spark-submit prefers `$JAVA_HOME/bin/java`,
    so both must be Java 17 or newer.
    """
    javas = {"on PATH": shutil.which("java")}
    if os.environ.get("JAVA_HOME"):
        javas["in $JAVA_HOME"] = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    for where, java in javas.items():
        major = _java_major(java) if java else None
        if major is None or major < 17:
            found = "no working java" if major is None else f"Java {major}"
            return (
                f"Spark input needs Java 17 or newer, found {found} {where}; install it "
                "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
            )
    return None


def _java_major(java: str) -> int | None:
    """The major version `java -version` reports (8 for "1.8.0_392"); None if it fails."""
    try:
        run = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', run.stderr)
    if not found:
        return None
    return int(found[2] or 0) if found[1] == "1" else int(found[1])


def ray_job_config() -> JobConfig:
    """The job config `ray.init` must get so that RayDP's Java workers start on Java 17."""
    return JobConfig(jvm_options=list(JVM_OPTIONS))


@contextmanager
def spark_session(
    app_name: str = "txstream", executor_memory: str = "1g"
) -> Iterator[SparkSession]:
    """Run Spark (one executor, one core) on the current Ray session; stop it on exit.

    An active Spark session (the user's) is used as it is and left running. Ray must
    already be running with `ray_job_config()`: RayDP would otherwise start a Ray of
    its own without the JVM flags.
    """
    active = _active_session()
    if active is not None:
        yield active
        return
    problem = java_available()
    if problem:
        raise UsageError(problem)
    if not ray.is_initialized():
        raise UsageError("start Ray (with job_config=ray_job_config()) before Spark")
    import raydp

    flags = " ".join(JVM_OPTIONS)
    configs = {
        "spark.ray.raydp_app_master.extraJavaOptions": flags,
        "spark.executor.extraJavaOptions": flags,
        "spark.driver.extraJavaOptions": flags,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    try:
        yield raydp.init_spark(app_name, 1, 1, executor_memory, configs=configs)
    finally:
        raydp.stop_spark()


def _active_session() -> SparkSession | None:
    import sys

    if "pyspark" not in sys.modules:  # nobody started Spark in this process
        return None
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def is_spark_dataframe(data: object) -> bool:
    """Whether ``data`` is a Spark DataFrame (without importing pyspark otherwise)."""
    return type(data).__module__.startswith("pyspark.sql")


def arrow_to_spark(table: pa.Table, spark: SparkSession) -> DataFrame:
    """An Arrow table as a Spark DataFrame with the same column names, types and nulls."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    frame = table.to_pandas(types_mapper={pa.int64(): __import__("pandas").Int64Dtype()}.get)
    return spark.createDataFrame(frame, schema=from_arrow_schema(table.schema))


class SparkSource:
    """Events read by Spark, handed to the engine in input order with bounded memory.

    `data` is a Parquet file or folder (`txstream.sources.parquet_files`: files in name
    order, rows in file order) or a Spark DataFrame (its own row order: partition by
    partition, as `collect()` returns it). Creating the source runs the Spark jobs: every
    row gets its input position, rows are range-partitioned by position into partitions of
    about `partition_rows` rows, sorted within each, converted to Arrow and kept on the
    Spark executor's disk. `iter_batches` (in any process of the Ray job) then fetches those
    partitions in position order with at most `prefetch` of them ahead of the consumer, and
    checks that positions strictly increase, so a Spark that broke the range-partitioning
    contract would fail loudly instead of reordering events. The source pickles without its
    Spark session; `close()` (in the driver) frees the staged partitions, which stopping
    Spark does too.
    """

    def __init__(
        self,
        data: str | os.PathLike | DataFrame,
        *,
        partition_rows: int = 1 << 18,
        prefetch: int = 2,
        fetch_timeout_s: float = 600.0,
    ) -> None:
        from pyspark.sql import DataFrame, SparkSession

        if partition_rows < 1 or prefetch < 0:
            raise UsageError("partition_rows must be >= 1 and prefetch >= 0")
        if isinstance(data, DataFrame):
            self._spark = data.sparkSession
            frame, self.num_rows = _positioned_frame(data)
        else:
            self._spark = SparkSession.getActiveSession()
            if self._spark is None:
                raise UsageError("no Spark session: open one with txstream.cluster.spark_session()")
            frame, self.num_rows = _positioned_files(self._spark, parquet_files(data))
        self.schema: pa.Schema = _arrow_schema(frame)
        self.prefetch = prefetch
        self.fetch_timeout_s = fetch_timeout_s
        partitions = max(1, math.ceil(self.num_rows / partition_rows))
        by_position = frame.repartitionByRange(partitions, POSITION)
        self._staged = _stage(by_position.sortWithinPartitions(POSITION))

    def iter_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """Yield the events in input order, in batches of at most `max_rows` rows."""
        emitted = 0
        for table in self._partitions_in_order():
            emitted += table.num_rows
            yield from table.to_batches(max_chunksize=max_rows)
        if emitted != self.num_rows:
            raise RuntimeFailure(f"Spark returned {emitted} events, expected {self.num_rows}")

    def _partitions_in_order(self) -> Iterator[pa.Table]:
        """The staged partitions by position, at most `prefetch` of them fetched ahead."""
        count = self._staged.num_partitions
        fetcher = _PartitionFetcher.remote(self._staged)
        pending: deque[ray.ObjectRef] = deque()
        requested, last_position = 0, -1
        try:
            for _ in range(count):
                while requested < count and len(pending) <= self.prefetch:
                    pending.append(fetcher.fetch.remote(requested))
                    requested += 1
                try:
                    table = ray.get(pending.popleft(), timeout=self.fetch_timeout_s)
                except ray.exceptions.GetTimeoutError as exc:
                    raise RuntimeFailure(
                        f"no Spark partition within {self.fetch_timeout_s} s"
                    ) from exc
                table, last_position = _in_position_order(table, last_position)
                yield table if table.schema == self.schema else table.cast(self.schema)
        finally:
            ray.kill(fetcher)

    def close(self) -> None:
        """Free the staged partitions on the Spark executor (driver only)."""
        if self._spark is not None and self._spark.sparkContext._jsc is not None:
            writer = self._spark.sparkContext._jvm.org.apache.spark.sql.raydp.ObjectStoreWriter
            writer.releaseRecoverableRDD(self._staged.rdd_id)

    def __enter__(self) -> SparkSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_spark": None}


def _positioned_files(spark: SparkSession, files: list[Path]) -> tuple[DataFrame, int]:
    """Union of one read per file, each row tagged `file index << 40 | row index in file`.

    The row index comes from Spark's `_metadata.row_index` (exact even when a file is split
    across partitions). One read per file, because `_metadata.file_name` is URL-encoded and
    so cannot be matched against the names back reliably.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    num_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    reads = []
    for index, file in enumerate(files):
        frame = spark.read.parquet(str(file))
        _check_free(frame)
        position = F.shiftleft(F.lit(index).cast("long"), _FILE_SHIFT) + F.col(
            "_metadata.row_index"
        )
        reads.append(frame.withColumn(POSITION, position))
    try:
        return reduce(lambda a, b: a.unionByName(b), reads), num_rows
    except AnalysisException as exc:
        raise SchemaError(f"the input files do not share one schema: {exc}") from exc


def _positioned_frame(frame: DataFrame) -> tuple[DataFrame, int]:
    """Tag rows with `monotonically_increasing_id`: (partition index, row in partition).

    That is exactly the DataFrame's own order; it is evaluated once, before the shuffle.
    """
    from pyspark.sql import functions as F

    _check_free(frame)
    return frame.withColumn(POSITION, F.monotonically_increasing_id()), frame.count()


def _check_free(frame: DataFrame) -> None:
    if POSITION in frame.columns:
        raise SchemaError(f"input column {POSITION!r} is reserved")


def _arrow_schema(frame: DataFrame) -> pa.Schema:
    """The Arrow schema Spark's own conversion gives, without the position column."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        schema = to_arrow_schema(frame.schema)
    except TypeError as exc:
        raise SchemaError(f"a Spark column has no Arrow type: {exc}") from exc
    return schema.remove(schema.get_field_index(POSITION))


@dataclass(frozen=True)
class _Staged:
    """Where the staged Arrow partitions are: plain values, so the source pickles."""

    rdd_id: int
    schema_json: str
    agent_url: str
    executors: list[str]  # the Spark executor holding each partition

    @property
    def num_partitions(self) -> int:
        return len(self.executors)


def _stage(frame: DataFrame) -> _Staged:
    """Convert `frame` to Arrow partitions kept on the executors' disk (RayDP's JVM side).

    This is the first half of RayDP's `from_spark`; DISK_ONLY keeps the executor heap out of
    it, so inputs larger than memory only need disk.
    """
    from pyspark import StorageLevel

    context = frame.sparkSession.sparkContext
    info = context._jvm.org.apache.spark.sql.raydp.ObjectStoreWriter.prepareRecoverableRDD(
        frame._jdf, context._getJavaStorageLevel(StorageLevel.DISK_ONLY)
    )
    return _Staged(info.rddId(), info.schemaJson(), info.driverAgentUrl(), list(info.locations()))


@ray.remote(num_cpus=0)
class _PartitionFetcher:
    """Fetches staged partitions from the Spark executor's JVM actor, one call at a time.

    Cross-language calls need `load_code_from_local`, which stays set in the calling process
    and changes how it loads any actor class Ray later starts there; an actor's process dies
    with it instead of going back to Ray's worker pool.
    """

    def __init__(self, staged: _Staged) -> None:
        ray._private.worker.global_worker.set_load_code_from_local(True)
        self._staged = staged

    def fetch(self, partition: int) -> pa.Table:
        staged = self._staged
        executor = ray.get_actor(f"raydp-executor-{staged.executors[partition]}")
        ipc = ray.get(
            executor.getRDDPartition.remote(
                staged.rdd_id, partition, staged.schema_json, staged.agent_url
            )
        )
        return pa.ipc.open_stream(pa.BufferReader(ipc)).read_all().replace_schema_metadata()


def _in_position_order(table: pa.Table, last_position: int) -> tuple[pa.Table, int]:
    """Sort a partition by position if needed and check it follows the previous one.

    Rows inside a partition can be put back in order here; a partition that starts before
    the previous one ended cannot (its predecessors are already out), so that is an error.
    """
    column = table.column(POSITION)
    if column.null_count:
        raise RuntimeFailure("Spark lost the input position of some rows")
    positions = column.to_numpy()
    if np.any(positions[1:] <= positions[:-1]):
        order = np.argsort(positions, kind="stable")
        table, positions = table.take(order), positions[order]
        if np.any(positions[1:] == positions[:-1]):
            raise RuntimeFailure("Spark returned an input position twice")
    if len(positions) and positions[0] <= last_position:
        raise RuntimeFailure("Spark returned partitions out of input order")
    last = int(positions[-1]) if len(positions) else last_position
    return table.drop_columns([POSITION]).combine_chunks(), last
