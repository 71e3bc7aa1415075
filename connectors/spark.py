"""Spark input through RayDP: Spark on the current Ray session and an ordered event source.

`SparkSource` does not use `ray.data.from_spark`. In RayDP 1.6.5 that persists the whole
DataFrame in Spark (MEMORY_AND_DISK), then starts one fetch task per partition at once, so
every partition lands in the object store together, in Spark's partition order; and the fetch
tasks leave their pooled Ray workers set to `load_code_from_local`. Instead, every row carries
its input position, and each Spark task hands its partition to a fetcher actor in chunks
as it converts them (`RayChunks`), while the consumer pulls the chunks in order, a few at a
time, each as soon as Spark has it; the consumer checks the positions. A Spark that is
not RayDP's has no Ray workers to hand partitions to: there, the partitions come through
files (`txstream.connectors.spark_exchange`), and the consumer reads them alike.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.job_config import JobConfig
from txstream.cluster import ray_private
from txstream.cluster.ray_runtime import ray_session
from txstream.cluster.scratch import JavaDriverLibraries, scratch
from txstream.cluster.topology import usable_cores
from txstream.connectors import spark_private
from txstream.connectors.sources import ArrowSource
from txstream.connectors.spark_converter import CHUNKS_CLASS
from txstream.connectors.spark_driver import (
    LOG4J_LEVELS,
    driver_configs,
    java_available,
    jvm_flags,
    spark_class_path,
    spark_configs,
    take_early,
)
from txstream.connectors.spark_exchange import ExchangeReader, SparkExchange, first_line
from txstream.connectors.spark_fetcher import Chunk, PartitionFetcher
from txstream.errors import RuntimeFailure, SchemaError, UsageError
from txstream.monitor.console import Console
from txstream.monitor.logs import level_number

if TYPE_CHECKING:  # pyspark is imported only when Spark is used
    from py4j.java_gateway import JavaObject
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

POSITION = "__txstream_position"
"""Column that carries each row's input position through Spark; never handed to the engine."""

_FILE_SHIFT = 40  # position of a file row = file index << 40 | row index within the file


def ray_job_config(java_options: Sequence[str] = ()) -> JobConfig:
    """The job config `ray.init` must get for Spark on Ray: the flags RayDP's Java workers
    need on Java 17, the class archive, and the class path of Spark's JVMs
    (`spark_class_path`), with which `spark_session` starts RayDP's app master as a Java
    actor of this job (`_AppMaster`); then ``java_options``. Every Java worker of the job
    (the app master, Spark's executors) gets them."""
    return JobConfig(jvm_options=[*jvm_flags(), "-cp", spark_class_path(), *java_options])


@contextmanager
def ray_for_spark(java_options: Sequence[str] = ()) -> Iterator[None]:
    """Ray for a program that uses Spark through RayDP (then `spark_session`): the Ray
    already initialised, or the one at ``$RAY_ADDRESS``, or a local Ray with the job config
    Spark needs (`ray_job_config`, with ``java_options``), whose session folder is private
    and removed at the end (``ray.init`` would leave ~40 MB in ``/tmp/ray/session_*``), of
    whose own records only errors show, and whose workers' output (Spark's JVMs log on
    stdout) stays in its logs instead of mixing with the program's."""
    config = ray_job_config(java_options)
    with ray_session(job_config=config, logging_level=logging.ERROR, log_to_driver=False):
        yield


