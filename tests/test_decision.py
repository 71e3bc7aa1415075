"""MorphStream's decision model: every choice of every dimension is reachable, fixed
dimensions are kept, and `auto` decides from what the team measured."""

from __future__ import annotations

import os

import numpy as np
import pytest
from local_engine import run_local
from txstream.actors.executor import Executor
from txstream.actors.sink import Sink
from txstream.schedulers.decision import (
    ABORT,
    EXPLORE,
    GRANULARITY,
    BatchStats,
    Choice,
    DecisionLog,
    History,
    Thresholds,
    WalkedBatches,
    decide,
    executors_for,
)
from txstream.schedulers.morphstream import FIRST_WALK_EVENTS
from txstream.topologies.generators import WorkloadSpec, generate

TH = Thresholds()
AUTO = Choice("auto", "auto", "auto")


def _stats(**fields) -> BatchStats:
    base = dict(
        transactions=1000, operations=2000, td=500, pd=0, ld=1000, cross=0, rows=1500, hot=4
    )
    return BatchStats(**{**base, **fields})


def test_fixed_dimensions_are_kept():
    for explore in EXPLORE:
        for granularity in GRANULARITY:
            for abort in ABORT:
                fixed = Choice(explore, granularity, abort)
                assert decide(_stats(cross=900, hot=900), History(), fixed, TH) == fixed


def test_granularity_is_coarse_without_cross_row_dependencies_and_fine_with_many_or_cycles():
    assert decide(_stats(cross=0), History(), AUTO, TH).granularity == "coarse"
    many = int(TH.coarse_max_cross * 2000) + 1
    assert decide(_stats(cross=many, pd=many), History(), AUTO, TH).granularity == "fine"
    cyclic = History(merged_share=TH.coarse_max_merged * 2)
    assert decide(_stats(cross=1, pd=1), cyclic, AUTO, TH).granularity == "fine"


def test_exploration_is_bfs_with_few_strata_ns_when_skewed_dfs_otherwise():
    assert decide(_stats(cross=0), History(), AUTO, TH).explore == "bfs"
    fine = Choice("auto", "fine", "auto")
    few_strata = int(TH.bfs_max_strata_share * 2000)
    assert decide(_stats(hot=few_strata), History(), fine, TH).explore == "bfs"
    # skew = hot * cells touched / operations
    skewed = _stats(td=1900, hot=int(TH.ns_min_skew * 2000 / 100) + 1)
    assert decide(skewed, History(), fine, TH).explore == "ns"
    assert decide(_stats(td=1700, hot=few_strata + 1), History(), fine, TH).explore == "dfs"


def test_skewed_batches_are_explored_ns_only_when_operations_are_costly():
    fine = Choice("auto", "fine", "auto")
    skewed = _stats(td=1900, hot=int(TH.ns_min_skew * 2000 / 100) + 1)
    for cost, want in [
        (None, "ns"),  # the first batch: nothing measured yet
        (TH.ns_min_cost_us * 10, "ns"),
        (TH.ns_min_cost_us / 10, "dfs"),
        (0.0, "dfs"),
    ]:
        assert decide(skewed, History(cost_us=cost), fine, TH).explore == want


def test_aborts_are_eager_when_late_repairs_cost_more_than_pauses_and_failures_are_few():
    costly = (TH.eager_min_late_us / 10) * 2  # us per operation, with 10 redone per failure
    cheap = (TH.eager_min_late_us / 10) / 2
    few = TH.eager_max_failures / 2 / 1000  # abort ratios of the 1000-transaction batch
    many = TH.eager_max_failures * 2 / 1000
    for cost, ratio, want in [
        (costly, few, "eager"),
        (costly, many, "lazy"),
        (cheap, few, "lazy"),
        (None, None, "lazy"),
    ]:
        history = History(abort_ratio=ratio, cost_us=cost, redo_per_failure=10.0)
        assert decide(_stats(), history, AUTO, TH).abort == want


def test_history_folds_in_what_batches_measured():
    history = History()
    stats = _stats(
        failed=100, redone=400, explore_s=0.004, granularity="coarse", merged=150, abort="lazy"
    )
    history.update(stats, memory=0.5)
    assert (history.abort_ratio, history.cost_us, history.merged_share) == (0.1, 2.0, 0.1)
    assert history.redo_per_failure == 4.0
    history.update(_stats(failed=0, explore_s=0.0, granularity="fine"), memory=0.5)
    assert (history.abort_ratio, history.cost_us, history.merged_share) == (0.05, 1.0, 0.1)
    history.update(_stats(failed=10, redone=0, abort="eager"), memory=0.5)  # eager: not folded
    assert history.redo_per_failure == 4.0


