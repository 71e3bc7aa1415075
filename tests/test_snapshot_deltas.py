"""Snapshots and checkpoints that copy what changed: the ring of deltas and the chain of
delta checkpoints against the state they stand for (no Ray needed)."""

from __future__ import annotations

import numpy as np
import pytest
from txstream.state import dirty, snapshots
from txstream.state.checkpoints import CheckpointBuffer, CheckpointStore
from txstream.state.layout import Layout
from txstream.state.shared import new_run_id
from txstream.state.snapshots import SnapshotRing
from txstream.state.tables import SharedState


class _Table:
    name, columns, state_columns, key, init_min = "t", ("balance",), ("balance",), "dense", None


def _state(cells: int) -> SharedState:
    layout = Layout.of([_Table()], {"t": cells})
    return SharedState.create(new_run_id(), layout, 16)


def _write(state: SharedState, rng: np.random.Generator, n: int) -> None:
    """What a chunk's kernels do: write cells, marking their groups."""
    cells = rng.integers(0, len(state.values), n)
    state.values[cells] = rng.integers(-1000, 1000, n)
    dirty.mark_cells(state.dirty, cells)


def _take_marks(marks: np.ndarray) -> np.ndarray:
    return dirty.take(marks, np.empty(len(marks), np.int64)).copy()


def _take(state: SharedState) -> np.ndarray:
    return _take_marks(state.dirty)


def test_take_returns_each_marked_group_once_and_clears_the_marks():
    marks = np.zeros(dirty.groups_of(1000), np.uint8)
    dirty.mark_cells(marks, np.array([999, 0, 7, 8, 8, 512]))
    assert _take_marks(marks).tolist() == [0, 1, 64, 124]
    assert _take_marks(marks).tolist() == []


@pytest.mark.parametrize("cells", [1001, 40_000])
def test_every_boundary_the_ring_holds_reads_as_the_state_stood(monkeypatch, cells):
    monkeypatch.setattr(snapshots, "MIN_LOG_CELLS", 4000)  # folds often
    rng = np.random.default_rng(cells)
    with _state(cells) as state:
        ring = SnapshotRing.create(new_run_id(), cells)
        try:
            ring.reset(state.values, 0)
            history = {0: state.values.copy()}
            for ts in range(1, 60):
                _write(state, rng, int(rng.integers(0, 300)) if ts % 7 else 3000)
                ring.publish(state.values, _take(state), ts)
                history[ts] = state.values.copy()
                asked = rng.integers(0, cells, 50)
                for reached in (ts, max(0, ts - 3)):
                    got = ring._try_read(asked, reached)
                    if got is not None:  # None: the base is newer than ``reached``
                        w, values = got
                        assert w <= reached
                        assert np.array_equal(values, history[w][asked])
                w, values = ring.read(np.arange(cells), lambda ts=ts: ts, 1.0)
                assert w == ts and np.array_equal(values, state.values)
        finally:
            ring.close()


def test_a_chain_of_delta_checkpoints_restores_the_state_and_is_folded_when_long(tmp_path):
    cells = 100_003
    rng = np.random.default_rng(1)
    store = CheckpointStore(tmp_path / "ckpt")
    with _state(cells) as state, _state(cells) as restored:
        state.values[:] = rng.integers(0, 100, cells)
        store.write(
            0, {name: getattr(state, name) for name in ("values", "set_cells", "set_members")}, {}
        )
        buffer = CheckpointBuffer.create(new_run_id(), state)
        try:
            for ts in range(1, 40):
                _write(state, rng, 500 if ts != 30 else 200_000)
                buffer.note(state, _take(state))
                buffer.copy_from(state, ts)
                store.write_delta(ts, buffer.arrays(), {})
                latest = store.latest()
                assert latest.ts == ts
                restored.values[:] = -1
                latest.restore(restored)
                assert np.array_equal(restored.values, state.values)
                assert 1 <= len(latest.chain()) <= 17
            assert store.latest().chain()[0].ts == 30  # written full: its chain held too much
            assert len(list((tmp_path / "ckpt").iterdir())) == 10  # the rest was removed
            assert store.write_delta(5, buffer.arrays(), {}) is None  # older than the latest
        finally:
            buffer.close()


def test_a_copy_is_asked_of_the_team_only_once_the_one_asked_before_is_written():
    """Two chunks in flight may both end a checkpoint interval: a copy asked at the second
    would overwrite the first's in the buffer while the writer writes it."""
    with _state(1_000) as state:
        buffer = CheckpointBuffer.create(new_run_id(), state)
        try:
            buffer.reset(0)
            assert buffer.free
            buffer.ask(10)
            assert not buffer.free  # asked, the team has not copied it yet
            buffer.note(state, _take(state))
            buffer.copy_from(state, 10)
            assert not buffer.free
            buffer.mark_written(10)
            assert buffer.free
        finally:
            buffer.close()
