"""Spark Structured Streaming into a session: a folder that grows during the test."""

from __future__ import annotations

import os
import threading
import time

import naive
import pyarrow.parquet as pq
from compare import assert_same_run
from txstream import Job
from txstream.connectors.streaming import foreach_batch
from txstream.topologies.generators import WorkloadSpec, generate


def test_a_growing_folder_read_by_spark_streaming_is_applied_once_in_order(spark, tmp_path):
    events, init = generate("gs", WorkloadSpec(events=3000, keys=40, theta=0.8, seed=7))
    incoming = tmp_path / "incoming"
    incoming.mkdir()

    def drop(i: int) -> None:
        pq.write_table(events.slice(i * 1000, 1000), incoming / f".part-{i}.parquet")
        os.replace(incoming / f".part-{i}.parquet", incoming / f"part-{i}.parquet")

    drop(0)
    schema = spark.read.parquet(str(incoming)).schema
    with Job("gs", scheduler="tstream", executors=2, progress=False).start(init) as session:
        push = foreach_batch(session)
        stream = (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(incoming))
            .writeStream.foreachBatch(push)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            grower = threading.Thread(target=lambda: [time.sleep(0.5) or drop(i) for i in (1, 2)])
            grower.start()
            grower.join()
            deadline = time.monotonic() + 120
            while session.watermark < events.num_rows and time.monotonic() < deadline:
                stream.processAllAvailable()
            replayed = spark.read.parquet(str(incoming / "part-0.parquet"))
            push(replayed, 0)  # Spark delivering batch 0 again: applied once
        finally:
            stream.stop()
        result = session.close()
    assert_same_run(result.events, result.state, *naive.run_model("gs", events, init))
