"""pyspark's private interfaces that txstream uses, each for a gain the public API does not give.

Each is checked against the installed pyspark when used (`tested`): on a pyspark these were
not checked against, the public way is taken instead, and one log line says so.
docs/design.md ("Private interfaces") lists them with their gains and fallbacks. Light on
purpose (pyspark is imported only when a function needs it): `spark_driver` asks it before
the engine is imported.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from txstream.connectors import spark_converter
from txstream.connectors.spark_converter import CONVERTER_CLASS
from txstream.errors import UsageError

if TYPE_CHECKING:  # pyspark is imported only when Spark is used
    import pyarrow as pa
    from py4j.java_gateway import JavaObject
    from pyspark import SparkConf
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

TESTED = ((3, 5), (3, 6))
"""pyspark versions whose internals this module was checked against: 3.5 up to, not
including, 3.6."""

_LOG = logging.getLogger(__name__)
_REPORTED: set[str] = set()
"""The interfaces whose fallback has been logged (once per process each)."""


def installed() -> str:
    """The installed pyspark's version ("" if there is none)."""
    try:
        return version("pyspark")
    except PackageNotFoundError:
        return ""


def tested(what: str) -> bool:
    """Whether the installed pyspark is one this module was checked against; if not, one
    log line (once per ``what``) saying that ``what`` takes the public way."""
    found = installed()
    parts = re.match(r"(\d+)\.(\d+)", found)
    if parts and TESTED[0] <= (int(parts[1]), int(parts[2])) < TESTED[1]:
        return True
    if what not in _REPORTED:
        _REPORTED.add(what)
        _LOG.warning("pyspark %s is not one txstream was checked with: %s", found, what)
    return False


# Spark's driver JVM (pyspark's gateway), launched ahead of its SparkContext


EARLY_DRIVER = "Spark's driver JVM launched with its SparkContext, not ahead of it"


def launch_driver(conf: SparkConf) -> None:
    """Launch Spark's driver JVM with ``conf`` unless one runs, under pyspark's own lock,
    for a SparkContext created later to use; nothing on an unchecked pyspark (the
    SparkContext launches it). A failed launch is left to the SparkContext to say."""
    if not tested(EARLY_DRIVER):
        return
    from pyspark.context import SparkContext

    try:
        SparkContext._ensure_initialized(conf=conf)
    except Exception:
        _LOG.debug("early launch of Spark's driver failed", exc_info=True)


def launch_driver_writing_to(conf: SparkConf, output: int) -> None:
    """Launch Spark's driver JVM with ``conf``, its stdout and stderr on the descriptor
    ``output``, for a SparkContext created later to use. Raises if the launch fails, or
    on an unchecked pyspark (then nothing is launched)."""
    if not tested(EARLY_DRIVER):
        raise RuntimeError("no early launch on this pyspark")
    from pyspark.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(conf, popen_kwargs={"stdout": output, "stderr": output})
    SparkContext._ensure_initialized(gateway=gateway)


def driver_launched() -> bool:
    """Whether this process has launched Spark's driver JVM (False on an unchecked
    pyspark: nothing is then launched ahead)."""
    import sys

    pyspark = sys.modules.get("pyspark")
    if pyspark is None or not tested(EARLY_DRIVER):
        return False
    return pyspark.SparkContext._gateway is not None


def end_driver() -> None:
    """End Spark's driver JVM if this process launched it, and wait until it has; on an
    unchecked pyspark, nothing (it ends after this process does)."""
    import sys

    if "pyspark" not in sys.modules or not tested("Spark's driver JVM ended with the run"):
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    driver = getattr(gateway, "proc", None)
    if driver is None or driver.poll() is not None:
        return
    # first the gateway: a Java object dropped later would tell the dead JVM so and log
    # an error with its traceback on stderr (py4j's finalizers)
    gateway.shutdown()
    driver.kill()
    driver.wait()


# Arrow into Spark


def frame_from_arrow(batches: list[pa.RecordBatch], schema: StructType, spark: SparkSession):
    """Arrow record batches (of Spark's exact types for ``schema``) as a DataFrame of
    ``spark``, one partition a batch: handed to the JVM as one Arrow stream, without pandas
    (columns of many chunks, as a long run's, need no copy). On an unchecked pyspark,
    pyspark's public `createDataFrame`: of the Arrow table itself on pyspark 4, of a pandas
    frame through Arrow before."""
    from pyspark.sql import DataFrame

    if not tested("Arrow into Spark as one stream"):
        import pyarrow as pa

        return _public_frame_from_arrow(pa.Table.from_batches(batches), schema, spark)
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer

    jvm = spark._jvm
    stream = spark.sparkContext._serialize_to_jvm(
        batches,
        ArrowStreamSerializer(),
        jvm.PythonSQLUtils.readArrowStreamFromFile,
        jvm.ArrowIteratorServer,
    )
    return DataFrame(
        jvm.PythonSQLUtils.toDataFrame(stream, schema.json(), spark._jsparkSession), spark
    )


def _public_frame_from_arrow(table: pa.Table, schema: StructType, spark: SparkSession):
    major = re.match(r"\d+", installed())
    if major and int(major[0]) >= 4:
        return spark.createDataFrame(table, schema)
    import pandas as pd

    # pyspark 3.5 takes neither pandas' Arrow-backed strings nor integers with nulls as
    # floats: objects, None for a null, for both
    frame = table.to_pandas(integer_object_nulls=True)
    for name in frame.columns:
        if isinstance(frame[name].dtype, pd.StringDtype):
            frame[name] = frame[name].astype(object).where(frame[name].notna(), None)
    key = "spark.sql.execution.arrow.pyspark.enabled"
    before = spark.conf.get(key, "false")
    spark.conf.set(key, "true")
    try:
        return spark.createDataFrame(frame, schema)
    finally:
        spark.conf.set(key, before)