def test_the_log_counts_every_batch_and_keeps_its_statistics_up_to_a_limit():
    log = DecisionLog(limit=2)
    for explore in ("bfs", "ns", "ns"):
        log.add(_stats(explore=explore, granularity="fine", abort="lazy"))
    log.add(_stats(explore="ordered"))  # no units, no abort policy: counted as walked only
    report = log.report()
    assert report["decisions"]["explore"] == {"bfs": 1, "dfs": 0, "ns": 2, "ordered": 1}
    assert report["decisions"]["granularity"] == {"fine": 3, "coarse": 0}
    assert report["decision_batches"]["explore"] == ["bfs", "ns"]


def test_walked_batches_are_logged_as_columns_in_batch_order_up_to_the_limit():
    log = DecisionLog(limit=4)
    log.add(_stats(explore="bfs", granularity="fine", abort="lazy"))
    columns = ([10, 20, 30], [30, 60, 90], [1, 0, 2], [0.5, 1, 2])
    walk = WalkedBatches(*(np.array(column) for column in columns))
    log.add_walked(walk)
    log.add_walked(walk)  # counted, past the limit: not kept
    log.add(_stats(explore="ns", granularity="fine", abort="lazy"))
    report = log.report()
    assert report["decisions"]["explore"] == {"bfs": 1, "dfs": 0, "ns": 1, "ordered": 6}
    batches = report["decision_batches"]
    assert batches["explore"] == ["bfs", "ordered", "ordered", "ordered"]
    assert batches["transactions"] == [1000, 10, 20, 30]
    assert batches["operations"][1:] == [30, 60, 90]
    assert batches["failed"][1:] == [1, 0, 2]
    assert batches["explore_s"][1:] == [0.5, 1.0, 2.0]
    assert batches["granularity"][1:] == batches["abort"][1:] == ["", "", ""]
    assert batches["td"][1:] == [0, 0, 0]


def _team(topology: str, events, init, **options):
    """morphstream (auto) on two executors, batches of 1,000 events cut by count."""
    return run_local(
        topology,
        events,
        init,
        scheduler="morphstream",
        executors=2,
        punctuation_interval=1000,
        punctuation_ms=None,
        **options,
    )


def _decisions(topology: str, spec: WorkloadSpec, **options) -> dict:
    events, init = generate(topology, spec)
    return _team(topology, events, init, udf_cost_us=1, **options).metrics


def _explored(metrics: dict, column: str) -> list:
    """``column`` of the batches explored over a graph (not the first chunk's walk)."""
    batches = metrics["decision_batches"]
    return [v for v, e in zip(batches[column], batches["explore"], strict=True) if e != "ordered"]


def test_one_executor_walks_while_operations_cost_less_than_the_team_adds():
    history = History()
    assert executors_for(history, TH, 2) == 2  # nothing measured yet: the graph is built
    history.update(_stats(explore_s=2000 * 0.1e-6), memory=0.5)  # 0.1 us per operation
    assert executors_for(history, TH, 2) == 1
    history.update(_stats(explore_s=2000 * 10e-6), memory=0.5)  # costlier: the graph again
    assert executors_for(history, TH, 2) == 2
    # c / N + team_cost_us against c: the team pays from 2 x team_cost_us on two, sooner on more
    history.cost_us = 1.5 * TH.team_cost_us
    assert executors_for(history, TH, 2) == 1 and executors_for(history, TH, 4) == 4
    assert executors_for(History(), TH, 1) == 1


def test_a_history_saved_for_peers_is_loaded_as_it_was():
    history = History(cost_us=0.25, merged_share=0.5)
    words = [0.0] * 4
    history.save(words)
    assert History.load(words) == history


