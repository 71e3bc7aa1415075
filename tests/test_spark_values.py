"""The Spark path of string, decimal and float64 columns: events read by Spark (a Parquet
folder, or a DataFrame of Spark's own decimals and doubles) equal the Arrow source, and
`to_spark` hands decimals out as `DecimalType`, float64 as `DoubleType`."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from naive import run_payments_model
from txstream import Job
from txstream.topologies.generators import WorkloadSpec, generate

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_payments_read_by_spark_equal_the_model_and_go_out_as_decimals(spark, tmp_path):
    events, init = generate("payments", WorkloadSpec(events=3000, keys=40, seed=4))
    pq.write_table(events.slice(0, 1000), tmp_path / "a.parquet", row_group_size=300)
    pq.write_table(events.slice(1000), tmp_path / "b.parquet", row_group_size=300)
    result = Job("payments", source="spark", punctuation_interval=50, progress=False).run(
        tmp_path, init
    )
    want_events, want_state = run_payments_model(events, init)
    assert_same_run(result.events, result.state, want_events, want_state)
    _, state = result.to_spark(spark)
    accounts = state["accounts"]
    assert accounts.schema.simpleString() == "struct<key:string,balance:decimal(18,2)>"
    rows = sorted((r["key"], r["balance"]) for r in accounts.collect())
    assert rows == list(zip(*want_state["accounts"].to_pydict().values(), strict=True))


def test_a_dataframe_of_spark_decimals_and_doubles_runs_as_its_arrow_table(spark):
    rows = [
        (0, "deposit", "acct-a", None, Decimal("100.005")),  # a tenth of a cent: rejected
        (1, "deposit", "acct-a", None, Decimal("100.250")),
        (2, "deposit", "acct-b", None, Decimal("0.010")),
        (3, "transfer", "acct-a", "acct-b", Decimal("40.000")),
        (4, "close", "acct-b", None, None),
        (5, "transfer", "acct-a", "acct-b", Decimal("1.000")),  # closed: aborted
    ]
    frame = spark.createDataFrame(
        rows,
        "event_id long, kind string, account string, dst_account string, amount decimal(20,3)",
    )
    result = Job("payments", progress=False).run(frame, {})
    events = pa.Table.from_pandas(frame.toPandas(), preserve_index=False)
    assert_same_run(result.events, result.state, *run_payments_model(events, {}))
    assert result.events["status"].to_pylist()[0] == "rejected"
    assert result.state["accounts"].to_pylist() == [{"key": "acct-a", "balance": Decimal("60.25")}]

    doubles = spark.createDataFrame(
        [(0, "put", "k", 0.1, None), (1, "add", "k", 0.2, None), (2, "get", "k", None, None)],
        "event_id long, kind string, key string, value double, other string",
    )
    floats = Job("kv_topology:floats", progress=False).run(doubles, {})
    assert floats.events["value"].to_pylist() == [None, None, 0.1 + 0.2]
    out, state = floats.to_spark(spark)
    assert out.schema["value"].dataType.simpleString() == "double"
    assert state["kv"].schema.simpleString() == "struct<key:string,value:double>"
    assert state["kv"].collect()[0]["value"] == 0.1 + 0.2
