"""Spark input through RayDP: Spark on the current Ray session and an ordered event source.

`SparkSource` does not use `ray.data.from_spark`: in RayDP 1.6.5 that persists the whole
DataFrame in Spark, then starts one fetch task per partition at once (all partitions land in
the object store together), and the fetch tasks switch their pooled Ray workers to
`load_code_from_local`, which breaks actors Ray later starts in those workers (the
`load_actor_class ... Expected str or bytes` crash in ENGINEERING.md). Instead the input is
range-partitioned by input position and staged on the Spark executor's disk, and the consumer
pulls partitions in position order through a dedicated fetcher actor, a few at a time.
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
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.job_config import JobConfig

from txstream.errors import RuntimeFailure, SchemaError, UsageError

if TYPE_CHECKING:  # pyspark is imported only when Spark is used
    from pyspark.sql import DataFrame, SparkSession

_OPENED_PACKAGES = (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
    "java.math", "java.text", "java.time", "java.util", "java.util.concurrent",
    "java.util.concurrent.atomic", "java.util.regex", "java.security", "jdk.internal.misc",
    "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs", "sun.security.action", "sun.util.calendar",
)  # fmt: skip

JVM_OPTIONS: tuple[str, ...] = tuple(
    f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in _OPENED_PACKAGES
)
"""Flags every JVM of Spark-on-Ray needs on Java 17, else `InaccessibleObjectException`."""

POSITION = "__txstream_position"
"""Column that carries each row's input position through Spark; never handed to the engine."""

_FILE_SHIFT = 40  # position of a file row = file index << 40 | row index within the file
_INSTALL_JAVA = "install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"


def java_available() -> str | None:
    """Say why Spark cannot start here, or None when Java 17+ is usable.

    RayDP's app master runs `java` from PATH and spark-submit prefers `$JAVA_HOME/bin/java`,
    so both must be Java 17 or newer.
    """
    candidates = {"java on PATH": shutil.which("java")}
    if os.environ.get("JAVA_HOME"):
        candidates["$JAVA_HOME/bin/java"] = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    for where, java in candidates.items():
        if java is None or not os.access(java, os.X_OK):
            return f"Spark input needs Java 17 or newer, but there is no {where}: {_INSTALL_JAVA}"
        try:
            out = subprocess.run(
                [java, "-version"], capture_output=True, text=True, timeout=60
            ).stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"Spark input needs Java 17 or newer; running {java} failed ({exc}): " + (
                _INSTALL_JAVA
            )
        found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
        major = found and int(found[1] if found[1] != "1" else found[2] or 0)
        if not major or major < 17:
            version = found[0] if found else out.strip() or "unknown version"
            return f"Spark input needs Java 17 or newer, {java} is {version}: {_INSTALL_JAVA}"
    return None


def ray_job_config() -> JobConfig:
    """The job config `ray.init` must get so that RayDP's Java workers start on Java 17."""
    return JobConfig(jvm_options=list(JVM_OPTIONS))


@contextmanager
def spark_session(
    app_name: str = "txstream", executor_memory: str = "1g"
) -> Iterator[SparkSession]:
    """Run Spark (one executor, one core) on the current Ray session; stop it on exit.

    Ray must already be running with `ray_job_config()`: RayDP would otherwise start a Ray
    of its own without the JVM flags.
    """
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


class SparkSource:
    """Events read by Spark, handed to the engine in input order with bounded memory.

    `data` is a Parquet file, a folder of Parquet files (read in name order, rows in file
    order) or a Spark DataFrame (its own row order: partition by partition, as `collect()`
    returns it). Creating the source runs the Spark jobs: every row gets its input position,
    rows are range-partitioned by position into partitions of about `partition_rows` rows,
    sorted within each, converted to Arrow and kept on the Spark executor's disk.
    `iter_batches` (in any process of the Ray job) then fetches those partitions in position
    order with at most `prefetch` of them ahead of the consumer, and checks that positions
    strictly increase, so a Spark that broke the range-partitioning contract would fail loudly
    instead of reordering events. The source pickles without its Spark session; `close()`
    (in the driver) frees the staged partitions, which stopping Spark does too.
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
            frame, self.num_rows = _positioned_files(self._spark, _parquet_files(Path(data)))
        self.schema: pa.Schema = _arrow_schema(frame)
        self.prefetch = prefetch
        self.fetch_timeout_s = fetch_timeout_s
        partitions = max(1, math.ceil(self.num_rows / partition_rows))
        self._staged = _stage(frame.repartitionByRange(partitions, POSITION)
                              .sortWithinPartitions(POSITION))  # fmt: skip

    def iter_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """Yield the events in input order, in batches of at most `max_rows` rows."""
        staged = self._staged
        fetcher = _PartitionFetcher.remote(staged)
        try:
            pending = deque()
            requested = 0
            last_position = -1
            emitted = 0
            while requested < staged.num_partitions or pending:
                while requested < staged.num_partitions and len(pending) <= self.prefetch:
                    pending.append(fetcher.fetch.remote(requested))
                    requested += 1
                try:
                    table = ray.get(pending.popleft(), timeout=self.fetch_timeout_s)
                except ray.exceptions.GetTimeoutError as exc:
                    raise RuntimeFailure(
                        f"no Spark partition within {self.fetch_timeout_s} s"
                    ) from exc
                table, last_position = _in_position_order(table, last_position)
                if table.schema != self.schema:
                    table = table.cast(self.schema)
                emitted += table.num_rows
                yield from table.to_batches(max_chunksize=max_rows)
        finally:
            ray.kill(fetcher)
        if emitted != self.num_rows:
            raise RuntimeFailure(f"Spark returned {emitted} events, expected {self.num_rows}")

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


def _parquet_files(path: Path) -> list[Path]:
    """The input files in name order, as SPEC.md §4 defines the input order."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and p.is_file())
        if not files:
            raise UsageError(f"no .parquet files in {path}")
        return files
    if not path.is_file():
        raise UsageError(f"input not found: {path}")
    return [path]


def _positioned_files(spark: SparkSession, files: list[Path]) -> tuple[DataFrame, int]:
    """Union of one read per file, each row tagged `file index << 40 | row index in file`.

    The row index comes from Spark's `_metadata.row_index` (exact even when a file is split
    across partitions). One read per file, because `_metadata.file_name` is URL-encoded and
    so cannot be matched against the names back reliably.
    """
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
    except Exception as exc:  # pyspark's AnalysisException: the files' columns differ
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


class _Staged:
    """Where the staged Arrow partitions are: plain values, so the source pickles."""

    def __init__(self, rdd_id: int, schema_json: str, agent_url: str, executors: list[str]):
        self.rdd_id = rdd_id
        self.schema_json = schema_json
        self.agent_url = agent_url
        self.executors = executors  # Spark executor id holding each partition

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

    Cross-language calls need `load_code_from_local`, which stays set in the calling process;
    in an actor that process dies with it instead of returning to Ray's worker pool.
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
