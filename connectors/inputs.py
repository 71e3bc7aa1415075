"""The one way in: whatever a user hands over as events, made one `Source` of the
topology's events (`event_source`). `Job.run`, a session's ``push`` and the session over
several nodes take events through it, so they take the same things and refuse them alike.

Spark is imported only for a Spark DataFrame (recognised by its type's module, without
importing pyspark) or for Parquet files that Spark is to read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa
from txstream.connectors.extras import require_spark
from txstream.connectors.sources import ArrowSource, Source
from txstream.errors import SchemaError, UsageError

if TYPE_CHECKING:  # pyspark is imported only when Spark is used
    from pyspark.sql import DataFrame
    from txstream.topologies.api import Topology

Events: TypeAlias = (
    "pa.Table | pa.RecordBatch | pa.RecordBatchReader | Iterable[pa.RecordBatch]"
    " | str | os.PathLike[str] | DataFrame | Source"
)
"""What `event_source` takes."""

ACCEPTED = (
    "an Arrow table or record batches (a RecordBatch, a list or iterator of them, a "
    "RecordBatchReader), a Parquet file or folder, a Spark DataFrame or a Source"
)


def event_source(
    events: Events,
    topology: Topology,
    read_files: str = "arrow",
    exchange_dir: str | os.PathLike | None = None,
) -> Source:
    """``events`` as one `Source` whose schema is ``topology``'s events; `SchemaError`
    if it is not, `UsageError` for a kind of input not taken.

    Takes an Arrow table or record batches (a RecordBatch, a list or iterator of them, a
    RecordBatchReader, read whole: an `ArrowSource` of the table), a Parquet file or
    folder (files in name order; an `ArrowSource` of files too), a Spark DataFrame (of any
    classic Spark session: RayDP's on this Ray, a local one, a cluster) or any `Source`
    that knows its number of rows. Parquet files are read by pyarrow, or by Spark with
    ``read_files="spark"``. What Spark reads is staged by it in input order
    (`txstream.connectors.spark.SparkSource`, which needs a running Spark; whoever called
    this closes it; ``exchange_dir``: the folder shared with the executors of a Spark that
    is neither on Ray nor local). It is `checked_events`, then `staged`: a caller that
    starts Spark only for good input calls those two apart.
    """
    checked = checked_events(events, topology, read_files)
    return staged(checked, topology, read_files, exchange_dir)


def checked_events(
    events: Events, topology: Topology, read_files: str = "arrow"
) -> Source | DataFrame:
    """``events`` checked as far as can be before Spark starts (see `event_source`): a
    `Source`, or a Spark DataFrame as it is (Spark checks it as it stages it). Parquet
    files are checked from their footers; if Spark is to read them, Java must be there."""
    if is_spark_dataframe(events):
        if type(events).__module__.startswith("pyspark.sql.connect"):
            raise UsageError(
                "a Spark Connect DataFrame cannot be read: txstream needs a classic "
                "SparkSession (its driver in this process), or Arrow data or Parquet files"
            )
        return events
    source = _source(events, topology)
    if source.num_rows is None:
        raise UsageError("a Source of events must know its number of rows (num_rows)")
    topology.check_event_schema(source.schema)
    if needs_spark(source, read_files):
        require_spark(
            "source='spark' (Parquet files read by Spark)", on_ray=False, instead="source='arrow'"
        )
        from txstream.connectors.spark_driver import java_available

        problem = java_available()
        if problem:
            raise UsageError(problem)
    return source


def needs_spark(events: Source | DataFrame, read_files: str = "arrow") -> bool:
    """Whether `staged` has Spark read ``events`` (from `checked_events`): a Spark
    DataFrame, or Parquet files when ``read_files`` is ``"spark"``."""
    if is_spark_dataframe(events):
        return True
    return read_files == "spark" and isinstance(events, ArrowSource) and bool(events.files)


def staged(
    events: Source | DataFrame,
    topology: Topology,
    read_files: str = "arrow",
    exchange_dir: str | os.PathLike | None = None,
) -> Source:
    """``events`` (from `checked_events`) as the source to push: staged by Spark if it
    reads them (`needs_spark`; Spark must be running, see `event_source` for
    ``exchange_dir``), its schema checked; else as they are."""
    if not needs_spark(events, read_files):
        return events
    from txstream.connectors import spark

    if not spark.spark_running():
        raise UsageError(
            "source 'spark' reads Parquet files with Spark: start it (see "
            "txstream.connectors.spark.spark_session) or use source='arrow'"
        )
    source = spark.SparkSource(events, exchange_dir=exchange_dir)
    try:
        topology.check_event_schema(source.schema)
    except BaseException:
        source.close()
        raise
    return source


def staged_by_spark(source: object) -> bool:
    """Whether ``source`` is staged by Spark (a `txstream.connectors.spark.SparkSource`),
    without importing Spark's connector otherwise: such a source exists only once it is
    loaded."""
    spark = sys.modules.get("txstream.connectors.spark")
    return spark is not None and isinstance(source, spark.SparkSource)


def is_spark_dataframe(data: object) -> bool:
    """Whether ``data`` is a Spark DataFrame (without importing pyspark otherwise)."""
    return type(data).__module__.startswith("pyspark.sql")


def _source(events: Any, topology: Topology) -> Source:
    """The `Source` of anything but a Spark DataFrame (see `event_source`)."""
    if hasattr(events, "iter_batches"):
        return events
    if isinstance(events, str | os.PathLike):
        return ArrowSource(events)
    return ArrowSource(_table(events, topology))


def _table(events: Any, topology: Topology) -> pa.Table:
    """Arrow data in memory as one (validated) table."""
    if isinstance(events, pa.Table):
        table = events
    elif isinstance(events, pa.RecordBatch):
        table = pa.Table.from_batches([events])
    elif isinstance(events, pa.RecordBatchReader):
        table = events.read_all()
    elif isinstance(events, Iterable) and not isinstance(events, str | bytes | dict):
        batches = list(events)
        wrong = next((b for b in batches if not isinstance(b, pa.RecordBatch)), None)
        if wrong is not None:
            kind = f"sequence of {type(wrong).__name__}"
            raise UsageError(f"events cannot be a {kind}: give {ACCEPTED}")
        try:
            table = pa.Table.from_batches(batches, None if batches else topology.event_schema)
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"events: record batches of different schemas ({exc})") from exc
    else:
        raise UsageError(f"events cannot be a {type(events).__name__}: give {ACCEPTED}")
    table.validate()
    return table
