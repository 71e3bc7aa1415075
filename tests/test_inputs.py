"""The one way in (`txstream.connectors.inputs.event_source`): every kind of input a user
hands over becomes one Source of the topology's events, or one clear error."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txstream import topologies
from txstream.connectors.inputs import ACCEPTED, checked_events, event_source, needs_spark
from txstream.connectors.sources import ArrowSource, SkippedSource
from txstream.errors import SchemaError, UsageError
from txstream.topologies.generators import WorkloadSpec, generate

SL = topologies.get("sl")
EVENTS, _ = generate("sl", WorkloadSpec(events=100, keys=10))


def _read(source) -> pa.Table:
    table = pa.Table.from_batches(list(source.iter_batches(32)))
    return table.cast(EVENTS.schema)  # Parquet strings come dictionary-encoded


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(lambda t: t, id="table"),
        pytest.param(lambda t: t.combine_chunks().to_batches()[0], id="record-batch"),
        pytest.param(lambda t: t.to_batches(max_chunksize=30), id="list-of-batches"),
        pytest.param(lambda t: iter(t.to_batches(max_chunksize=30)), id="iterator-of-batches"),
        pytest.param(
            lambda t: pa.RecordBatchReader.from_batches(t.schema, t.to_batches(30)), id="reader"
        ),
    ],
)
def test_arrow_data_becomes_an_arrow_source_of_one_table(events):
    source = event_source(events(EVENTS), SL)
    assert isinstance(source, ArrowSource) and source.table is not None
    assert source.num_rows == EVENTS.num_rows
    assert _read(source).equals(EVENTS)


def test_an_empty_list_of_batches_is_no_events_of_the_topologys_schema():
    source = event_source([], SL)
    assert source.num_rows == 0 and source.schema == SL.event_schema


def test_a_parquet_file_and_a_folder_in_name_order(tmp_path):
    pq.write_table(EVENTS, tmp_path / "events.parquet")
    source = event_source(tmp_path / "events.parquet", SL)
    assert source.files == [tmp_path / "events.parquet"] and _read(source).equals(EVENTS)
    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(EVENTS.slice(60), folder / "b.parquet")
    pq.write_table(EVENTS.slice(0, 60), folder / "a.parquet")
    source = event_source(str(folder), SL)
    assert source.num_rows == EVENTS.num_rows and _read(source).equals(EVENTS)


def test_a_source_is_taken_as_it_is():
    source = SkippedSource(ArrowSource(EVENTS), 10)
    assert event_source(source, SL) is source


def test_a_source_that_does_not_know_its_rows_is_refused():
    class Unknown:
        schema, num_rows = EVENTS.schema, None

        def iter_batches(self, max_rows):
            yield from EVENTS.to_batches(max_rows)

    with pytest.raises(UsageError, match="number of rows"):
        event_source(Unknown(), SL)


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(lambda t, _: t, id="table"),
        pytest.param(lambda t, _: t.to_batches(), id="batches"),
        pytest.param(lambda t, path: path, id="path"),
        pytest.param(lambda t, _: ArrowSource(t), id="source"),
    ],
)
def test_a_wrong_schema_is_a_schema_error_naming_the_column(events, tmp_path):
    bad = EVENTS.drop_columns(["amount"])
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match="missing column 'amount'"):
        event_source(events(bad, tmp_path / "bad.parquet"), SL)


def test_batches_of_different_schemas_are_a_schema_error():
    batches = [*EVENTS.to_batches(), EVENTS.drop_columns(["amount"]).to_batches()[0]]
    with pytest.raises(SchemaError, match="different schemas"):
        event_source(batches, SL)


@pytest.mark.parametrize("events", [42, {"event_id": [1]}, [1, 2], None])
def test_another_kind_of_input_is_one_usage_error_naming_what_is_taken(events):
    with pytest.raises(UsageError) as refused:
        event_source(events, SL)
    assert str(refused.value).endswith(ACCEPTED) and "\n" not in str(refused.value)


def test_files_spark_reads_wait_for_spark_only_when_it_is_to_read_them(tmp_path, monkeypatch):
    """Checked before Spark starts (footers; Java), staged only once it runs."""
    from txstream.connectors import spark

    monkeypatch.setattr(spark, "spark_running", lambda: False)
    pq.write_table(EVENTS, tmp_path / "events.parquet")
    path = tmp_path / "events.parquet"
    checked = checked_events(path, SL)
    assert not needs_spark(checked) and not needs_spark(ArrowSource(EVENTS), "spark")
    try:
        checked = checked_events(path, SL, "spark")
    except UsageError as no_java:
        assert "Java" in str(no_java)
        return
    assert isinstance(checked, ArrowSource) and needs_spark(checked, "spark")
    with pytest.raises(UsageError, match="start it"):
        event_source(path, SL, "spark")


def test_a_spark_dataframe_is_recognised_without_importing_pyspark():
    """A DataFrame is told apart by its type's module; nothing imports pyspark for it."""
    program = (
        "import sys\n"
        "from txstream import topologies\n"
        "from txstream.connectors.inputs import checked_events, needs_spark\n"
        "import pyarrow as pa\n"
        "DataFrame = type('DataFrame', (), {'__module__': 'pyspark.sql.dataframe'})\n"
        "frame = DataFrame()\n"
        "assert checked_events(frame, topologies.get('sl')) is frame and needs_spark(frame)\n"
        "assert not needs_spark(pa.table({'x': [1]}))\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120)
