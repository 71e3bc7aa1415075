"""Runs over several nodes on a simulated cluster: what a level costs, what gathering a unit
on one node saves, and the cost model that chooses between them (`txstream.nodes.cost`).

A local Ray cluster of up to three nodes on this host (`ray.cluster_utils.Cluster`):

- ``chain``: SL transfers alternating between keys of two nodes, each depending on the one
  before (one level each when run in levels): engine seconds per transfer, gathered and in
  levels (the latter is the cost of a level);
- ``hot``: generator SL events on few keys at theta 0.99, against one host;
- ``ratio``: the generator's SL events over 2 nodes against 1 node of the same cluster,
  interleaved pairs, their median;
- ``sweep``: events/s against the share of cross-node transactions (the keys of an event
  moved to keys of one node, or of two: `node_of`; the share each run measured beside) and
  against key skew (theta), each as the cost model chooses and in levels only, the same
  events on one host beside;
- ``model``: the cost model's coefficients fitted per node count on half of the sweep's
  runs, its relative error on the other half.

On one 2-core host the nodes share the cores, so this measures the protocol's cost, not a
cluster's speed-up. Every run over nodes is checked equal to the one-host run.

    ../shared/tools/heavy --bench .venv/bin/python bench/nodes.py [--events 50000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from contextlib import nullcontext
from unittest import mock

import numpy as np
import pyarrow as pa
from common import write_results
from txstream import Job
from txstream.nodes.sequencer import Sequencer
from txstream.state.keys import node_of
from txstream.topologies.generators import WorkloadSpec, generate

SHARES = (0.0, 0.01, 0.05, 0.2, 1.0)
THETAS = (0.0, 0.5, 0.9, 0.99)
LEVELS_THETA_MAX = 0.5
"""Runs in levels only up to this skew: beyond, hot keys make tens of thousands of levels
(minutes a run)."""
FEATURES = ("steps", "critical_events", "exchanged_values")
"""A run's plan counts the cost model prices (`txstream.nodes.cost.CostModel`)."""


def with_cross_share(events: pa.Table, share: float, nodes: int, keys: int, seed: int = 0):
    """``events`` with about ``share`` of them across nodes: the keys of the others moved
    to the node of their account (`node_of`), those of these to that node and the next."""
    rng = np.random.default_rng(seed)
    cross = rng.random(events.num_rows) < share
    owned = [np.flatnonzero(node_of(np.arange(keys), nodes) == n) for n in range(nodes)]
    home = node_of(events.column("account").fill_null(0).to_numpy(), nodes)
    columns = {}
    for name, shift in (("asset", 1), ("dst_account", 0), ("dst_asset", 1)):
        column = events.column(name)
        key = column.fill_null(0).to_numpy()
        want = np.where(cross, (home + shift) % nodes, home)
        moved = key.copy()
        for n, pool in enumerate(owned):
            # The first key at or after ``key`` that node ``n`` owns (wrapping past the last).
            at = want == n
            moved[at] = pool[np.searchsorted(pool, key[at]) % len(pool)]
        columns[name] = pa.array(moved, pa.int64(), mask=column.is_null().to_numpy())
    for name, values in columns.items():
        events = events.set_column(events.schema.get_field_index(name), name, values)
    return events


