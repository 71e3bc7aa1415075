"""InputLog and Pushed (txstream.engine.recovery): what is pushed again after a checkpoint."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txstream.connectors.sources import ArrowSource, SkippedSource
from txstream.engine.recovery import InputLog, Pushed

N = 30


def _events(first: int, n: int) -> pa.Table:
    return pa.table({"ts": pa.array(range(first, first + n), pa.int64())})


def _read(data: pa.Table | ArrowSource) -> list[int]:
    """The events a push hands over, whether a table or a source (read in small batches,
    so that skipping crosses batch boundaries)."""
    if isinstance(data, pa.Table):
        return data.column("ts").to_pylist()
    return [v for b in data.iter_batches(4) for v in b.column("ts").to_pylist()]


def _log(keep: bool = True) -> InputLog:
    """Pushes 0..10 (a table), 10..25 (a source), 25..30 (a table)."""
    log = InputLog(keep)
    log.record(Pushed(0, 10, table=_events(0, 10)))
    log.record(Pushed(10, 25, source=ArrowSource(_events(10, 15))))
    log.record(Pushed(25, N, table=_events(25, 5)))
    return log


def _replayed(log: InputLog, ts: int) -> list[int]:
    return [v for _, data in log.after(ts) for v in _read(data)]


# ---------------------------------------------------------------- Pushed
def test_a_pushed_table_from_ts_on_is_its_slice():
    pushed = Pushed(10, 20, table=_events(10, 10))
    assert _read(pushed.after(13)) == list(range(13, 20))
    assert _read(pushed.after(10)) == list(range(10, 20))


def test_a_pushed_source_from_ts_on_skips_its_first_rows():
    source = ArrowSource(_events(10, 10))
    pushed = Pushed(10, 20, source=source)
    skipped = pushed.after(17)
    assert isinstance(skipped, SkippedSource) and skipped.num_rows == 3
    assert _read(skipped) == [17, 18, 19]
    assert pushed.after(10) is source
    assert pushed.after(3) is source  # ts before the push: all of it


# ---------------------------------------------------------------- InputLog.after
@settings(deadline=None)
@given(ts=st.integers(0, N))
def test_after_replays_exactly_the_events_from_ts_on(ts):
    assert _replayed(_log(), ts) == list(range(ts, N))


def test_after_yields_only_the_pushes_holding_events_from_ts_on():
    log = _log()
    assert [(p.start, p.end) for p, _ in log.after(10)] == [(10, 25), (25, 30)]
    assert [(p.start, p.end) for p, _ in log.after(24)] == [(10, 25), (25, 30)]
    assert [(p.start, p.end) for p, _ in log.after(25)] == [(25, 30)]
    assert list(log.after(N)) == []


# ---------------------------------------------------------------- InputLog.release
def test_release_drops_only_pushes_entirely_before_ts():
    log = _log()
    log.release(9)
    assert _replayed(log, 0) == list(range(N))
    log.release(10)
    assert [p.start for p, _ in log.after(0)] == [10, 25]
    log.release(24)
    assert [p.start for p, _ in log.after(0)] == [10, 25]
    log.release(25)
    assert [p.start for p, _ in log.after(0)] == [25]


@settings(deadline=None)
@given(released=st.integers(0, N), ts=st.integers(0, N))
def test_after_a_release_the_events_from_the_release_on_are_still_replayed(released, ts):
    log = _log()
    log.release(released)
    ts = max(ts, released)
    assert _replayed(log, ts) == list(range(ts, N))


# ---------------------------------------------------------------- keep=False
def test_without_keep_nothing_is_replayed_but_positions_are_recorded(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(_events(0, 10), path)
    log = InputLog(keep=False)
    log.record(Pushed(0, 10, source=ArrowSource(path), batch_id=7))
    log.record(Pushed(10, 20, table=_events(10, 10), batch_id=8))
    assert list(log.after(0)) == []
    assert log.position(20) == {
        "last_batch_id": 8,
        "files": [{"path": str(path), "start": 0, "end": 10}],
    }


# ---------------------------------------------------------------- InputLog.position
def test_position_gives_the_last_spark_batch_entirely_before_ts():
    log = InputLog(keep=True)
    log.record(Pushed(0, 10, table=_events(0, 10), batch_id=3))
    log.record(Pushed(10, 12, table=_events(10, 2)))  # not a Spark micro-batch
    log.record(Pushed(12, 20, table=_events(12, 8), batch_id=4))
    assert log.position(0)["last_batch_id"] is None
    assert log.position(9)["last_batch_id"] is None
    assert log.position(10)["last_batch_id"] == 3
    assert log.position(19)["last_batch_id"] == 3
    assert log.position(20)["last_batch_id"] == 4


@pytest.fixture
def files(tmp_path):
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(_events(10 * i, 10), paths[-1])
    return paths


def test_position_gives_the_single_files_that_start_before_ts(files, tmp_path):
    log = InputLog(keep=True)
    log.record(Pushed(0, 10, source=ArrowSource(files[0])))
    log.record(Pushed(10, 15, table=_events(10, 5)))
    log.record(Pushed(15, 25, source=ArrowSource(files[1])))
    log.record(Pushed(25, 35, source=ArrowSource(_events(0, 10))))  # a table, not a file
    log.record(Pushed(35, 45, source=ArrowSource(files[2])))
    entries = [
        {"path": str(files[0]), "start": 0, "end": 10},
        {"path": str(files[1]), "start": 15, "end": 25},
        {"path": str(files[2]), "start": 35, "end": 45},
    ]
    assert log.position(0)["files"] == []
    assert log.position(1)["files"] == entries[:1]
    assert log.position(15)["files"] == entries[:1]
    assert log.position(16)["files"] == entries[:2]
    assert log.position(35)["files"] == entries[:2]
    assert log.position(36)["files"] == entries


def test_a_folder_of_files_is_not_a_single_file(files, tmp_path):
    log = InputLog(keep=True)
    log.record(Pushed(0, 30, source=ArrowSource(tmp_path)))
    assert log.position(30)["files"] == []
    assert _replayed(log, 12) == list(range(12, 30))
