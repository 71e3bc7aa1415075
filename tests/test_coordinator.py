"""The Coordinator: what it resolves, and that its failure stops the team (threads)."""

from __future__ import annotations

import numpy as np
import pytest
from local_engine import run_local
from txstream.actors.coordinator import Coordinator
from txstream.schedulers._versions import Fates, Versions, find_affected
from txstream.state.operations import Ops
from txstream.topologies._generators import WorkloadSpec, generate


def _marks(txns, failed, changed, cond=(), deps=None, done=None):
    """find_affected on transactions given as lists of cells: ``changed`` per operation
    (its after - before), ``cond`` the conditional operations, ``deps`` per operation
    the cells it reads, ``done`` the executed operations (default all). Returns the
    count, the operations marked for redo, the affected transactions and ``failed``."""
    cell = [c for t in txns for c in t]
    n = len(cell)
    txn_ptr = np.cumsum([0] + [len(t) for t in txns]).astype(np.int64)
    deps = deps or [[] for _ in range(n)]
    dep_ptr = np.cumsum([0] + [len(d) for d in deps]).astype(np.int64)
    ops = Ops(
        txn=np.repeat(np.arange(len(txns)), [len(t) for t in txns]).astype(np.int64),
        cell=np.asarray(cell, np.int64), kind=np.zeros(n, np.int8), fun=np.zeros(n, np.int32),
        cond=np.asarray([1 if o in cond else 0 for o in range(n)], np.int32),
        reason=np.zeros(n, np.int32), out=np.zeros(n, np.int32), args=np.zeros((n, 1), np.int64),
        dep_ptr=dep_ptr, dep_cell=np.asarray([c for d in deps for c in d], np.int64),
        txn_ptr=txn_ptr,
    )  # fmt: skip
    v = Versions(
        before=np.zeros(n, np.int64), after=np.asarray(changed, np.int64),
        result=np.zeros(n, np.int64), slot=np.full(n, -1, np.int64), ok=np.ones(n, np.int8),
        done=np.asarray(done if done is not None else [1] * n, np.int64),
        redo=np.zeros(n, np.int8),
    )  # fmt: skip
    t = len(txns)
    fates = Fates(failed=np.asarray(failed, np.int8), fresh=np.asarray(failed, np.int8),
                  affected=np.zeros(t, np.int8), last_cond=np.full(t, -1, np.int64))  # fmt: skip
    dirty = np.zeros(16, np.int8)
    count = find_affected(0, t, ops, v, fates, dirty)
    assert not dirty.any() and not fates.fresh.any()
    marked = [o for o in range(n) if v.redo[o]]
    return count, marked, fates.affected.tolist(), fates.failed.tolist()


def test_a_failed_write_taints_later_operations_on_its_cells():
    # t0 fails after changing cell 1; t1 touches 1 and 2; t2 touches 2; t3 touches 3
    got = _marks([[0, 1], [1, 2], [2], [3]], [1, 0, 0, 0], [0, 5, 0, 0, 0, 0])
    assert got == (1, [2], [0, 0, 0, 0], [1, 0, 0, 0])  # only t1's operation on cell 1


def test_a_tainted_condition_redoes_its_transaction_and_taints_its_cells_transitively():
    # as above, but t1's operation on cell 1 is conditional: t1's outcome may change
    got = _marks([[0, 1], [1, 2], [2], [3]], [1, 1, 0, 0], [0, 5, 0, 0, 0, 0], cond={2})
    assert got == (3, [2, 3, 4], [0, 1, 0, 0], [1, 0, 0, 0])  # t1's failure forgotten


def test_a_failed_transaction_that_changed_nothing_taints_nothing():
    assert _marks([[0], [0]], [1, 1], [0, 0], cond={0, 1}) == (0, [], [0, 0], [1, 1])


def test_a_parametric_read_of_a_tainted_cell_is_marked():
    deps = [[], [], [1]]  # t2's operation on cell 2 reads cell 1
    got = _marks([[0], [1], [2]], [1, 1, 1], [0, 7, 0], cond={0, 1, 2}, deps=deps)
    assert got == (1, [2], [0, 0, 1], [1, 1, 0])


def test_operations_not_executed_yet_are_neither_marked_nor_taint():
    # eager: t1's operation on cell 1 has not run yet; t2 read cell 1 after it
    deps = [[], [], [], [1]]
    got = _marks([[0, 1], [1], [2]], [1, 0, 0], [0, 5, 0, 0], deps=deps, done=[1, 1, 0, 1])
    assert got == (1, [3], [0, 0, 0], [1, 0, 0])


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
    assert stats["failed"] > 0 and stats["marked"] > 0 and stats["requests"]["lazy"] <= 10


def test_a_failing_coordinator_stops_the_team_with_its_error(monkeypatch):
    def fail(self, policy, dims, begin, end):
        raise RuntimeError("coordinator failed on purpose")

    monkeypatch.setattr(Coordinator, "_resolve", fail)
    events, init = generate("sl", WorkloadSpec(events=2000, keys=20, seed=1))
    with pytest.raises(RuntimeError, match="on purpose"):
        run_local("sl", events, init, scheduler="tstream", executors=2, punctuation_interval=100)
