"""The Coordinator: what it resolves, and that its failure stops the team (threads)."""

from __future__ import annotations

import numpy as np
import pytest
from local_engine import run_local
from txstream.actors.coordinator import Coordinator
from txstream.schedulers._chains import find_affected
from txstream.topologies._generators import WorkloadSpec, generate


def _affected(txn_ptr, cell, failed, changed, deps=None):
    """find_affected on transactions given as lists of cells (no parametric reads
    unless ``deps`` gives per operation the cells it reads)."""
    n = txn_ptr[-1]
    deps = deps or [[] for _ in range(n)]
    dep_ptr = np.cumsum([0] + [len(d) for d in deps]).astype(np.int64)
    dep_cell = np.array([c for d in deps for c in d], np.int64)
    before = np.zeros(n, np.int64)
    after = np.asarray(changed, np.int64)
    failed = np.asarray(failed, np.int8)
    affected = np.zeros(len(failed), np.int8)
    dirty = np.zeros(16, np.int8)
    count = find_affected(0, len(failed), np.asarray(txn_ptr, np.int64),
                          np.asarray(cell, np.int64), dep_ptr, dep_cell, before, after,
                          np.full(n, -1, np.int64), failed, dirty, affected)  # fmt: skip
    assert not dirty.any()
    return count, affected.tolist(), failed.tolist()


def test_a_failed_write_taints_later_transactions_on_its_cells_transitively():
    # t0 fails after changing cell 1; t1 touches 1 and 2; t2 touches 2; t3 touches 3
    count, affected, failed = _affected([0, 2, 4, 5, 6], [0, 1, 1, 2, 2, 3],
                                        [1, 0, 0, 0], [0, 5, 0, 0, 0, 0])  # fmt: skip
    assert (count, affected, failed) == (2, [0, 1, 1, 0], [1, 0, 0, 0])


def test_a_failed_transaction_that_changed_nothing_taints_nothing():
    count, affected, failed = _affected([0, 1, 2], [0, 0], [1, 1], [0, 0])
    assert (count, affected, failed) == (0, [0, 0], [1, 1])


def test_a_parametric_read_of_a_tainted_cell_is_affected_and_its_failure_forgotten():
    deps = [[], [], [1]]  # t2's operation on cell 2 reads cell 1
    count, affected, failed = _affected([0, 1, 2, 3], [0, 1, 2], [1, 1, 1], [0, 7, 0], deps)
    assert (count, affected, failed) == (1, [0, 0, 1], [1, 1, 0])


def test_on_hot_keys_the_coordinator_has_transactions_redone(monkeypatch):
    served = []
    serve = Coordinator.serve
    monkeypatch.setattr(Coordinator, "serve", lambda self: served.append(serve(self)))
    events, init = generate("sl", WorkloadSpec(events=5000, keys=50, theta=0.8, seed=3))
    serial = run_local("sl", events, init, punctuation_interval=500)
    tstream = run_local("sl", events, init, scheduler="tstream", executors=2,
                        punctuation_interval=500)  # fmt: skip
    assert tstream[0].equals(serial[0]) and tstream[1] == serial[1]
    assert (serial[0].column("status").to_numpy(zero_copy_only=False) == "aborted").any()
    [stats] = served  # failures in exploration, some of them on polluted inputs: redone
    assert stats["failed"] > 0 and stats["affected"] > 0 and stats["batches"] <= 10


def test_a_failing_coordinator_stops_the_team_with_its_error(monkeypatch):
    def fail(self, shape, begin, end):
        raise RuntimeError("coordinator failed on purpose")

    monkeypatch.setattr(Coordinator, "_resolve", fail)
    events, init = generate("sl", WorkloadSpec(events=2000, keys=20, seed=1))
    with pytest.raises(RuntimeError, match="on purpose"):
        run_local("sl", events, init, scheduler="tstream", executors=2, punctuation_interval=100)
