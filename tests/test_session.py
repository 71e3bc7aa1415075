"""Sessions (contract §6): pushes in slices, consistent queries, flush, outputs, failures."""

from __future__ import annotations

import time

import naive
import pyarrow as pa
import pytest
from compare import assert_same_run
from conftest import actor_processes, txstream_segments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_job import _sl_tables
from txstream import Job
from txstream.errors import RuntimeFailure, SchemaError, UsageError
from txstream.topologies import BUNDLED
from workloads import workloads

pytestmark = pytest.mark.usefixtures("ray_cluster")

SCHEDULERS = [("serial", 1), ("tstream", 2)]


def _model_state(topology, events, init, w):
    """The plain-Python model's state after exactly the first ``w`` events."""
    return naive.run_model(topology, events.slice(0, w), init)[1]


@pytest.mark.parametrize("topology", BUNDLED)
@pytest.mark.parametrize("scheduler, executors", SCHEDULERS)
@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_pushes_in_slices_with_queries_equal_the_model(topology, scheduler, executors, data):
    """Random slices and pauses give what one run gives; every query equals the model's
    state after exactly the watermark it reports."""
    events, init = data.draw(workloads(topology, max_events=120))
    cuts = sorted(data.draw(st.lists(st.integers(0, events.num_rows), max_size=6)))
    interval = data.draw(st.sampled_from([1, 7, 10240]), label="interval")
    punctuation_ms = data.draw(st.sampled_from([1.0, 20.0]), label="punctuation_ms")
    job = Job(
        topology,
        scheduler=scheduler,
        executors=executors,
        punctuation_interval=interval,
        punctuation_ms=punctuation_ms,
        progress=False,
        timeout_s=60,
    )
    queried = []
    with job.start(init) as session:
        for begin, end in zip([0, *cuts], [*cuts, events.num_rows], strict=True):
            session.push(events.slice(begin, end - begin))
            if data.draw(st.booleans(), label="pause"):
                time.sleep(data.draw(st.sampled_from([0.001, 0.03])))
            table = data.draw(st.sampled_from(sorted(init)), label="table")
            queried.append((table, session.query(table)))
        assert session.flush() == events.num_rows == session.watermark
        queried.append(("all", None))
        result = session.close()
    want_events, want_state = naive.run_model(topology, events, init)
    assert_same_run(result.events, result.state, want_events, want_state)
    for table, answer in queried[:-1]:
        w, rows = answer
        assert 0 <= w <= events.num_rows
        state = _model_state(topology, events, init, w)[table]
        assert rows.column_names == state.column_names
        for name in state.column_names:
            assert rows.column(name).to_pylist() == state.column(name).to_pylist(), (w, name)
    assert not txstream_segments()


def test_query_keys_flush_outputs_and_close_twice(tmp_path):
    events, init = _sl_tables(30)
    out = tmp_path / "out"
    with Job("sl", source="arrow", progress=False).start(init, output=out) as session:
        assert session.query("accounts", keys=[2, 0]) == (
            0,
            pa.table({"key": pa.array([2, 0], pa.int64()), "balance": [0, 10]}),
        )
        session.push(events.slice(0, 10))
        assert session.flush() == 10
        assert [p.name for p in (out / "events").iterdir()] == ["part-000000000000.parquet"]
        assert not (out / "_SUCCESS").exists()
        session.push(events.slice(10))
        session.flush()
        w, rows = session.query("assets")
        assert w == 30 and rows.num_rows == 2
        got = pa.Table.from_batches(list(session.outputs()))
        assert got.column("ts").to_pylist() == list(range(30))
        assert pa.Table.from_batches(list(session.outputs(since=25))).num_rows == 5
        with pytest.raises(UsageError, match="no table"):
            session.query("nope")
        with pytest.raises(UsageError, match="not a key"):
            session.query("accounts", keys=[3])
        result = session.close()
        assert session.close() is result
    assert (out / "_SUCCESS").is_file() and (out / "state" / "accounts.parquet").is_file()
    assert result.events.equals(got)
    with pytest.raises(UsageError, match="closed"):
        session.push(events)


def test_a_push_with_a_wrong_schema_applies_nothing_and_the_session_goes_on():
    events, init = _sl_tables(30)
    with Job("sl", progress=False).start(init) as session:
        session.push(events.slice(0, 10))
        with pytest.raises(SchemaError, match="amount"):
            session.push(events.slice(10).drop_columns(["amount"]))
        session.push(events.slice(10))
        result = session.close()
    assert_same_run(result.events, result.state, *naive.run_model("sl", events, init))


def test_a_failure_surfaces_on_the_next_call_and_close_frees_everything():
    events, init = _sl_tables(30)
    session = Job(
        "failing_topology:build", scheduler="tstream", executors=2, progress=False, timeout_s=60
    ).start(init)
    session.push(events)
    deadline = time.monotonic() + 60
    with pytest.raises(RuntimeFailure, match="on purpose"):
        while time.monotonic() < deadline:
            session.query("accounts")
            time.sleep(0.05)
    with pytest.raises(RuntimeFailure, match="on purpose"):
        session.push(events)
    with pytest.raises(RuntimeFailure, match="on purpose"):
        session.close()
    assert not txstream_segments()
    for actor in ("Executor", "ProgressController", "Sink", "Coordinator"):
        assert not actor_processes(actor), actor