def chain(n: int) -> tuple[pa.Table, dict[str, pa.Table]]:
    """``n`` SL transfers between keys 0 and 1 of both tables (nodes 0 and 1 of two), in
    turn each way: every one crosses the nodes and reads what the one before wrote."""
    base, init = generate("sl", WorkloadSpec(events=1, keys=4, seed=0))
    i = np.arange(n, dtype=np.int64)
    events = pa.table(
        {
            "event_id": i,
            "kind": pa.array(["transfer"] * n),
            "account": i % 2,
            "asset": i % 2,
            "dst_account": 1 - i % 2,
            "dst_asset": 1 - i % 2,
            "amount": 1 + i % 3,
            "asset_amount": 1 + i % 2,
        }
    )
    return events.cast(base.schema), init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000, help="of each sweep run")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--nodes", default="2,3")
    parser.add_argument("--ratio-events", type=int, default=1_000_000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", default="nodes")
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    counts = [int(n) for n in args.nodes.split(",")]
    folder = tempfile.mkdtemp(prefix="txs-bench-nodes-")
    node = {"num_cpus": 1, "object_store_memory": 300 * 1024**2, "temp_dir": folder}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        for _ in range(max(counts) - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        results = run_all(args, counts, cluster.address)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    path = write_results(args.out, results)
    plot(results, path.with_suffix(".png"))
    print(path)


def run_all(args: argparse.Namespace, counts: list[int], address: str) -> dict:
    """Every part of the module docstring."""
    results: dict = {"events": args.events, "keys": args.keys}
    events, init = chain(2000)
    one = _run(events, init, 1, address)
    results["chain"] = {
        mode: _measure(events, init, 2, address, one, levels_only=mode == "levels")
        for mode in ("chosen", "levels")
    }
    for figures in results["chain"].values():
        figures["ms_per_transfer"] = round(1e3 * figures["seconds"] / events.num_rows, 3)
    print("chain", results["chain"], flush=True)
    events, init = generate("sl", WorkloadSpec(events=5000, keys=200, theta=0.99, seed=1))
    one = _run(events, init, 1, address)
    results["hot"] = {
        str(n): _measure(events, init, n, address, one, levels_only=False) for n in counts
    }
    results["hot_one_host_s"] = one.metrics["seconds"]
    print("hot", results["hot"], flush=True)
    results["ratio"] = ratio(args, address)
    print("ratio", results["ratio"], flush=True)
    runs = []
    for nodes in counts:
        for axis, values in (("share", SHARES), ("theta", THETAS)):
            for value in values:
                runs += sweep_cell(args, address, nodes, axis, value)
    results["sweep"] = runs
    results["model"] = {str(n): fit([r for r in runs if r["nodes"] == n]) for n in counts}
    return results


def sweep_cell(args, address: str, nodes: int, axis: str, value: float) -> list[dict]:
    """One share or theta over ``nodes`` nodes: as the model chooses and in levels only
    (up to `LEVELS_THETA_MAX`)."""
    if axis == "share":
        base, init = generate("sl", WorkloadSpec(events=args.events, keys=args.keys, seed=1))
        events = with_cross_share(base, value, nodes, args.keys)
    else:
        spec = WorkloadSpec(events=args.events, keys=args.keys, theta=value, seed=1)
        events, init = generate("sl", spec)
    one = _run(events, init, 1, address)
    runs = []
    modes = ("chosen", "levels") if axis == "share" or value <= LEVELS_THETA_MAX else ("chosen",)
    for mode in modes:
        run = _measure(events, init, nodes, address, one, levels_only=mode == "levels")
        measured = round(run["cross"] / run["events"], 3)
        runs.append(
            {"nodes": nodes, "axis": axis, "value": value, "mode": mode, "cross_share": measured}
            | run
        )
        print(runs[-1], flush=True)
    return runs


def ratio(args, address: str) -> dict:
    """The generator's SL events over 2 nodes against 1 node, ``args.pairs`` interleaved
    pairs: each pair's ratio of events/s, and their median."""
    events, init = generate("sl", WorkloadSpec(events=args.ratio_events, seed=0))
    pairs = []
    for _ in range(args.pairs):
        one = _run(events, init, 1, address)
        two = _run(events, init, 2, address)
        assert two.events.equals(one.events), "a run over nodes differs from one host"
        pairs.append(
            {
                "one_node_eps": one.metrics["throughput_eps"],
                "two_nodes_eps": two.metrics["throughput_eps"],
                "gathered_units": two.metrics["nodes"]["gathered_units"],
                "units": two.metrics["nodes"]["units"],
            }
        )
        print(pairs[-1], flush=True)
    ratios = [p["two_nodes_eps"] / p["one_node_eps"] for p in pairs]
    return {
        "events": args.ratio_events,
        "pairs": pairs,
        "ratios": [round(r, 3) for r in ratios],
        "median": round(statistics.median(ratios), 3),
    }


def _measure(events, init, nodes: int, address: str, one, levels_only: bool) -> dict:
    """A run over ``nodes`` nodes (``levels_only``: no unit gathered), checked against the
    one-host run ``one``; its figures."""
    off = mock.patch.object(Sequencer, "gather", lambda *_: None) if levels_only else nullcontext()
    with off:
        many = _run(events, init, nodes, address)
    assert many.events.equals(one.events), "a run over nodes differs from one host"
    m = many.metrics
    return {
        "events": m["events"],
        "seconds": m["seconds"],
        "throughput_eps": m["throughput_eps"],
        "one_host_eps": one.metrics["throughput_eps"],
        **{k: m["nodes"][k] for k in ("units", "levels", "gathered_units", "cross", *FEATURES)},
        "step_s": [n["step_s"] for n in m["nodes"]["per_node"]],
    }


def _run(events: pa.Table, init: dict, nodes: int, address: str):
    return Job("sl", source="arrow", progress=False, address=address, nodes=nodes).run(events, init)


def fit(runs: list[dict]) -> dict:
    """``seconds ≈ base + Σ coefficient·feature`` over `FEATURES`, fitted on every other
    run of each mode, checked on the rest: the coefficients and the held-out runs' relative
    errors. The coefficients are kept at 0 or above (a count costs no less than nothing).
    (Every other run overall would train on the chosen runs alone, whose plans are
    alike, and test on the levels runs.)"""
    by_mode = [[r for r in runs if r["mode"] == mode] for mode in ("chosen", "levels")]
    train = [r for rs in by_mode for r in rs[::2]]
    test = [r for rs in by_mode for r in rs[1::2]]

    def design(rs):
        return np.array([[1.0, *(r[f] for f in FEATURES)] for r in rs], dtype=float)

    seconds = np.array([r["seconds"] for r in train])
    kept = np.ones(1 + len(FEATURES), bool)
    coef = np.zeros(len(kept))
    while True:
        # A count that costs no time at most: dropped (held at 0) when fitted below 0.
        coef[kept] = np.linalg.lstsq(design(train)[:, kept], seconds, rcond=None)[0]
        if coef[1:].min() >= 0:
            break
        kept[1 + np.argmin(coef[1:])] = False
        coef[~kept] = 0.0
    predicted = design(test) @ coef
    errors = [float(p / r["seconds"] - 1) for p, r in zip(predicted, test, strict=True)]
    return {
        "base_s": round(float(coef[0]), 4),
        "step_ms": round(float(coef[1]) * 1e3, 4),
        "event_us": round(float(coef[2]) * 1e6, 4),
        "value_us": round(float(coef[3]) * 1e6, 4),
        "held_out_relative_error": [round(e, 3) for e in errors],
        "held_out_median_abs_error": round(float(np.median(np.abs(errors))), 3),
        "held_out_worst_abs_error": round(float(np.max(np.abs(errors))), 3),
    }


def plot(results: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, axis in zip(axes, ("share", "theta"), strict=True):
        runs = [r for r in results["sweep"] if r["axis"] == axis]
        for nodes in sorted({r["nodes"] for r in runs}):
            for mode, style in (("chosen", "o-"), ("levels", "x:")):
                rs = [r for r in runs if r["nodes"] == nodes and r["mode"] == mode]
                x = [r["value"] for r in rs]
                ax.plot(x, [r["throughput_eps"] for r in rs], style, label=f"{nodes} nodes, {mode}")
        rs = [r for r in runs if r["nodes"] == runs[0]["nodes"] and r["mode"] == "chosen"]
        ax.plot([r["value"] for r in rs], [r["one_host_eps"] for r in rs], "k--", label="one host")
        ax.set(
            yscale="log",
            xlabel="cross-node transactions (share)" if axis == "share" else "key skew (theta)",
            ylabel="events/s",
        )
        ax.legend(fontsize=7)
    axes[0].set_title("SL over a simulated cluster (one 2-core host)")
    axes[1].set_title("against key skew")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
