"""A user's own Spark session, not RayDP's: its DataFrames go in through files in its row
order, results come back into it, and a session txstream cannot serve is refused in one
line (`txstream.connectors.spark_exchange`)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from txstream import topologies
from txstream.connectors.inputs import checked_events
from txstream.connectors.spark_exchange import (
    ExchangeReader,
    chunk_path,
    end_path,
    exchange_folder,
)
from txstream.errors import RuntimeFailure, UsageError

SCRIPT = Path(__file__).with_name("user_spark_session.py")


@pytest.fixture(scope="module")
def user_run() -> str:
    """What tests/user_spark_session.py printed, in a process of its own (its SparkContext
    would collide with the suite's RayDP one)."""
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600)
    if run.returncode:
        print(run.stderr[-6000:], file=sys.stderr)
    return run.stdout


@pytest.mark.parametrize(
    "check",
    [
        "order",
        "results",
        "to_spark",
        "cleaned after success",
        "cleaned after a failed job",
        "cleaned after a wrong schema",
    ],
)
def test_a_local_user_session(user_run, check):
    assert f"ok {check}\n" in user_run, user_run


def _session(master: str) -> SimpleNamespace:
    return SimpleNamespace(sparkContext=SimpleNamespace(master=master))


def test_a_cluster_not_on_ray_needs_a_shared_folder(tmp_path):
    with pytest.raises(UsageError) as refused:
        exchange_folder(_session("spark://host:7077"), None)
    assert "spark_exchange_dir" in str(refused.value) and "\n" not in str(refused.value)
    folder = exchange_folder(_session("yarn"), tmp_path)
    assert folder.parent == tmp_path and folder.is_dir()
    with pytest.raises(UsageError, match="not a folder"):
        exchange_folder(_session("yarn"), tmp_path / "missing")


def test_a_spark_connect_dataframe_is_refused_in_one_line():
    connect = type("DataFrame", (), {"__module__": "pyspark.sql.connect.dataframe"})()
    with pytest.raises(UsageError) as refused:
        checked_events(connect, topologies.get("sl"))
    assert "Spark Connect" in str(refused.value) and "\n" not in str(refused.value)


def _write(folder: Path, partition: int, tables: list[pa.Table]) -> None:
    for sequence, table in enumerate(tables):
        with pa.OSFile(str(chunk_path(folder, partition, sequence)), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as stream:
                stream.write_table(table)
    end_path(folder, partition).write_text(str(len(tables)))


def test_partitions_are_read_in_index_order_as_they_complete(tmp_path):
    parts = [[pa.table({"x": [i, i]}) for i in range(p * 10, p * 10 + 2)] for p in range(3)]
    _write(tmp_path, 1, parts[1])  # a later partition first: it waits
    _write(tmp_path, 2, [])

    def rest() -> None:
        time.sleep(0.2)
        _write(tmp_path, 0, parts[0])
        _write(tmp_path, 3, parts[2])
        (tmp_path / "_DONE").write_text("4")

    writer = threading.Thread(target=rest)
    writer.start()
    chunks = list(ExchangeReader(tmp_path, timeout_s=30).chunks())
    writer.join()
    got = [pa.ipc.open_stream(c).read_all().column("x").to_pylist() for c in chunks]
    assert got == [[0, 0], [1, 1], [10, 10], [11, 11], [20, 20], [21, 21]]
    assert not list(tmp_path.glob("*.arrow"))  # each removed once read


def test_a_failed_job_stops_the_reader_with_its_message(tmp_path):
    (tmp_path / "_FAILED").write_text("Spark failed to convert the input: boom")
    with pytest.raises(RuntimeFailure, match="boom"):
        list(ExchangeReader(tmp_path, timeout_s=30).chunks())