@contextmanager
def spark_session(
    app_name: str = "txstream",
    executor_memory: str = "1g",
    *,
    console: Console | None = None,
    log_level: str = "error",
    java_options: Sequence[str] = (),
) -> Iterator[SparkSession]:
    """Run Spark (one executor, `_executor_cores`) on the current Ray session; stop it on
    exit.

    An active Spark session (the user's) is used as it is and left running. Ray must
    already be running with `ray_job_config()`: RayDP would otherwise start a Ray of
    its own without the JVM flags. Spark's Python workers run this interpreter
    (``$PYSPARK_PYTHON`` if set); the JVMs keep their temporary files in a private
    folder, removed on exit together with the folders of Ray's native library they
    extracted; the driver logs to stderr at ``log_level``: by default only errors (a run
    gives its own level and sends stderr to its log; in a Python program, Spark's warnings
    about task sizes or streaming options would be all the user sees of it). Every JVM
    maps this installation's class archive if it has one
    (`txstream.connectors.spark_classes`); the driver and the executors get
    ``java_options`` last (RayDP's app master, when started as a Java actor of this job,
    `_AppMaster`, those of the job only). A driver JVM launched before Ray started
    (`spark_driver.launch_early`) is the session's driver, its folder the session's.
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
    level_number(log_level)  # an unknown level is refused before anything starts
    console = console or Console(enabled=False)
    with ExitStack() as stack:
        libraries = JavaDriverLibraries()
        stack.callback(libraries.remove)
        master: _AppMaster | None = None
        try:
            with console.phase("starting Spark"):
                # the app master's JVM starts first, then everything else while it does
                master = _AppMaster.start() if _AppMaster.possible() else None
                if master is not None:
                    stack.callback(master.stop)
                name, fetcher = _start_fetcher()  # its process starts while Spark does
                stack.callback(ray.kill, fetcher)
                # a driver launched before Ray (`txstream run`) keeps its folder
                folder = stack.enter_context(scratch("spark", take_early()))
                configs = spark_configs(folder, log_level, java_options)
                cores = _executor_cores()
                if master is not None:
                    session = master.session(app_name, cores, executor_memory, configs)
                else:
                    import raydp

                    with _driver_launched_beside(configs, cores, executor_memory):
                        # not fault-tolerant: the driver JVM does not join Ray as a Java
                        # driver, which RayDP's own staging (`ray.data.from_spark`) needs,
                        # and its agent that computes a lost block again (an executor
                        # restarted mid-read: the read fails instead), so it neither starts
                        # Ray nor stops it (Ray.shutdown would lengthen Spark's stop)
                        session = raydp.init_spark(
                            app_name,
                            1,
                            cores,
                            executor_memory,
                            fault_tolerant_mode=False,
                            configs=configs,
                        )
                session.sparkContext.setLogLevel(LOG4J_LEVELS[log_level])  # pyspark's: WARN
                app = session.sparkContext.applicationId
                _FETCHERS[app] = name, fetcher
                stack.callback(_FETCHERS.pop, app)
                ray.get(fetcher.node.remote())  # the fetcher runs
            yield session
        finally:
            libraries.note()  # while the JVMs that extracted them still run
            with console.phase("stopping Spark"):
                if master is not None:
                    master.stop_session()
                else:
                    import raydp

                    raydp.stop_spark()


MASTER_TIMEOUT_S = 300.0
"""How long RayDP's app master may take to start (its Java worker, its first call)."""


