"""The Job API end to end on Ray: results, files, errors and clean-up."""

from __future__ import annotations

import shutil

import naive
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from conftest import txstream_segments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from txstream import Job
from txstream.errors import RuntimeFailure, SchemaError, TopologyError, UsageError
from txstream.monitor.logs import log_of
from txstream.topologies import BUNDLED
from workloads import workloads

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.mark.parametrize("topology", BUNDLED)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_job_on_ray_equals_model(topology, data):
    events, init = data.draw(workloads(topology))
    interval = data.draw(st.sampled_from([1, 7, 10240]))
    result = Job(topology, punctuation_interval=interval, progress=False).run(events, init)
    want = naive.run_model(topology, events, init)
    assert_same_run(result.events, result.state, *want)
    assert result.metrics["events"] == events.num_rows
    assert not txstream_segments()


def _sl_tables(n=30):
    events = pa.table(
        {
            "event_id": pa.array(range(n), pa.int64()),
            "kind": pa.array(["deposit", "transfer"] * (n // 2)),
            "account": pa.array([i % 3 for i in range(n)], pa.int64()),
            "asset": pa.array([i % 2 for i in range(n)], pa.int64()),
            "dst_account": pa.array([(i + 1) % 3 for i in range(n)], pa.int64()),
            "dst_asset": pa.array([(i + 1) % 2 for i in range(n)], pa.int64()),
            "amount": pa.array([5] * n, pa.int64()),
            "asset_amount": pa.array([2] * n, pa.int64()),
        }
    )
    init = {
        "accounts": pa.table({"key": pa.array([0, 1, 2], pa.int64()), "balance": [10, 0, 0]}),
        "assets": pa.table({"key": pa.array([0, 1], pa.int64()), "balance": [3, 0]}),
    }
    return events, init


def test_parquet_folder_is_read_in_file_name_order(tmp_path):
    events, init = _sl_tables(30)
    folder = tmp_path / "events"
    folder.mkdir()
    for i, start in enumerate(range(0, 30, 10)):  # names sort as 0,1,2 regardless of mtime
        pq.write_table(events.slice(start, 10), folder / f"part-{2 - i}.parquet")
    reordered = pa.concat_tables([pq.read_table(folder / f"part-{i}.parquet") for i in range(3)])
    result = Job("sl", progress=False).run(folder, init, output=tmp_path / "out")
    want = naive.run_model("sl", reordered, init)
    assert_same_run(result.events, result.state, *want)
    for name in (
        "events.parquet",
        "metrics.json",
        "state/accounts.parquet",
        "state/assets.parquet",
    ):
        assert (tmp_path / "out" / name).is_file()


def test_failure_in_an_executor_cleans_up():
    """The failure names the executor and the cause; its trace is in the run's log (a
    temporary one without output, kept because the run failed)."""
    events, init = _sl_tables(30)
    with pytest.raises(RuntimeFailure) as failure:
        Job("failing_topology:build", progress=False, timeout_s=60).run(events, init)
    assert str(failure.value) == "Executor 0: RuntimeError: user code failed on purpose"
    log = log_of(failure.value)
    assert "Traceback" in log.read_text() and "on purpose" in log.read_text()
    shutil.rmtree(log.parent)
    assert not txstream_segments()
    # Ray is still usable and the next run succeeds.
    assert Job("sl", progress=False).run(events, init).metrics["events"] == 30


def test_uncompilable_user_function_is_reported_with_its_location():
    from failing_topology import build_uncompilable

    with pytest.raises(TopologyError, match=r"failing_topology:\d+ \(not_numba\) does not compile"):
        build_uncompilable()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda e, i: (e.drop_columns(["amount"]), i), "missing column 'amount'"),
        (lambda e, i: (e.set_column(6, "amount", pa.array([1.5] * 30)), i), "type double"),
        (
            lambda e, i: (
                e,
                {**i, "assets": pa.table({"key": pa.array([1, 0]), "balance": [1, 1]})},
            ),
            "0..K-1",
        ),
        (
            lambda e, i: (e, {**i, "assets": i["assets"].append_column("x", pa.array([1, 1]))}),
            "columns",
        ),
        (lambda e, i: (e, {"accounts": i["accounts"]}), "missing table 'assets'"),
    ],
)
def test_schema_errors_stop_before_processing(mutate, message):
    events, init = mutate(*_sl_tables(30))
    with pytest.raises(SchemaError, match=message):
        Job("sl", progress=False).run(events, init)


def test_unknown_options_are_usage_errors():
    with pytest.raises(UsageError):
        Job("sl", executors=0)
    with pytest.raises(UsageError):
        Job("nope")


def test_feeders_cpu_is_their_own_not_the_teams():
    """The ProgressController's and the Sink's CPU in metrics is their threads' own: the
    executor, busy 50 us per state access in the same process, is not counted."""
    events, init = _sl_tables(4000)
    metrics = Job("sl", udf_cost_us=50, progress=False).run(events, init).metrics
    busy_s = 4000 * 50e-6  # at least one state access per event
    assert metrics["seconds"] > busy_s
    assert metrics["cpu_s"]["progress_controller"] < busy_s / 2
    assert metrics["cpu_s"]["sink"] < busy_s / 2


def test_serial_on_several_executors_keeps_chunk_order(monkeypatch, capsys):
    """Chunks go to several executors; serial must still run them one after the other.
    More executors than usable cores is a warning that says what it costs."""
    from txstream.cluster import topology
    from txstream.topologies.generators import WorkloadSpec, generate

    events, init = generate("gs", WorkloadSpec(events=120_000, keys=50, theta=0.9, seed=3))
    options = dict(punctuation_interval=40_000, progress=False)
    one = Job("gs", **options).run(events, init)
    monkeypatch.setattr(topology, "usable_cores", lambda: 2)
    three = Job("gs", executors=3, **options).run(events, init)
    assert capsys.readouterr().err == (
        "txstream: warning: 3 executors on 2 usable cores: executors share cores, so every "
        "wait for a peer gets slower (expect a slower run than with --executors 2)\n"
    )
    assert len(three.metrics["breakdown_per_executor_s"]) == 3
    assert_same_run(three.events, three.state, one.events, one.state)
