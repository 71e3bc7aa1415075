"""SparkSource keeps input order through Spark's reordering partitions, read inside an actor."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from txstream.connectors import spark as spark_module
from txstream.connectors.spark import (
    POSITION,
    SparkSource,
    _in_position_order,
    follow,
    java_available,
    partition_table,
)
from txstream.connectors.spark_fetcher import PartitionFetcher, _Conversion
from txstream.errors import RuntimeFailure, SchemaError

pytestmark = pytest.mark.usefixtures("ray_cluster")

TIMEOUT_S = 300
FILE_ROWS = (30_000, 50_000, 20_000)


@ray.remote(num_cpus=0)
class Consumer:
    """Stands in for the ProgressController: unpickles the source and iterates it."""

    def consume(self, source: SparkSource, max_rows: int) -> tuple[pa.Table, int]:
        batches = list(source.iter_batches(max_rows))
        largest = max((b.num_rows for b in batches), default=0)
        return pa.Table.from_batches(batches, schema=source.schema), largest

    def consume_until_failure(self, source: SparkSource) -> tuple[int, str]:
        """Rows received before the source failed, and its error."""
        rows = 0
        try:
            for batch in source.iter_batches(1_000):
                rows += batch.num_rows
        except RuntimeFailure as exc:
            return rows, str(exc)
        return rows, ""


def _events(start: int, rows: int, rng: np.random.Generator) -> pa.Table:
    """SL-like events with nulls in scalar, string and list columns and in list elements."""
    ids = np.arange(start, start + rows, dtype=np.int64)
    keys = [
        None if i % 11 == 0 else [int(i), None, int(i) * 2][: 1 + i % 3]
        for i in range(start, start + rows)
    ]
    return pa.table(
        {
            "event_id": ids,
            "kind": pa.array(
                [None if i % 13 == 0 else ("deposit", "transfer")[i % 2] for i in ids]
            ),
            "account": pa.array(rng.integers(0, 1000, rows), mask=ids % 17 == 0),
            "amount": rng.integers(-(2**62), 2**62, rows),
            "keys": pa.array(keys, pa.list_(pa.int64())),
        }
    )


@pytest.fixture(scope="module")
def small_splits(spark):
    """Small splits: every file spans several Spark partitions."""
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key)
    spark.conf.set(key, "200000")
    yield spark
    spark.conf.set(key, before)


@pytest.fixture(scope="module")
def event_files(tmp_path_factory) -> tuple[str, pa.Table]:
    folder = tmp_path_factory.mktemp("events")
    rng = np.random.default_rng(7)
    tables, start = [], 0
    for index, rows in enumerate(FILE_ROWS):
        table = _events(start, rows, rng)
        pq.write_table(table, folder / f"part-{index:02d}.parquet", row_group_size=2_000)
        tables.append(table)
        start += rows
    # A file that is not Parquet by name is not input.
    (folder / "_SUCCESS").write_text("")
    expected = pa.concat_tables(
        [pq.read_table(folder / f"part-{i:02d}.parquet") for i in range(len(FILE_ROWS))]
    )
    return str(folder), expected


@pytest.fixture
def consumer():
    actor = Consumer.remote()
    yield actor
    ray.kill(actor)


def test_spark_itself_reorders_the_files(spark, small_splits, event_files):
    folder, expected = event_files
    frame = spark.read.parquet(folder)
    assert frame.rdd.getNumPartitions() > len(FILE_ROWS)
    # Spark packs file splits largest first: its own order is not the input order,
    # which is what makes the next test meaningful.
    seen = [row.event_id for row in frame.select("event_id").collect()]
    assert seen != expected.column("event_id").to_pylist()


def test_folder_comes_out_in_input_order_inside_an_actor(
    spark, small_splits, event_files, consumer
):
    folder, expected = event_files
    with SparkSource(folder, partition_rows=16_384) as source:
        table, largest = ray.get(consumer.consume.remote(source, 5_000), timeout=TIMEOUT_S)
    assert largest <= 5_000
    assert table.num_rows == sum(FILE_ROWS)
    assert table.equals(expected)


def test_schema_is_spark_columns_without_position(spark, small_splits, event_files):
    folder, expected = event_files
    with SparkSource(folder) as source:
        assert source.schema == pa.schema(
            [
                ("event_id", pa.int64()),
                ("kind", pa.string()),
                ("account", pa.int64()),
                ("amount", pa.int64()),
                ("keys", pa.list_(pa.int64())),
            ]
        )
        assert POSITION not in source.schema.names
        assert source.schema == expected.schema
        assert source.num_rows == sum(FILE_ROWS)


def test_file_splits_follow_partition_rows(spark, event_files, consumer):
    folder, expected = event_files
    file = f"{folder}/part-01.parquet"  # 50,000 rows in row groups of 2,000
    with SparkSource(file, partition_rows=4_000) as source:
        # Smaller than Spark's own splits, even those of `small_splits` (about 8 here).
        assert source.num_partitions >= 10
        table, largest = ray.get(consumer.consume.remote(source, 3_000), timeout=TIMEOUT_S)
    assert 0 < largest <= 3_000
    assert table.equals(expected.slice(FILE_ROWS[0], FILE_ROWS[1]))


def test_file_splits_hold_a_row_group_at_least(spark, event_files, consumer, tmp_path):
    """Splits smaller than a row group would be tasks that read nothing."""
    folder, expected = event_files
    rows = expected.slice(FILE_ROWS[0], FILE_ROWS[1])
    file = tmp_path / "groups.parquet"
    # 10 row groups of ~120 KB: larger than 1,000 rows' worth, smaller than the splits
    # Spark allows itself (200 KB under `small_splits`, which other tests of this module set)
    pq.write_table(rows, file, row_group_size=5_000)
    with SparkSource(str(file), partition_rows=1_000) as source:
        assert 10 <= source.num_partitions <= 11  # at most one split holds no row group
        table, _ = ray.get(consumer.consume.remote(source, 3_000), timeout=TIMEOUT_S)
    assert table.equals(rows)


def test_dataframe_keeps_its_own_order_not_value_order(spark, consumer):
    from pyspark.sql import functions as F

    high = spark.range(50_000, 90_000, numPartitions=3)
    low = spark.range(0, 50_000, numPartitions=4)
    frame = high.union(low).select(
        F.col("id").alias("event_id"),
        F.when(F.col("id") % 5 == 0, None).otherwise(F.array("id", F.col("id") + 1)).alias("keys"),
    )
    with SparkSource(frame, partition_rows=20_000) as source:
        assert source.num_rows == 90_000
        table, _ = ray.get(consumer.consume.remote(source, 7_000), timeout=TIMEOUT_S)
    ids = list(range(50_000, 90_000)) + list(range(50_000))
    assert table.column("event_id").to_pylist() == ids
    assert table.column("keys").to_pylist() == [None if i % 5 == 0 else [i, i + 1] for i in ids]
    assert table.schema.field("keys").type.value_type == pa.int64()


def test_conversion_runs_before_a_consumer_asks(spark, event_files):
    """The conversion job is submitted as the source is made (its tasks then start as soon
    as Spark has an executor), not when a consumer first asks for a partition."""
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    with SparkSource(event_files[0]):
        deadline = time.monotonic() + TIMEOUT_S
        while set(tracker.getJobIdsForGroup()) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(tracker.getJobIdsForGroup()) != before


def test_partitions_flow_before_conversion_ends_and_a_failure_reaches_the_consumer(spark, consumer):
    from pyspark.sql import functions as F

    fails = F.raise_error(F.lit("the fourth partition breaks"))
    frame = spark.range(0, 40_000, numPartitions=4).select(
        F.when(F.spark_partition_id() == 3, fails).otherwise(F.col("id")).alias("event_id")
    )
    with SparkSource(frame) as source:
        rows, error = ray.get(consumer.consume_until_failure.remote(source), timeout=TIMEOUT_S)
    # The conversion job never succeeded, so these rows were all handed over while it ran.
    assert rows == 30_000
    assert "Spark failed to convert the input" in error
    assert "the fourth partition breaks" in error


def test_java_missing_is_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    message = java_available()
    assert message is not None and "openjdk-17-jre-headless" in message


def test_files_with_different_columns_are_a_schema_error(spark, tmp_path):
    pq.write_table(pa.table({"event_id": [0, 1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"other": [2, 3]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaError):
        SparkSource(tmp_path)


def test_consumer_restores_order_inside_a_partition_and_rejects_overlap():
    shuffled = pa.table({"v": [30, 10, 20], POSITION: [3, 1, 2]})
    table, first, last = _in_position_order(shuffled)
    assert table.column_names == ["v"] and table.column("v").to_pylist() == [10, 20, 30]
    assert (first, last) == (1, 3)
    assert follow(0, first, last) == 3
    assert follow(3, -1, -1) == 3  # an empty partition
    with pytest.raises(RuntimeFailure):
        follow(3, 3, 4)
    with pytest.raises(RuntimeFailure):
        _in_position_order(pa.table({"v": [1, 2], POSITION: [5, 5]}))


def test_chunks_come_in_partition_then_chunk_order_past_empty_partitions():
    conversion = _Conversion(partitions=3)
    assert conversion.chunk(0) == 0  # wait for partition 0
    conversion.chunks[(1, 0)] = "p1c0"
    conversion.counts[0] = 0  # partition 0 had no rows
    assert conversion.chunk(0) == ["p1c0"]
    assert conversion.chunk(1) == 1  # partition 1 may have more chunks
    conversion.chunks[(1, 1)] = "p1c1"
    conversion.counts[1] = 2
    assert conversion.chunk(1) == ["p1c1"]
    assert conversion.chunk(2) == 2
    conversion.counts[2] = 0
    assert conversion.chunk(2) == []  # past the last chunk


def _one_row_group(folder) -> int:
    """A Parquet file of one row group (40,000 event ids) in ``folder``; its rows."""
    rows = 40_000
    pq.write_table(pa.table({"event_id": np.arange(rows)}), folder / "one.parquet")
    return rows


def test_a_row_group_is_handed_over_in_chunks(spark, tmp_path):
    """Spark does not split a Parquet row group; its task hands it over in chunks of about
    `chunk_rows` rows (whole Arrow batches), so reading starts before it is converted."""
    rows = _one_row_group(tmp_path)
    with SparkSource(tmp_path, chunk_rows=10_000) as source:
        chunks = [partition_table(c, source.schema)[0] for c in source.partitions()]
    assert [chunk.num_rows for chunk in chunks] == [10_000] * 4
    assert pa.concat_tables(chunks).column("event_id").to_pylist() == list(range(rows))


def _chunk_files(spark) -> list[str]:
    """Chunk files (`RayChunks`) left in the folders where Spark's executor keeps its
    temporary files: Spark's scratch folder and, under RayDP, this Ray session's."""
    folders = [
        spark.conf.get("spark.local.dir"),
        ray._private.worker._global_node.get_session_dir_path(),
    ]
    return [
        os.path.join(folder, name)
        for top in folders
        for folder, _, names in os.walk(top)
        for name in names
        if name.startswith("txstream-chunk-")
    ]


def test_a_row_group_read_beside_the_fetcher_is_mapped_from_files_removed_with_the_source(
    spark, tmp_path
):
    """Spark's executor and the reader run on the fetcher's node here: every chunk is handed
    over as a file in Ray's session folder (which a killed run's reaper removes), read where
    it lies, and removed when the source is closed."""
    rows = _one_row_group(tmp_path)
    session = ray._private.worker._global_node.get_session_dir_path()
    with SparkSource(tmp_path, chunk_rows=10_000) as source:
        chunks = list(source.partitions())
        assert all(isinstance(chunk, str) and chunk.startswith(session) for chunk in chunks)
        assert sorted(_chunk_files(spark)) == sorted(chunks)
        tables = [partition_table(chunk, source.schema)[0] for chunk in chunks]
    assert _chunk_files(spark) == []
    assert pa.concat_tables(tables).column("event_id").to_pylist() == list(range(rows))


def test_a_task_on_another_node_sends_its_chunks_as_a_calls_argument(spark, tmp_path, monkeypatch):
    """A task that is not on the fetcher's node cannot hand it a file: it sends the chunk's
    bytes instead, and the chunks read the same."""
    monkeypatch.setattr(spark_module, "_chunk_files_node", lambda fetcher: "ff" * 28)
    rows = _one_row_group(tmp_path)
    with SparkSource(tmp_path, chunk_rows=10_000) as source:
        chunks = list(source.partitions())
        assert all(isinstance(chunk, ray.ObjectRef) for chunk in chunks)
        tables = [partition_table(chunk, source.schema)[0] for chunk in chunks]
    assert [table.num_rows for table in tables] == [10_000] * 4
    assert pa.concat_tables(tables).column("event_id").to_pylist() == list(range(rows))


def test_a_chunk_file_is_mapped_on_its_node_and_copied_for_another(tmp_path):
    """A chunk file stays until its source is removed: a consumer on the fetcher's node gets
    its path, one elsewhere a copy in the object store. The file of a chunk made twice is
    removed at once (the first one is kept)."""
    table = pa.table({"event_id": np.arange(1_000)})
    files = []
    for attempt in range(2):
        files.append(tmp_path / f"chunk-{attempt}.arrows")
        with pa.ipc.new_stream(files[-1], table.schema) as writer:
            writer.write_table(table.slice(attempt))
    fetcher = PartitionFetcher.remote()
    try:
        here = ray.get(fetcher.node.remote())
        ray.get(fetcher.add.remote("source", 1))
        for path in files:
            ray.get(fetcher.stored_file.remote("source", 0, 0, str(path)))
        assert [path.exists() for path in files] == [True, False]
        assert ray.get(fetcher.fetch.remote("source", 0, here)) == [str(files[0])]
        [copy] = ray.get(fetcher.fetch.remote("source", 0, "ff" * 28))
        assert pa.ipc.open_stream(ray.get(copy)).read_all().equals(table)
        ray.get(fetcher.remove.remote("source"))
        assert not files[0].exists()
    finally:
        ray.kill(fetcher)


def test_the_app_master_is_a_java_actor_of_this_job(spark):
    """On a Ray started with `ray_job_config`, no Python actor and no JVM of RayDP's own
    stand between Ray and Spark's app master."""
    from pathlib import Path

    from txstream.cluster.scratch import descendants
    from txstream.connectors.spark import _AppMaster

    assert _AppMaster.possible()
    gateways = []
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"AppMasterEntryPoint" in cmdline:
            gateways.append(pid)
    assert gateways == []


FALLBACK = """
import logging, sys
import pyarrow as pa, pyarrow.parquet as pq
from ray.job_config import JobConfig
from txstream.cluster.ray_runtime import ray_session
from txstream.connectors.spark import SparkSource, _AppMaster, spark_session
from txstream.connectors.spark_driver import JVM_OPTIONS

pq.write_table(pa.table({"x": list(range(1000))}), sys.argv[1])
with ray_session(job_config=JobConfig(jvm_options=list(JVM_OPTIONS)), log_to_driver=False):
    assert not _AppMaster.possible()
    with spark_session() as session, SparkSource(sys.argv[1]) as source:
        rows = sum(batch.num_rows for batch in source.iter_batches(100))
print(rows)
"""


def test_a_ray_without_sparks_class_path_starts_spark_through_raydp(tmp_path):
    """A Ray started without `ray_job_config` (the user's): RayDP starts its app master
    its own way, through a Python actor and a JVM of its own."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", FALLBACK, str(tmp_path / "x.parquet")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1000"]
