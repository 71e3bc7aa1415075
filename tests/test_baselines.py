"""The baselines that run whole transactions per executor (lock, mvlk, sstore, nolock):
every wait of their kernels ends at the run's timeout or when a peer fails; nolock
writes every event exactly once in ts order; their time breakdown; on Ray, the same
engine as the other schedulers (results equal serial's, a killed executor fails the run
at once). That lock, mvlk and sstore equal serial on randomized workloads is
`test_differential`'s."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.compute as pc
import pytest
from compare import assert_same_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from local_engine import run_local
from test_team_job import _clean, _kill_mid_run
from txstream import Job
from txstream.errors import RuntimeFailure
from txstream.schedulers._whole import (
    LockWords,
    MvVersions,
    MvWords,
    PartitionPlan,
    Peer,
    plan_partitions,
    run_locked,
    run_multiversioned,
    run_partitioned,
    version_read,
)
from txstream.schedulers.sstore import PARTITIONS_PER_POOL
from txstream.schedulers.team.placement import row_pools
from txstream.schedulers.whole import WholeTransactionScheduler
from txstream.state._kernels import Udf
from txstream.state.chunk import Outcomes
from txstream.state.operations import WRITE, OperationShare, Ops
from txstream.state.sync import FAILED, PEER_FAILED, STRIDE, TIMED_OUT, sync_words, word
from txstream.state.tables import StateArrays
from txstream.topologies import BUNDLED
from txstream.topologies.generators import WorkloadSpec, generate
from workloads import workloads

TIMEOUT_S = 0.05


def _writes(cells: list[int]) -> Ops:
    """One transaction per cell, each a single WRITE of it, in that order."""
    n = len(cells)
    return Ops(
        txn=np.arange(n, dtype=np.int64),
        cell=np.array(cells, np.int64),
        kind=np.full(n, WRITE, np.int8),
        fun=np.zeros(n, np.int32),
        cond=np.zeros(n, np.int32),
        reason=np.zeros(n, np.int32),
        out=np.full(n, -1, np.int32),
        args=np.zeros((n, 1), np.int64),
        dep_ptr=np.zeros(n + 1, np.int64),
        dep_cell=np.zeros(0, np.int64),
        txn_ptr=np.arange(n + 1, dtype=np.int64),
    )


def _blocked_run(wait: str, ops: Ops, peer: Peer) -> int:
    """Run one kernel with the word ``wait`` names never reaching what it waits for."""
    state = StateArrays(
        np.zeros(1, np.int64),
        np.full(16, -1, np.int64),
        np.zeros(16, np.int64),
        np.zeros(8, np.uint8),
    )
    udf = Udf(*(np.zeros(1, np.int64),) * 2, 0, *(np.zeros(1, np.int64),) * 2)
    results = Outcomes(
        np.zeros(1, np.int8),
        np.zeros(1, np.int32),
        np.zeros((1, 1), np.int64),
        np.zeros((1, 1), bool),
    )
    s = WholeTransactionScheduler.scratch(OperationShare(ops))
    words = [np.zeros(STRIDE, np.int64), np.zeros(1, np.int64)]
    if wait == "lock turn":  # transaction 0 is the 6th in order; the 5th never took its locks
        return run_locked(0, 1, ops, state, udf, results, np.array([5]), LockWords(*words), peer, s)
    words[0][0] = 1  # the turn of ticket 1 (executor 1 of 2)
    if wait == "lock word":  # a reader holds cell 0
        words[1][0] = 1
        return run_locked(0, 1, ops, state, udf, results, np.array([1]), LockWords(*words), peer, s)
    if wait in ("mvlk turn", "mvlk low-water mark"):
        ticket = 5 if wait == "mvlk turn" else 1
        mv = MvWords(words[0], np.array([2]), np.zeros(1, np.int64), np.full(1, -1, np.int64))
        versions = MvVersions(*(np.zeros(1, np.int64) for _ in MvVersions._fields))
        return run_multiversioned(
            0, 1, ops, state, udf, results, np.array([ticket]), mv, versions, peer, s
        )  # 2 earlier writers not done
    plan = PartitionPlan(
        np.array([0, 1]), np.zeros(1, np.int64), np.array([3]), np.ones(1, np.int8)
    )
    return run_partitioned(0, 1, ops, state, udf, results, plan, words[0], peer, s)


WAITS = ("lock turn", "lock word", "mvlk turn", "mvlk low-water mark", "partition counter")


@pytest.mark.parametrize("wait", WAITS)
def test_every_wait_ends_at_the_timeout_or_when_a_peer_fails(wait):
    ops = _writes([0])
    sync = np.zeros(sync_words(2), np.int64)
    sync[word(FAILED)] = 1  # (first: this call also compiles the kernel)
    assert _blocked_run(wait, ops, Peer(sync, int(600e9), 1, 2)) == PEER_FAILED
    sync[word(FAILED)] = 0
    start = time.monotonic()
    assert _blocked_run(wait, ops, Peer(sync, int(TIMEOUT_S * 1e9), 1, 2)) == TIMED_OUT
    assert time.monotonic() - start < 5


@settings(max_examples=60, deadline=None)
@given(
    first=st.integers(0, 4),
    writers=st.integers(0, 4),
    done=st.integers(0, 4),
    taken=st.integers(0, 4),
    history=st.lists(st.integers(0, 99), min_size=9, max_size=9),
)
def test_a_versioned_read_sees_the_cell_as_its_earlier_writers_left_it(
    first, writers, done, taken, history
):
    """MVLK: writers ``first..first+writers-1`` of cell 0 are this chunk's (listed newest
    first from ``head``), earlier ones were done in earlier chunks; ``done`` of the
    chunk's are done, ``taken >= done`` have taken the cell (the last of them may be
    writing it). A reader after ``first + done`` writers must get what the last of them
    left (``history[k]``: the value once writers before k are done), whatever later
    writers did."""
    done = min(done, writers)
    taken = min(max(taken, done), writers)
    r = first + done
    v = MvVersions(*(np.full(max(1, writers), -9, np.int64) for _ in MvVersions._fields))
    v.taken[:] = 0
    for node in range(writers):
        k = first + node
        v.wseq[node], v.prev[node] = k, node - 1
        if node < taken:
            v.before[node], v.taken[node] = history[k], 1
        if node < done:
            v.after[node] = history[k + 1]
    current = history[r] if taken == done else -5  # a later writer may be writing it
    w = MvWords(
        np.zeros(STRIDE, np.int64),
        np.array([first + writers]),
        np.array([r]),
        np.array([writers - 1]),
    )
    assert version_read(0, r, w, v, np.array([current])) == history[r]


@pytest.mark.parametrize("topology", BUNDLED)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_nolock_writes_every_event_exactly_once_in_ts_order(topology, data):
    events, init = data.draw(workloads(topology))
    executors = data.draw(st.integers(1, 3), label="executors")
    interval = data.draw(st.sampled_from((1, 97, 10240)), label="interval")
    run = run_local(
        topology,
        events,
        init,
        scheduler="nolock",
        executors=executors,
        punctuation_interval=interval,
    )
    serial = run_local(topology, events, init, punctuation_interval=interval)
    got, state, want, want_state = run.events, run.state, serial.events, serial.state
    assert got.num_rows == events.num_rows
    assert got["ts"].to_pylist() == list(range(events.num_rows))
    assert got["event_id"].equals(want["event_id"])
    rejected = pc.equal(want["status"], "rejected")  # pre-processing is the same
    assert pc.equal(got["status"], "rejected").equals(rejected)
    assert got["reason"].filter(rejected).equals(want["reason"].filter(rejected))
    assert {name: t.num_rows for name, t in state.items()} == {
        name: t.num_rows for name, t in want_state.items()
    }


def test_pat_orders_a_transaction_only_after_those_on_its_partitions():
    """sstore: a pool owns many partitions (the rows it owns, as with one per pool), so a
    transaction waits only for the earlier ones that touched its partitions, not for
    every earlier one of its pool or the other's."""
    pools, rows = 2, 4096
    partitions = PARTITIONS_PER_POOL * pools
    part = row_pools(rows, partitions)
    assert partitions > pools and np.array_equal(part % pools, row_pools(rows, pools))
    # three one-write transactions: rows a and b of pool 0 on different partitions,
    # then row a again
    a = 0
    b = next(r for r in range(rows) if part[r] % pools == 0 and part[r] != part[a])
    ops = _writes([a, b, a])
    plan = PartitionPlan(
        np.empty(4, np.int64), np.empty(3, np.int64), np.empty(3, np.int64), np.empty(3, np.int8)
    )
    next_seq = np.zeros(partitions, np.int64)
    plan_partitions(ops, part, next_seq, np.empty(partitions, np.int64), pools, 0, 1, 0, plan)
    assert list(plan.part) == [part[a], part[b], part[a]]
    assert list(plan.seq) == [0, 0, 1]  # b's transaction waits for nothing; a's second for one
    assert list(plan.mine) == [1, 1, 1]  # all of pool 0's rows: executor 0's