def test_auto_walks_cheap_operations_in_order_with_serials_results():
    events, init = generate("sl", WorkloadSpec(events=20_000, keys=500, abort_ratio=0.1, seed=3))
    options = dict(executors=2, punctuation_interval=1000, punctuation_ms=None)
    walked = run_local("sl", events, init, scheduler="morphstream", **options)
    serial = run_local("sl", events, init, scheduler="serial")
    assert walked.events.equals(serial.events) and walked.state == serial.state
    decisions, batches = walked.metrics["decisions"], walked.metrics["batches"]["count"]
    assert decisions["explore"]["ordered"] > 1
    # nothing is timed before the first chunk: executor 0 walks a small one alone, at no
    # barrier, and the second is dispatched once it answered
    chunks, columns = walked.metrics["batches"]["chunks"], walked.metrics["decision_batches"]
    assert chunks[0]["events"] == FIRST_WALK_EVENTS and chunks[0]["breakdown_s"]["sync"] == 0
    assert columns["explore"][0] == "ordered"
    assert sum(decisions["explore"].values()) == batches
    walked_failed = [
        f for e, f in zip(columns["explore"], columns["failed"], strict=True) if e == "ordered"
    ]
    assert sum(walked_failed) > 0  # aborts counted in the walk too
    costly = run_local("sl", events, init, scheduler="morphstream", udf_cost_us=1, **options)
    assert costly.metrics["decisions"]["explore"]["ordered"] == 1  # the first chunk only
    assert costly.events.equals(serial.events) and costly.state == serial.state


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nowhere to move to")
def test_while_executor_0_walks_alone_its_feeders_keep_off_its_core(monkeypatch):
    """The Sink writes a lone executor 0's rows on its idle peers' cores, as the
    ProgressController dispatches from there (`ProgressController._pin`)."""
    seen: dict[str, list] = {"executor": [], "sink": []}
    process, write = Executor.process, Sink.write

    def processing(self, *args, **kwargs):
        if self.rank == 0:
            seen["executor"].append(os.sched_getaffinity(0))
        return process(self, *args, **kwargs)

    def writing(self, *args, **kwargs):
        seen["sink"].append(os.sched_getaffinity(0))
        return write(self, *args, **kwargs)

    monkeypatch.setattr(Executor, "process", processing)
    monkeypatch.setattr(Sink, "write", writing)
    events, init = generate("sl", WorkloadSpec(events=20_000, keys=500, seed=3))
    walked = run_local("sl", events, init, scheduler="morphstream", executors=2)
    assert walked.metrics["decisions"]["explore"]["ordered"] > 1
    (executor_core,) = set(map(frozenset, seen["executor"]))
    assert seen["sink"] and all(not cpus & executor_core for cpus in seen["sink"])


def test_auto_decides_from_the_measured_graph_of_each_batch():
    # operations of 1 us: a graph pays (cheaper ones are walked in order, above)
    # SL has no parametric reads: coarse units, no edges between them, one stratum
    sl = _decisions("sl", WorkloadSpec(events=3000, keys=500, seed=1))
    assert sl["decisions"]["granularity"]["coarse"] == 3 and sl["decisions"]["explore"]["bfs"] == 3
    # GS writes read other records: many cross-row edges, fine units
    gs = _decisions("gs", WorkloadSpec(events=3000, keys=500, deps=4, seed=1))
    assert gs["decisions"]["granularity"]["fine"] == 3
    assert all(c > 0 for c in _explored(gs, "cross"))
    # many failures: lazy, and what they cost is measured
    aborts = _decisions("sl", WorkloadSpec(events=4000, keys=500, abort_ratio=0.5, seed=1))
    assert aborts["decisions"]["abort"] == {"eager": 0, "lazy": 4}
    assert all(f > 0 for f in _explored(aborts, "failed"))


def test_a_team_walking_in_order_builds_graphs_again_once_operations_get_costlier():
    """Every executor folds the team's walk into its history, so the team turns back to
    graphs together (one that folded only its own walk, nothing, would keep walking while
    executor 0 links): deposits cost 20 us of busy work from the middle on."""
    events, init = generate("sl", WorkloadSpec(events=20_000, keys=500, seed=3))
    topology = "costlier_topology:build"
    team = _team(topology, events, init, timeout_s=20)
    serial = run_local(topology, events, init, punctuation_interval=1000, timeout_s=20)
    assert team.events.equals(serial.events) and team.state == serial.state
    explore = team.metrics["decision_batches"]["explore"]
    walked_from = explore.index("ordered", 1)  # decided from a measurement: not the first
    assert any(choice != "ordered" for choice in explore[walked_from:])
