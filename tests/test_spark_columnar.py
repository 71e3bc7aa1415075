"""A Parquet input is converted column by column, into exactly what the row path gives."""

from __future__ import annotations

import datetime
import logging
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txstream.connectors import spark_converter, spark_private
from txstream.connectors.spark import SparkSource
from txstream.connectors.spark_converter import (
    CHUNKS_CLASS,
    CONVERTER_CLASS,
    CONVERTER_JAR,
)

FILE_ROWS = (25_000, 0, 14_000, 1)
"""Several files, one of them empty: splits and batches that do not line up."""
SMALL_DICTIONARY_BYTES = 2_048
"""The first file's dictionary pages: a column chunk's values turn from dictionary ids to
plain values part of the way through (Parquet's fallback), inside a scan's batch."""


def _columns(start: int, rows: int) -> pa.Table:
    """Every type the converter copies, each with nulls (none in event_id)."""
    ids = np.arange(start, start + rows, dtype=np.int64)
    rng = np.random.default_rng(start)

    def nulls(every: int) -> np.ndarray:
        return ids % every == 0

    day = datetime.date(2024, 1, 1)
    return pa.table(
        {
            "event_id": ids,
            "kind": pa.array(
                [("deposit", "transfer", "δ-ü")[i % 3] for i in ids], pa.string(), mask=nulls(13)
            ),
            "amount": pa.array(rng.integers(-(2**62), 2**62, rows), mask=nulls(7)),
            "flag": pa.array(ids % 3 == 0, mask=nulls(5)),
            "tiny": pa.array((ids % 100).astype(np.int8), mask=nulls(11)),
            "small": pa.array((ids % 30_000).astype(np.int16), mask=nulls(17)),
            "count": pa.array(ids.astype(np.int32), mask=nulls(19)),
            "ratio": pa.array(ids.astype(np.float32) / 3, mask=nulls(23)),
            "price": pa.array(ids / 7.0, mask=nulls(29)),
            "blob": pa.array(
                [bytes([i % 256]) * (i % 5) for i in ids], pa.binary(), mask=nulls(31)
            ),
            "day": pa.array(
                [day + datetime.timedelta(days=int(i % 900)) for i in ids],
                pa.date32(),
                mask=nulls(37),
            ),
            "at": pa.array(ids * 1_000_003, pa.timestamp("us", tz="UTC"), mask=nulls(41)),
        }
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[str, pa.Table]:
    folder = tmp_path_factory.mktemp("columnar")
    tables, start = [], 0
    for index, rows in enumerate(FILE_ROWS):
        table = _columns(start, rows)
        small = {"dictionary_pagesize_limit": SMALL_DICTIONARY_BYTES, "data_page_size": 4_096}
        pq.write_table(
            table,
            folder / f"part-{index}.parquet",
            row_group_size=3_000,
            **(small if index == 0 else {}),
        )
        tables.append(table)
        start += rows
    return str(folder), pa.concat_tables(tables)


@pytest.fixture
def small_splits(spark):
    """Splits of ~2 row groups and Arrow batches of 2,500 rows: a file spans several
    partitions, an Arrow batch several of the scan's batches (4,096 rows)."""
    keys = {
        "spark.sql.files.maxPartitionBytes": "100000",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "2500",
    }
    before = {key: spark.conf.get(key) for key in keys}
    for key, value in keys.items():
        spark.conf.set(key, value)
    yield spark
    for key, value in before.items():
        spark.conf.set(key, value)


def _drain(folder: str, monkeypatch, *, columnar: bool) -> tuple[pa.Table, list[bool], int]:
    """The source's events, per conversion whether it was columnar, its partitions."""
    taken: list[bool] = []
    columnar_rdd = spark_private._columnar_rdd

    def spy(*args):
        rdd = columnar_rdd(*args) if columnar else None
        taken.append(rdd is not None)
        return rdd

    with monkeypatch.context() as patch:
        patch.setattr(spark_private, "_columnar_rdd", spy)
        with SparkSource(folder, partition_rows=4_000) as source:
            batches = list(source.iter_batches(1_000))
            table = pa.Table.from_batches(batches, schema=source.schema)
    return table, taken, source.num_partitions


def test_columnar_path_equals_the_row_path(spark, small_splits, files, monkeypatch):
    folder, expected = files
    columnar, taken, partitions = _drain(folder, monkeypatch, columnar=True)
    rows, not_taken, _ = _drain(folder, monkeypatch, columnar=False)
    assert taken == [True] and not_taken == [False]
    assert partitions > len(FILE_ROWS)
    assert columnar.num_rows == sum(FILE_ROWS)
    assert columnar.equals(rows)
    # and in input order, with the input's values and nulls
    assert columnar.column("event_id").to_pylist() == list(range(sum(FILE_ROWS)))
    for name in ("kind", "amount", "flag", "tiny", "small", "blob", "day"):
        assert columnar.column(name).equals(
            expected.column(name).cast(columnar.schema.field(name).type)
        )


def test_unsupported_columns_take_the_row_path(spark, tmp_path, caplog, monkeypatch):
    table = pa.table({"event_id": [0, 1, 2], "keys": [[1], None, [2, 3]]})
    pq.write_table(table, tmp_path / "lists.parquet")
    with caplog.at_level(logging.DEBUG, logger=spark_private.__name__):
        columnar, taken, _ = _drain(str(tmp_path), monkeypatch, columnar=True)
    assert taken == [False]
    assert columnar.equals(table)
    assert "row by row: no columnar copy of columns ['keys']" in caplog.text


def test_a_missing_jar_is_compiled_at_first_use(spark, files, tmp_path, monkeypatch):
    assert CONVERTER_JAR.is_file(), "./setup compiles the converter"
    folder, expected = files
    jar = tmp_path / "compiled-at-first-use.jar"
    monkeypatch.setattr(spark_converter, "CONVERTER_JAR", jar)
    table, taken, _ = _drain(folder, monkeypatch, columnar=True)
    assert jar.is_file() and taken == [True]
    assert table.column("event_id").to_pylist() == list(range(sum(FILE_ROWS)))


def test_janino_compiles_the_converter_without_javac(tmp_path, monkeypatch):
    """A machine with only a Java runtime: Janino, from pyspark's jars, compiles it."""
    which = spark_converter.shutil.which
    monkeypatch.setattr(
        spark_converter.shutil, "which", lambda name: None if name == "javac" else which(name)
    )
    assert "CompilerDemo" in " ".join(spark_converter._compile_command(tmp_path))
    jar = spark_converter.build(tmp_path / "converter.jar")
    names = zipfile.ZipFile(jar).namelist()
    for name in (CONVERTER_CLASS, CHUNKS_CLASS):
        assert name.replace(".", "/") + ".class" in names
