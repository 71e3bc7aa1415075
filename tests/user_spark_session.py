"""A user's own Spark (``local[2]``, not on Ray) in and out of a job, as a PySpark user runs
it: in a process of its own (one SparkContext per process; the suite's is RayDP's).

Prints ``ok <check>`` for each check that holds; tests/test_spark_user_session.py runs it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
from compare import assert_same_run
from local_engine import run_local

ROWS = 20_000
PARTITIONS = 4


def exchange_folders() -> list[str]:
    """The exchange folders left under the system's temporary folder."""
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob("txs-exchange-*"))


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this one's
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from txstream import Job, RuntimeFailure, SchemaError
    from txstream.connectors.spark import SparkSource, on_ray

    before = exchange_folders()
    spark = SparkSession.builder.master("local[2]").appName("user").getOrCreate()
    try:
        assert not on_ray(spark)
        # rows in a known order, not that of their ids: ids fall within each partition
        frame = spark.range(0, ROWS, numPartitions=PARTITIONS).selectExpr(
            f"{ROWS} - 1 - id AS event_id",
            "(id * 7919) % 7 AS vehicle",
            "(id * 31) % 5 AS segment",
            "(id * 13) % 230 AS speed",
        )
        want_table = pa.Table.from_pandas(frame.toPandas(), preserve_index=False)

        with SparkSource(frame, chunk_rows=1_500) as source:
            got = pa.Table.from_batches(source.iter_batches(4096), source.schema)
            assert source.num_partitions == PARTITIONS
        assert got.equals(want_table.cast(got.schema)), "rows out of the frame's order"
        print("ok order", flush=True)

        keys = pa.array(range(5), pa.int64())
        zeros = [0] * 5
        init = {"segment_speed": pa.table({"key": keys, "speed_sum": zeros, "speed_count": zeros})}
        result = Job("tp", progress=False).run(frame, init)
        want = run_local("tp", want_table, init)
        assert_same_run(result.events, result.state, want.events, want.state)
        print("ok results", flush=True)

        events, state = result.to_spark(spark)
        assert events.sparkSession is spark
        assert events.count() == ROWS
        assert events.schema.simpleString() == (
            "struct<ts:bigint,event_id:bigint,status:string,reason:string,toll:bigint,"
            "avg_speed:bigint,vehicle_count:bigint>"
        )
        assert [r["event_id"] for r in events.select("event_id").limit(3).collect()] == (
            result.events.column("event_id").to_pylist()[:3]
        )
        vehicles = state["segment_vehicles"].toPandas()["vehicle_count"].tolist()
        assert vehicles == result.state["segment_vehicles"].column("vehicle_count").to_pylist()
        print("ok to_spark", flush=True)
        assert exchange_folders() == before
        print("ok cleaned after success", flush=True)

        # count() prunes the column, the conversion computes it: the job fails mid-way
        failing = F.udf(lambda i: 1 // (i - ROWS // 2), "long")
        broken = frame.withColumn("speed", failing(F.col("event_id")))
        try:
            Job("tp", progress=False).run(broken, init)
        except RuntimeFailure as exc:
            assert "Spark failed to convert the input: ZeroDivisionError" in str(exc), exc
            assert "\n" not in str(exc), exc
        else:
            raise AssertionError("a failing Spark job gave a result")
        assert exchange_folders() == before
        print("ok cleaned after a failed job", flush=True)

        try:
            Job("tp", progress=False).run(frame.withColumnRenamed("speed", "pace"), init)
        except SchemaError:
            pass
        else:
            raise AssertionError("a frame of the wrong schema gave a result")
        assert exchange_folders() == before
        print("ok cleaned after a wrong schema", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
