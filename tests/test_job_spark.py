"""The Spark path of a Job: Spark source equals Arrow source; results as Spark DataFrames."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from txstream import Job
from txstream.topologies import BUNDLED
from workloads import workloads

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.mark.parametrize("topology", BUNDLED)
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_spark_source_equals_arrow_source(spark, tmp_path_factory, topology, data):
    events, init = data.draw(workloads(topology))
    folder = tmp_path_factory.mktemp("events")
    half = events.num_rows // 2
    pq.write_table(events.slice(0, half), folder / "a.parquet", row_group_size=7)
    pq.write_table(events.slice(half), folder / "b.parquet", row_group_size=7)
    job = Job(topology, punctuation_interval=5, progress=False)
    via_spark = Job(topology, source="spark", punctuation_interval=5, progress=False).run(
        folder, init
    )
    via_arrow = job.run(events, init)
    assert_same_run(via_spark.events, via_spark.state, via_arrow.events, via_arrow.state)
    assert {"startup_s", "staging_s"} <= via_spark.metrics["spark"].keys()


def test_job_runs_on_a_spark_dataframe_and_returns_dataframes(spark, tmp_path):
    rows = 2000
    frame = spark.range(0, rows, numPartitions=4).selectExpr(
        "id AS event_id", "id % 7 AS vehicle", "id % 5 AS segment", "(id * 13) % 230 AS speed"
    )
    init = {
        "segment_speed": pa.table(
            {"key": pa.array(range(5), pa.int64()), "speed_sum": [0] * 5, "speed_count": [0] * 5}
        )
    }
    result = Job("tp", progress=False).run(frame, init)
    want = Job("tp", progress=False).run(pa.Table.from_pandas(frame.toPandas()), init)
    assert_same_run(result.events, result.state, want.events, want.state)
    events, state = result.to_spark(spark)
    assert events.count() == rows
    assert events.schema.simpleString() == (
        "struct<ts:bigint,event_id:bigint,status:string,reason:string,toll:bigint,"
        "avg_speed:bigint,vehicle_count:bigint>"
    )
    assert sorted(state) == ["segment_speed", "segment_vehicles"]
    assert state["segment_vehicles"].toPandas()["vehicle_count"].tolist() == (
        result.state["segment_vehicles"].column("vehicle_count").to_pylist()
    )


def test_quick_start_result_of_a_million_rows_to_spark(spark):
    """The README's "From and to Spark" on the quick start's result: 1M rows, with columns
    in many chunks (as `pq.read_table` gives them: pyspark's pandas path failed on those)
    go to Spark and come back the same."""
    import pyarrow.compute as pc
    from txstream import Result
    from txstream.topologies.generators import WorkloadSpec, generate

    events, init = generate("sl", WorkloadSpec(events=1_000_000))
    result = Job("sl", source="arrow", progress=False).run(events, init)
    chunked = pa.Table.from_batches(result.events.to_batches(max_chunksize=100_000))
    assert chunked.num_rows == 1_000_000 and chunked.column("ts").num_chunks >= 10
    result = Result(chunked, result.state, result.metrics)
    frame, state = result.to_spark(spark)
    counts = {row["status"]: row["count"] for row in frame.groupBy("status").count().collect()}
    expected = pc.value_counts(result.events.column("status")).to_pylist()
    assert counts == {c["values"]: c["counts"] for c in expected}
    [row] = frame.selectExpr("sum(ts) AS ts", "count(reason) AS reasons").collect()
    assert row["ts"] == 999_999 * 1_000_000 // 2
    assert row["reasons"] == result.events.column("reason").drop_null().length()
    balances = state["accounts"].orderBy("key").toPandas()["balance"].tolist()
    assert balances == result.state["accounts"].column("balance").to_pylist()
