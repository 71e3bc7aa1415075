"""A PySpark 4 user's own session feeding txstream, run in a virtualenv whose pyspark is
4.x (tests/test_pyspark4.py makes it): SL events in a DataFrame of a plain ``local[2]``
session go through a job and a session by the public path (files, as RayDP has no Spark 4),
and the results come back into that session with ``to_spark``; all equal to the pyarrow
run of the same events.

Prints ``ok <check>`` for each check that holds.
"""

from __future__ import annotations

import os
import sys

import pyarrow as pa
from compare import assert_same_tables

EVENTS = 20_000
HALF = 12_345


def assert_same_values(got: pa.Table, want: pa.Table) -> None:
    """Same columns and values (Spark's Arrow may take other widths of strings)."""
    assert got.column_names == want.column_names, (got.schema, want.schema)
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def main() -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this one's
    import pyspark
    from pyspark.sql import SparkSession
    from txstream import Job
    from txstream.cluster.ray_runtime import ray_session
    from txstream.connectors.spark import on_ray
    from txstream.topologies.generators import WorkloadSpec, generate

    assert pyspark.__version__.startswith("4."), pyspark.__version__
    print(f"ok pyspark {pyspark.__version__}", flush=True)
    events, init = generate("sl", WorkloadSpec(events=EVENTS, keys=512, abort_ratio=0.05))
    spark = SparkSession.builder.master("local[2]").appName("pyspark4").getOrCreate()
    try:
        assert not on_ray(spark)
        frame = spark.createDataFrame(events)  # Spark 4 takes an Arrow table as it is
        halves = [spark.createDataFrame(part) for part in (events[:HALF], events[HALF:])]
        with ray_session(log_to_driver=False):  # one Ray for the runs, as a notebook has
            want = Job("sl", source="arrow", progress=False).run(events, init)
            got = Job("sl", progress=False).run(frame, init)
            assert_same_tables(got, want)
            print("ok job", flush=True)

            session = Job("sl", progress=False).start(init)
            for half in halves:
                session.push(half)
            assert_same_tables(session.close(), want)
            print("ok session", flush=True)

        back, state = got.to_spark(spark)
        assert back.sparkSession is spark
        assert_same_values(back.toArrow(), got.events)
        for name, table in got.state.items():
            assert_same_values(state[name].toArrow(), table)
        print("ok to_spark", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