# Spark on Ray: partitions converted by txstream's Java classes in Spark's JVMs


ON_RAY = "Spark on Ray hands its partitions to Ray actors, not through files"
"""What `on_ray` falls back from: the functions below are used only when it is tested."""


def arrow_schema_json(frame: DataFrame) -> str:
    """The Arrow schema of `frame`'s converted batches, as RayDP's staging gives it."""
    writer = frame.sparkSession.sparkContext._jvm.org.apache.spark.sql.raydp.ObjectStoreWriter
    return writer.toArrowSchema(frame._jdf).toJson()


def arrow_batches(
    frame: DataFrame,
    schema_json: str,
    files: Sequence[DataFrame],
    position: str,
    file_shift: int,
    rows: int,
) -> JavaObject:
    """`frame` as Spark's RDD of serialized Arrow record batches of at most ``rows`` rows
    (its Java view), its file splits planned. When it is the union of the Parquet reads
    `files` (each tagged with its rows' ``position``: file index ``<< file_shift`` plus row
    index), their scans are copied column by column if they can be (`_columnar_rdd`);
    otherwise Spark's `toArrowBatchRdd` converts `frame` row by row, like a DataFrame."""
    rdd = _columnar_rdd(frame, schema_json, files, position, file_shift, rows) if files else None
    rdd = (frame._jdf.toArrowBatchRdd() if rdd is None else rdd).toJavaRDD()
    rdd.getNumPartitions()  # plans the file splits now
    return rdd


_COLUMNAR_TYPES = frozenset(
    ("boolean", "byte", "short", "integer", "long", "float", "double")
    + ("string", "binary", "date", "timestamp", "timestamp_ntz")
)
"""Spark types `ArrowColumns` copies (`DataType.typeName()`)."""


def _columnar_rdd(
    frame: DataFrame,
    schema_json: str,
    files: Sequence[DataFrame],
    position: str,
    shift: int,
    rows: int,
) -> JavaObject | None:
    """The files' Parquet scans' columnar batches copied into Arrow column by column
    (`ArrowColumns`, compiled by ``./setup``: `txstream.connectors.spark_converter`): the
    batches `toArrowBatchRdd` makes from their union `frame` (schema ``schema_json``, at
    most ``rows`` rows), without its whole-stage row loop and row-by-row
    `ArrowWriter`. Each ``position`` is the file's index ``<< shift`` plus the row's index
    in the file, which the converter counts from the footer's row groups of the split it
    reads (Spark's `_metadata.row_index` column costs a boxed number per row), so the
    scans (of `files`, without positions) read the data columns only. None (said at debug
    level) when a column has a type it does not copy or a scan is not columnar."""
    unsupported = [f.name for f in frame.schema if f.dataType.typeName() not in _COLUMNAR_TYPES]
    if unsupported:
        return _row_path(f"no columnar copy of columns {unsupported}")
    names = [name for name in frame.columns if name != position]
    scans, ordinals = [], None
    for read in files:
        scan = read._jdf.queryExecution().executedPlan().collectLeaves().apply(0)
        if scan.getClass().getSimpleName() != "FileSourceScanExec" or not scan.supportsColumnar():
            return _row_path(f"the plan's scan is not columnar: {scan.nodeName()}")
        output = [scan.output().apply(i).name() for i in range(scan.output().size())]
        found = [output.index(name) for name in names] if set(names) <= set(output) else None
        if found is None or ordinals not in (None, found):
            return _row_path(f"the scans read {output}, not {names}")
        ordinals = found
        scans.append(scan.executeColumnar())
    spark = frame.sparkSession
    gateway, jvm = spark.sparkContext._gateway, spark._jvm
    columns = gateway.new_array(jvm.int, len(names))
    for index, ordinal in enumerate(ordinals):
        columns[index] = ordinal
    scan_list = jvm.java.util.ArrayList()
    for scan in scans:
        scan_list.add(scan)
    _LOG.debug("Spark converts the input column by column")
    converter = spark_object(spark, CONVERTER_CLASS)
    return converter.files(scan_list, schema_json, columns, shift, rows)


def _row_path(reason: str) -> None:
    _LOG.debug("Spark converts the input row by row: %s", reason)


def spark_object(spark: SparkSession, name: str) -> JavaObject:
    """A new object of txstream's class ``name`` in the driver, its jar added to the Spark
    application (``ADD JAR``: the executors load it from there, the driver from the
    session's class loader); the jar is compiled first if it is missing."""
    jar = spark_converter.CONVERTER_JAR
    if not jar.is_file():
        _LOG.info("compiling txstream's Spark classes (./setup does)")
        try:
            spark_converter.build(jar)
        except Exception as exc:
            raise UsageError(f"cannot compile txstream's Spark classes: {exc}") from None
    added = spark.sparkContext._jsc.sc().listJars().mkString("\n").splitlines()
    if not any(url.rsplit("/", 1)[-1] == jar.name for url in added):
        spark.sql(f"ADD JAR '{jar}'")
    loader = spark._jsparkSession.sharedState().jarClassLoader()
    no_classes = spark.sparkContext._gateway.new_array(spark._jvm.java.lang.Class, 0)
    no_args = spark.sparkContext._gateway.new_array(spark._jvm.java.lang.Object, 0)
    return loader.loadClass(name).getDeclaredConstructor(no_classes).newInstance(no_args)
