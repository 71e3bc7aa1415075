"""pyspark's private interfaces are checked against the installed pyspark, and on one they
were not checked with, every use takes the public way (`txstream.connectors.spark_private`),
as does every use of Ray's (`txstream.cluster.ray_private`) on Spark's way."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from txstream.cluster import ray_private
from txstream.connectors import spark_driver, spark_private
from txstream.connectors.spark import size_bytes
from txstream.errors import UsageError

TIMEOUT_S = 600


def _untested(monkeypatch) -> None:
    """This process takes for an unchecked pyspark and Ray."""
    for module in (spark_private, ray_private):
        monkeypatch.setattr(module, "TESTED", ((0, 0), (0, 1)))
        monkeypatch.setattr(module, "_REPORTED", set())


def test_the_installed_pyspark_is_one_checked_with():
    assert spark_private.tested("anything")


def test_on_an_unchecked_pyspark_nothing_private_is_used(monkeypatch, caplog):
    _untested(monkeypatch)
    caplog.set_level(logging.WARNING, logger=spark_private.__name__)
    assert not spark_private.driver_launched()
    spark_private.launch_driver(None)  # no launch: a launch with no conf would fail loudly
    with pytest.raises(RuntimeError):
        spark_private.launch_driver_writing_to(None, 2)
    spark_driver.launch_early("error")
    assert spark_driver.take_early() is None
    spark_private.end_driver()
    assert ray_private.job_jvm_options() is None
    lines = [r.getMessage() for r in caplog.records if r.name == spark_private.__name__]
    assert sum(line.endswith(spark_private.EARLY_DRIVER) for line in lines) == 1, lines


def test_spark_sizes_read_as_spark_reads_them():
    assert size_bytes("128MB") == size_bytes("128m") == 128 << 20
    assert size_bytes("134217728b") == size_bytes("134217728") == 134217728
    assert size_bytes(" 2g ") == 2 << 30
    with pytest.raises(UsageError):
        size_bytes("lots")


UNCHECKED = """
import logging, sys
import pyarrow as pa, pyarrow.parquet as pq
from txstream.cluster import ray_private
from txstream.connectors import spark_private
ray_private.TESTED = spark_private.TESTED = ((0, 0), (0, 1))
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="log %(message)s")
from txstream.connectors import spark_driver
from txstream.connectors.spark import (
    SparkSource, _AppMaster, arrow_to_spark, on_ray, ray_for_spark, spark_session,
)

spark_driver.launch_early("error")
table = pa.table({
    "x": list(range(3000)),
    "y": [str(i) if i % 7 else None for i in range(3000)],
    "z": [i if i % 5 else None for i in range(3000)],
    "f": [i / 2 if i % 3 else None for i in range(3000)],
})
pq.write_table(table, sys.argv[1], row_group_size=1000)
with ray_for_spark():
    assert not _AppMaster.possible()
    with spark_session() as spark:
        assert not on_ray(spark)
        with SparkSource(sys.argv[1], partition_rows=1000) as source:
            got = pa.Table.from_batches(list(source.iter_batches(100)), schema=source.schema)
        assert got.equals(table), got
        back = pa.Table.from_pandas(arrow_to_spark(table, spark).toPandas(), preserve_index=False)
        assert back.cast(table.schema).equals(table), back.slice(0, 10)
spark_driver.end_spark_driver()
print("ran")
"""


def test_spark_on_an_unchecked_pyspark_and_ray_takes_every_public_way(tmp_path):
    """RayDP's own start (no app master as a Java actor), no driver launched ahead, the
    partitions through files, Arrow into Spark through `createDataFrame`, no driver ended
    ahead of this process; one log line each."""
    folder = Path(tempfile.mkdtemp(prefix="txs-unchecked-"))  # Ray's own folder in it
    try:
        proc = subprocess.run(
            [sys.executable, "-c", UNCHECKED, str(tmp_path / "x.parquet")],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, "TMPDIR": str(folder)},
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr[-4000:] + proc.stdout
    logged = [line for line in proc.stdout.splitlines() if line.startswith("log ")]
    for what in (
        spark_private.EARLY_DRIVER,
        spark_private.ON_RAY,
        "Arrow into Spark as one stream",
        "Spark's driver JVM ended with the run",
        "RayDP's app master started by RayDP",
    ):
        assert sum(line.endswith(what) for line in logged) == 1, (what, logged)
