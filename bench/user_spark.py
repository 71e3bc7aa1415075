"""Events/s through a user's own Spark (``local[2]``, not on Ray): from ``Job.run`` on a
DataFrame of it until the events of ``to_spark`` have been counted in that same session.

The session is up, and has read the input once, before the clock starts (a PySpark user's
Spark is running already); the run's own Ray start-up is in the figure. The input is a
generated workload's folder (``txstream generate sl --events 4000000 --out DIR``). Also
timed apart: `Result.to_spark` through txstream's Arrow stream, through
``spark.createDataFrame`` of pandas with Arrow on, and through a Parquet file read back.

Results: bench/results/user_spark.json.

    python bench/user_spark.py DIR [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from common import write_results
from txstream import Job


def to_spark_ways(table, spark) -> dict[str, float]:
    """Seconds until a counted DataFrame of ``table``, each way."""
    from txstream.connectors.spark import arrow_to_spark

    seconds = {}
    begin = time.perf_counter()
    arrow_to_spark(table, spark).count()
    seconds["arrow_stream_s"] = time.perf_counter() - begin
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    begin = time.perf_counter()
    spark.createDataFrame(table.to_pandas()).count()
    seconds["create_from_pandas_s"] = time.perf_counter() - begin
    with tempfile.TemporaryDirectory(prefix="txs-bench-") as folder:
        begin = time.perf_counter()
        pq.write_table(table, Path(folder) / "events.parquet")
        spark.read.parquet(folder).count()
        seconds["parquet_s"] = time.perf_counter() - begin
    return {k: round(v, 3) for k, v in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").appName("user").getOrCreate()
    try:
        frame = spark.read.parquet(str(args.workload / "events.parquet"))
        rows = frame.count()
        runs = []
        for _ in range(args.repeat):
            begin = time.perf_counter()
            result = Job("sl", progress=False).run(frame, args.workload / "init")
            ran = time.perf_counter()
            events, _ = result.to_spark(spark)
            assert events.count() == rows
            end = time.perf_counter()
            runs.append(
                {
                    "seconds": round(end - begin, 3),
                    "run_s": round(ran - begin, 3),
                    "to_spark_s": round(end - ran, 3),
                    "spark_staging_s": result.metrics.get("spark", {}).get("staging_s"),
                    "startup_s": result.metrics.get("startup_s"),
                }
            )
            print(runs[-1], flush=True)
        best = min(runs, key=lambda r: r["seconds"])
        payload = {
            "events": rows,
            "input_partitions": frame.rdd.getNumPartitions(),
            "spark_master": spark.sparkContext.master,
            "events_per_s": round(rows / statistics.median(r["seconds"] for r in runs)),
            "best_events_per_s": round(rows / best["seconds"]),
            "runs": runs,
            "to_spark_ways": to_spark_ways(result.events, spark),
        }
        print(payload, flush=True)
        print(write_results("user_spark", payload))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