def test_breakdown_shows_where_the_baselines_spend_their_time():
    """On a hot workload with 2 executors, lock and mvlk spend time taking locks or
    registering and waiting for each other; sstore waits for partitions; nolock never
    waits."""
    events, init = generate("gs", WorkloadSpec(events=20_000, keys=50, theta=0.9, seed=3))
    spent = {}
    for scheduler in ("lock", "mvlk", "sstore", "nolock"):
        metrics = run_local(
            "gs",
            events,
            init,
            scheduler=scheduler,
            executors=2,
            udf_cost_us=2,
            batches_per_chunk=None,
        ).metrics
        spent[scheduler] = metrics["breakdown_s"]
    for scheduler in ("lock", "mvlk"):
        assert spent[scheduler]["lock"] > 0 and spent[scheduler]["sync"] > 0, spent[scheduler]
    assert spent["sstore"]["sync"] > 0 and spent["sstore"]["lock"] == 0
    assert spent["nolock"]["lock"] == 0
    for scheduler, times in spent.items():
        assert times["useful"] > 0, scheduler


@pytest.fixture(scope="module")
def hot_sl():
    events, init = generate("sl", WorkloadSpec(events=30_000, keys=100, theta=0.9, seed=7))
    return events, init, Job("sl", progress=False).run(events, init)


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("scheduler", ("mvlk", "sstore", "nolock"))  # lock: below
def test_two_executor_actors_run_the_baselines(hot_sl, scheduler):
    events, init, serial = hot_sl
    run = Job(
        "sl", scheduler=scheduler, executors=2, punctuation_interval=4096, progress=False
    ).run(events, init)
    assert len(run.metrics["breakdown_per_executor_s"]) == 2
    assert run.metrics["events"] == events.num_rows
    assert run.metrics["coordinator"] is None
    if scheduler == "nolock":
        assert run.events["ts"].to_pylist() == list(range(events.num_rows))
    else:
        assert_same_run(run.events, run.state, serial.events, serial.state)
        assert run.events.equals(serial.events)
    _clean()


@pytest.mark.usefixtures("ray_cluster")
def test_a_killed_executor_fails_a_lock_run_at_once_and_cleans_up():
    outcome = _kill_mid_run("lock", "Executor")
    assert isinstance(outcome, RuntimeFailure), outcome
    assert "died" in str(outcome)
    _clean()