class _AppMaster:
    """RayDP's app master (`RayAppMaster`, Spark's cluster manager on Ray) started as a Java
    actor of this Ray job, and the Spark session on it.

    `raydp.init_spark` starts it in three steps, one after the other: a Python actor
    (which imports RayDP and pyspark), a JVM that it launches (which joins Ray as a Java
    driver, a job of its own), and the `RayAppMaster` actor that this JVM creates, in a
    Java worker of that job. Created from Python instead, the actor needs only its Java
    worker: the job's JVM options must give it the class path of Spark's JVMs
    (`ray_job_config`, checked by `possible`). Its executors are then Java workers of
    this job too, with the job's options before their own.
    """

    CLASS = "org.apache.spark.deploy.raydp.RayAppMaster"
    CONSTRUCTOR = "(Ljava/lang/String;)V"  # RayAppMaster(actorExtraClasspath)

    def __init__(self, actor: ray.actor.ActorHandle, url: ray.ObjectRef):
        self.actor = actor
        self._url = url
        self._session: SparkSession | None = None

    @staticmethod
    def possible() -> bool:
        """Whether this Ray job's JVM options give its Java workers Spark's class path
        (False on a Ray `ray_private` was not checked with: RayDP's own way then)."""
        options = ray_private.job_jvm_options()
        if options is None:
            return False
        try:
            class_path = spark_class_path()
        except UsageError:  # no RayDP: RayDP's own way says what is wrong
            return False
        return any(
            a == "-cp" and b == class_path for a, b in zip(options, options[1:], strict=False)
        )

    @classmethod
    def start(cls) -> _AppMaster:
        """Create the actor (its JVM starts now) and ask for its address."""
        actor_class = ray_private.java_actor_class(cls.CLASS, cls.CONSTRUCTOR)
        with ray_private.java_calls():  # the executors' class path, as RayDP gives it
            actor = actor_class.options(num_cpus=0).remote(spark_class_path())
            url = actor.getMasterUrl.remote()
        return cls(actor, url)

    def session(
        self, app_name: str, cores: int, executor_memory: str, configs: dict[str, str]
    ) -> SparkSession:
        """The Spark session (driver) on this master, with RayDP's driver configs (its
        class path and agent) added to ``configs``: the driver JVM is launched at once,
        its SparkContext created once the master has its address."""
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession

        configs = _driver_configs(configs, cores, executor_memory)
        conf = SparkConf(loadDefaults=False).setAll(list(configs.items()))
        launch = threading.Thread(target=spark_private.launch_driver, args=(conf,), daemon=True)
        launch.start()
        try:
            url = ray.get(self._url, timeout=MASTER_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeFailure(
                f"Spark's app master did not start within {MASTER_TIMEOUT_S:.0f} s"
            ) from None
        finally:
            launch.join()
        conf = SparkConf().setAll(list(configs.items())).setAppName(app_name).setMaster(url)
        self._session = SparkSession(SparkContext(conf=conf))  # not the builder: its
        return self._session  # options would outlive the session

    def stop_session(self) -> None:
        """Stop the Spark session (its executors end with it)."""
        if self._session is not None:
            self._session.stop()
            self._session = None

    def stop(self) -> None:
        """Kill the actor (with it the executors it created, which it owns)."""
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # Ray already gone
            pass


def _driver_configs(configs: dict[str, str], cores: int, executor_memory: str) -> dict[str, str]:
    """``configs`` with those RayDP gives Spark's driver for one executor of ``cores`` and
    ``executor_memory`` (`SparkCluster._prepare_spark_configs` of RayDP 1.6): those of its
    JVM's launch (`driver_configs`), the executors' size and the driver's address."""
    configs = driver_configs(configs)
    configs["spark.executor.instances"] = "1"
    configs["spark.executor.cores"] = str(cores)
    configs["spark.executor.memory"] = executor_memory
    if "spark.driver.host" not in configs:
        configs["spark.driver.host"] = configs["spark.driver.bindAddress"] = str(
            ray.util.get_node_ip_address()
        )
    return configs


@contextmanager
def _driver_launched_beside(
    configs: dict[str, str], cores: int, executor_memory: str
) -> Iterator[None]:
    """Spark's driver JVM launched on a thread (with the configs RayDP gives it,
    `_driver_configs`) while RayDP starts its app master within, instead of after it: the
    driver needs the master's address only to create its SparkContext, so the two JVMs
    start side by side. If the launch fails, RayDP launches the driver as usual."""
    from pyspark import SparkConf

    configs = _driver_configs(configs, cores, executor_memory)
    conf = SparkConf(loadDefaults=False).setAll(list(configs.items()))
    launch = threading.Thread(target=spark_private.launch_driver, args=(conf,), daemon=True)
    launch.start()
    try:
        yield
    finally:
        launch.join()


def _executor_cores() -> int:
    """Cores of Spark's one executor: as many as this host has and Ray has free (the
    conversion to Arrow runs a partition per core, while the team, which reserves no CPU
    in Ray, mostly waits for it)."""
    free = int(ray.available_resources().get("CPU", 1))
    return max(1, min(usable_cores(), free))


def _active_session() -> SparkSession | None:
    if "pyspark" not in sys.modules:  # nobody started Spark in this process
        return None
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def on_ray(spark: SparkSession) -> bool:
    """Whether ``spark`` is RayDP's Spark on Ray (the one `spark_session` starts, or any at a
    ``ray://`` master): its executors are Ray workers, which hand their partitions to a Ray
    actor; any other Spark writes them to files (`SparkExchange`)."""
    context = spark.sparkContext
    ours = context.master.startswith("ray://") or context.applicationId in _FETCHERS
    return ours and spark_private.tested(spark_private.ON_RAY)


def staging_session(events: object) -> SparkSession | None:
    """The Spark session that would stage ``events``: a DataFrame's own, else the active
    one (None if there is none)."""
    session = getattr(events, "sparkSession", None)
    return session if session is not None else _active_session()


def spark_running() -> bool:
    """Whether this process has an active Spark session."""
    return _active_session() is not None


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow one (pyspark's `from_arrow_schema`)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark's own conversion gives a Spark one (pyspark's
    `to_arrow_schema`)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def arrow_to_spark(table: pa.Table, spark: SparkSession) -> DataFrame:
    """An Arrow table as a Spark DataFrame with the same column names, types and nulls,
    one partition per record batch of at most
    `spark.sql.execution.arrow.maxRecordsPerBatch` rows (`spark_private.frame_from_arrow`)."""
    schema = spark_schema(table.schema)
    table = table.cast(arrow_schema(schema))  # the exact types Spark reads (no dictionaries)
    batches = table.to_batches(max_chunksize=rows_per_batch(spark))
    if not batches:
        return spark.createDataFrame([], schema)
    return spark_private.frame_from_arrow(batches, schema, spark)


class SparkSource:
    """Events read by Spark, handed to the engine in input order with bounded memory.

    `data` is a Parquet file or folder (`txstream.connectors.sources.parquet_files`: files in name
    order, rows in file order; or an `ArrowSource` of them, whose footers are then not read
    again) or a Spark DataFrame (its own row order: partition by
    partition, as `collect()` returns it). Every row gets its input position, and Spark
    partitions are taken as they come, without a shuffle: a file is read on its own, so its
    partitions are consecutive splits of it, and a DataFrame's position is its partition
    index first. Partition index order is thus input order; nothing trusts it blindly: the
    consumer sorts a partition whose rows come out of order and fails the run if a partition
    starts before the previous one ended (or rows go missing), instead of reordering events.

    Converting to Arrow is one Spark job, submitted once the input is planned (its tasks
    start as soon as Spark's executor registers, while the engine starts). Each task hands
    its partition to the application's fetcher actor in chunks of about `chunk_rows` rows
    (whole Arrow batches) as it converts them, and `iter_batches` (in any process of the
    Ray job) fetches the chunks in input order, each as soon as Spark has it, at most
    `prefetch` ahead of the consumer: the engine runs while Spark is still converting.
    The chunks stay in Ray's object store until `close()`, which spills them to disk when it
    is full, so memory is bounded whatever the input's size. File splits are sized to about
    `partition_rows` rows, and no smaller than the largest row group (Parquet row groups are
    not split, their chunks are: a task holds at most a chunk); a DataFrame keeps its
    partitions. Smaller chunks give the first events sooner but read a whole input slower
    (docs/performance.md). The source pickles without its Spark side; `close()` (in the
    driver) stops the conversion and frees the chunks.

    That is RayDP's Spark on Ray (`on_ray`). Any other classic Spark session writes the
    chunks, positions included, into an exchange folder (`SparkExchange`: local disk for a
    local Spark, ``exchange_dir`` for a cluster) from a `mapInArrow` job, and `partitions`
    reads them from there in the same order, with the same checks.
    """

    def __init__(
        self,
        data: str | os.PathLike | ArrowSource | DataFrame,
        *,
        partition_rows: int = 1 << 18,
        chunk_rows: int = 1 << 20,
        prefetch: int = 2,
        fetch_timeout_s: float = 600.0,
        exchange_dir: str | os.PathLike | None = None,
    ) -> None:
        from pyspark.sql import DataFrame, SparkSession

        if partition_rows < 1 or chunk_rows < 1 or prefetch < 0:
            raise UsageError("partition_rows and chunk_rows must be >= 1, prefetch >= 0")
        files: list[DataFrame] = []
        if isinstance(data, DataFrame):
            self._spark = data.sparkSession
            _check_free(data)
            plain, self.num_rows = data, data.count()
            split_bytes = None
        else:
            self._spark = SparkSession.getActiveSession()
            if self._spark is None:
                raise UsageError(
                    "no Spark session: open one with txstream.connectors.spark.spark_session()"
                )
            parquet = data if isinstance(data, ArrowSource) else ArrowSource(data)
            files = _file_reads(self._spark, parquet)
            plain, self.num_rows = reduce(DataFrame.union, files), parquet.num_rows
            file_bytes = sum(f.stat().st_size for f in parquet.files)
            rows_bytes = partition_rows * file_bytes // max(1, self.num_rows)
            split_bytes = max(1, rows_bytes, _largest_row_group_bytes(parquet.files))
        self.schema: pa.Schema = _event_schema(plain)
        self.prefetch = prefetch
        self.fetch_timeout_s = fetch_timeout_s
        self._exchange: SparkExchange | None = None
        self._reader: ExchangeReader | None = None
        if not on_ray(self._spark):  # no Ray workers to hand partitions to: files
            self._fetcher = self._key = None
            self.num_partitions = plain.rdd.getNumPartitions()  # as planned
            self._exchange = SparkExchange(
                plain, POSITION, chunk_rows, exchange_dir, fetch_timeout_s
            )
            self._reader = self._exchange.reader
            return
        if files:
            frame = reduce(DataFrame.union, _positioned(files))
        else:
            frame = plain.withColumn(POSITION, _row_ids())
        self._key = uuid.uuid4().hex
        name, self._fetcher = _fetcher(self._spark)
        schema_json = spark_private.arrow_schema_json(frame)
        batches = _planned_batches(frame, split_bytes, schema_json, files)
        rows = rows_per_batch(self._spark)
        chunks = spark_private.spark_object(self._spark, CHUNKS_CLASS).deliver(
            batches,
            name,
            _chunk_files_node(self._fetcher),
            self._key,
            schema_json,
            -(-chunk_rows // rows),
        )
        self.num_partitions = chunks.getNumPartitions()
        ray.get(self._fetcher.add.remote(self._key, self.num_partitions))
        self._conversion = chunks.countAsync()  # runs as soon as Spark has an executor
        self._converting = threading.Thread(target=self._converted, daemon=True)
        self._converting.start()

    def iter_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """Yield the events in input order, in batches of at most `max_rows` rows."""
        emitted = 0
        for table in self._chunks_in_order():
            emitted += table.num_rows
            yield from table.to_batches(max_chunksize=max_rows)
        if emitted != self.num_rows:
            raise RuntimeFailure(f"Spark returned {emitted} events, expected {self.num_rows}")

    def _chunks_in_order(self) -> Iterator[pa.Table]:
        """The chunks in input order, each as soon as Spark has converted it."""
        last_position = -1
        for chunk in self.partitions():
            table, first, last = partition_table(chunk, self.schema)
            last_position = follow(last_position, first, last)
            yield table

    def partitions(self) -> Iterator[Chunk]:
        """The converted chunks (Arrow IPC streams) in input order, each once Spark has
        converted it, at most `prefetch` asked for ahead: to read one where it lies
        (`partition_table`, on this node: a chunk file is given as its path to a consumer
        on the fetcher's node), the reader checking their order (`follow`)."""
        if self._reader is not None:
            yield from self._reader.chunks()
            return
        node = ray.get_runtime_context().get_node_id()
        pending: deque[ray.ObjectRef] = deque()
        requested = 0
        while True:
            while len(pending) <= self.prefetch:
                pending.append(self._fetcher.fetch.remote(self._key, requested, node))
                requested += 1
            found = self._get(pending.popleft())
            if not found:
                return
            yield found[0]

    def _get(self, ref: ray.ObjectRef) -> object:
        """ray.get within the fetch timeout; the fetcher's own errors keep their type."""
        try:
            return ray.get(ref, timeout=self.fetch_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise RuntimeFailure(f"no Spark partition within {self.fetch_timeout_s} s") from exc
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, RuntimeFailure):
                raise exc.cause from None
            raise

    def _converted(self) -> None:
        """Driver thread: report the conversion job's end to the fetcher."""
        failure = None
        try:
            self._conversion.get()
        except Exception as exc:  # any failure goes to the consumer
            failure = f"Spark failed to convert the input: {first_line(exc)}"
        self._fetcher.converted.remote(self._key, failure)

    def close(self) -> None:
        """Stop the conversion and free the converted chunks (driver only)."""
        if self._exchange is not None:
            self._exchange.close()
            return
        try:
            ray.get(self._fetcher.remove.remote(self._key))
        except ray.exceptions.RayActorError:  # Spark, and its fetcher, already stopped
            pass
        try:
            self._conversion.cancel(False)
        except Exception:  # Spark already stopped: nothing converts any more
            pass
        self._converting.join(timeout=60)

    def __enter__(self) -> SparkSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        """What a consumer needs; the Spark side stays in the driver."""
        return {key: self.__dict__[key] for key in _CONSUMER_FIELDS}


_CONSUMER_FIELDS = (
    "schema",
    "num_rows",
    "num_partitions",
    "prefetch",
    "fetch_timeout_s",
    "_fetcher",
    "_key",
    "_reader",
)


def _file_reads(spark: SparkSession, parquet: ArrowSource) -> list[DataFrame]:
    """One read per file, in file order: the input is their union.

    One read per file, because `_metadata.file_name` is URL-encoded and so cannot be
    matched against the names back reliably, and because Spark packs the splits of several
    files into one partition, largest first. ``parquet`` has checked the files' schemas
    equal from their footers; Spark gets that schema rather than inferring it (a Spark job:
    seconds in a fresh JVM), unless Spark has no type for one of its columns.
    """
    files = parquet.files
    try:
        schema = spark_schema(parquet.schema)
    except TypeError:
        schema = spark.read.parquet(str(files[0])).schema
    reads = [spark.read.schema(schema).parquet(str(file)) for file in files]
    for read in reads:
        _check_free(read)
    return reads


def _largest_row_group_bytes(files: Sequence[Path]) -> int:
    """The stored (compressed) size of the largest row group of the Parquet ``files``.

    Spark reads a whole row group in the split that holds its middle, so a split smaller
    than its row group is a task that reads nothing, yet still takes its share of the
    cores the conversion needs. The footers are read again here, once per file while
    the input is staged, rather than by every `ArrowSource`: a pyarrow run needs none of it."""
    largest = 0
    for file in files:
        meta = pq.ParquetFile(file).metadata
        for index in range(meta.num_row_groups):
            group = meta.row_group(index)
            stored = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            largest = max(largest, stored)
    return largest


def _positioned(reads: Sequence[DataFrame]) -> list[DataFrame]:
    """File reads with each row tagged `file index << 40 | row index in file`, the row
    index from Spark's `_metadata.row_index` (exact even when a file is split across
    partitions)."""
    from pyspark.sql import functions as F

    return [
        read.withColumn(
            POSITION,
            F.shiftleft(F.lit(index).cast("long"), _FILE_SHIFT) + F.col("_metadata.row_index"),
        )
        for index, read in enumerate(reads)
    ]


def _row_ids() -> Column:
    """Each row's `monotonically_increasing_id`: (partition index, row in partition).

    That is exactly a DataFrame's own order (partition index first), and the partitions
    are converted as they are, so partition index order is input order (the files of
    `SparkExchange` number their rows alike).
    """
    from pyspark.sql import functions as F

    return F.monotonically_increasing_id()


def _check_free(frame: DataFrame) -> None:
    if POSITION in frame.columns:
        raise SchemaError(f"input column {POSITION!r} is reserved")


def _event_schema(frame: DataFrame) -> pa.Schema:
    """The Arrow schema Spark's own conversion gives."""
    try:
        return arrow_schema(frame.schema)
    except TypeError as exc:
        raise SchemaError(f"a Spark column has no Arrow type: {exc}") from exc


def _planned_batches(
    frame: DataFrame, split_bytes: int | None, schema_json: str, files: Sequence[DataFrame]
) -> JavaObject:
    """`frame` as Spark's RDD of Arrow record batches (`spark_private.arrow_batches`), its
    file splits at most `split_bytes` large (the session's own limit if smaller), set only
    while Spark plans `frame`."""
    spark = frame.sparkSession
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key)
    if split_bytes is not None:
        spark.conf.set(key, str(min(split_bytes, size_bytes(before))))
    try:
        return spark_private.arrow_batches(
            frame, schema_json, files, POSITION, _FILE_SHIFT, rows_per_batch(spark)
        )
    finally:
        spark.conf.set(key, before)


def rows_per_batch(spark: SparkSession) -> int:
    """The rows of a converted Arrow batch (``spark.sql.execution.arrow.maxRecordsPerBatch``;
    all of them if not positive)."""
    rows = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000"))
    return rows if rows > 0 else 2**31 - 1


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def size_bytes(size: str) -> int:
    """A Spark size setting ("128MB", "64m", "134217728b", "1024") in bytes, read as
    Spark reads it (`JavaUtils.byteStringAsBytes`: binary units, bytes if none)."""
    found = re.fullmatch(r"\s*(\d+)\s*([kmgtp]?)b?\s*", size.lower())
    if found is None:
        raise UsageError(f"not a size: {size!r}")
    return int(found[1]) * _UNITS[found[2]]


_FETCHERS: dict[str, tuple[str, ray.actor.ActorHandle]] = {}
"""Each Spark application's partition fetcher (its name and handle), by application id."""


def _fetcher(spark: SparkSession) -> tuple[str, ray.actor.ActorHandle]:
    """The application's fetcher, started on first use (`spark_session` starts it)."""
    app = spark.sparkContext.applicationId
    if app not in _FETCHERS:
        _FETCHERS[app] = _start_fetcher()
    return _FETCHERS[app]


def _chunk_files_node(fetcher: ray.actor.ActorHandle) -> str:
    """The Ray node (its id in hex) whose Spark tasks hand their chunks to ``fetcher`` in
    files rather than as a call's argument: the fetcher's own."""
    return ray.get(fetcher.node.remote())


def _start_fetcher() -> tuple[str, ray.actor.ActorHandle]:
    """A new partition fetcher, under a name of its own: Spark's tasks look it up by it."""
    name = f"txstream-fetcher-{uuid.uuid4().hex}"
    return name, PartitionFetcher.options(name=name).remote()


def partition_table(
    chunk: Chunk | pa.Buffer | bytes, schema: pa.Schema
) -> tuple[pa.Table, int, int]:
    """A converted chunk (`SparkSource.partitions`, or its Arrow IPC stream) as a table of
    ``schema`` in input order, with the first and last input positions of its rows (-1 if
    it has none). A chunk file is mapped, not read: its rows stay in the page cache."""
    if isinstance(chunk, ray.ObjectRef):
        chunk = ray.get(chunk)
    elif isinstance(chunk, str):
        with pa.memory_map(chunk) as file:  # its buffer keeps the mapping
            chunk = file.read_buffer()
    table, first, last = _in_position_order(pa.ipc.open_stream(chunk).read_all())
    return (table if table.schema.equals(schema) else table.cast(schema)), first, last


def follow(last_position: int, first: int, last: int) -> int:
    """Check that a partition whose rows span input positions ``first..last`` comes after
    the previous ones, which ended at ``last_position``; the new last position.

    Rows inside a partition can be put back in order (`partition_table`); a partition that
    starts before the previous one ended cannot (its predecessors are already out)."""
    if first < 0:
        return last_position
    if first <= last_position:
        raise RuntimeFailure("Spark returned partitions out of input order")
    return last


def _in_position_order(table: pa.Table) -> tuple[pa.Table, int, int]:
    """A partition sorted by position if needed, without it; its first and last."""
    column = table.column(POSITION)
    if column.null_count:
        raise RuntimeFailure("Spark lost the input position of some rows")
    positions = column.to_numpy()
    if np.any(positions[1:] <= positions[:-1]):
        order = np.argsort(positions, kind="stable")
        table, positions = table.take(order), positions[order]
        if np.any(positions[1:] == positions[:-1]):
            raise RuntimeFailure("Spark returned an input position twice")
    if not len(positions):
        return table.drop_columns([POSITION]), -1, -1
    return table.drop_columns([POSITION]), int(positions[0]), int(positions[-1])
