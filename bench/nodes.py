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
  against key skew (theta), and runs of fewer events (`SIZES_SHARE`); each unit gathered
  and in levels only (the fastest of ``--repeats`` interleaved runs: on a shared host,
  others only add time), the same events on one host beside;
- ``model``: seconds per count of the cost model (`txstream.nodes.cost.COUNTS` in `TERMS`)
  fitted on the sweep's runs, its held-out error (fitted on one half of the runs, predicting
  the other, both ways: the mean, median and worst of the relative errors' sizes), and which
  plan it chooses for each pair of runs against which ran faster. The fit on every run is
  written to `txstream.nodes.cost.FITTED`: the engine's model.

On one 2-core host the nodes share the cores, so this measures the protocol's cost, not a
cluster's speed-up. Every run over nodes is checked equal to the one-host run.

    ../shared/tools/heavy --bench .venv/bin/python bench/nodes.py [--events 50000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
from common import write_results
from txstream import Job
from txstream.nodes.cost import COUNTS, FITTED
from txstream.nodes.sequencer import Sequencer
from txstream.state.keys import node_of
from txstream.topologies.generators import WorkloadSpec, generate

SHARES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
THETAS = (0.0, 0.5, 0.9, 0.99)
SIZES_SHARE = 0.05
"""The cross share of the runs of fewer events: they set a run's fixed cost apart from its
events'."""
LEVELS_THETA_MAX = 0.5
"""Runs in levels only up to this skew: beyond, hot keys make tens of thousands of levels
(minutes a run)."""
MODES = ("gathered", "levels")
TERMS = (
    "parts",
    "steps",
    "messages",
    "pipelined_steps",
    "critical_events",
    "node_events",
    "exchanged_values",
)
"""The counts of `txstream.nodes.cost.COUNTS` the model prices."""


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
    parser.add_argument("--repeats", type=int, default=3, help="of each sweep run")
    parser.add_argument("--out", default="nodes")
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    counts = [int(n) for n in args.nodes.split(",")]
    folder = tempfile.mkdtemp(prefix="txs-bench-nodes-")
    node = {"num_cpus": 1, "object_store_memory": 300 * 1024**2, "temp_dir": folder}
    # Ray notes a cluster's address in its default folder whatever temp_dir says, and
    # fails where that folder does not exist: made for the run
    ray_folder = Path(tempfile.gettempdir()) / "ray"
    made = not ray_folder.exists()
    ray_folder.mkdir(exist_ok=True)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=node)
        for _ in range(max(counts) - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        results = run_all(args, counts, cluster.address)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
        if made:
            shutil.rmtree(ray_folder, ignore_errors=True)
    path = write_results(args.out, results)
    plot(results, path.with_suffix(".png"))
    print(path)


def run_all(args: argparse.Namespace, counts: list[int], address: str) -> dict:
    """Every part of the module docstring."""
    results: dict = {"events": args.events, "keys": args.keys, "repeats": args.repeats}
    events, init = chain(2000)
    one = _run(events, init, 1, address)
    results["chain"] = {
        mode: _measure(events, init, 2, address, one, mode) for mode in ("chosen", "levels")
    }
    for figures in results["chain"].values():
        figures["ms_per_transfer"] = round(1e3 * figures["seconds"] / events.num_rows, 3)
    print("chain", results["chain"], flush=True)
    events, init = generate("sl", WorkloadSpec(events=5000, keys=200, theta=0.99, seed=1))
    one = _run(events, init, 1, address)
    results["hot"] = {str(n): _measure(events, init, n, address, one, "chosen") for n in counts}
    results["hot_one_host_s"] = one.metrics["seconds"]
    print("hot", results["hot"], flush=True)
    results["ratio"] = ratio(args, address)
    print("ratio", results["ratio"], flush=True)
    runs = []
    for nodes in counts:
        sizes = (args.events // 5, args.events // 2)
        for axis, values in (("share", SHARES), ("theta", THETAS), ("events", sizes)):
            for value in values:
                runs += sweep_cell(args, address, nodes, axis, value)
    results["sweep"] = runs
    results["model"] = model(runs)
    print("model", results["model"], flush=True)
    return results


def sweep_cell(args, address: str, nodes: int, axis: str, value: float) -> list[dict]:
    """One share, theta or number of events over ``nodes`` nodes: gathered and in levels only (up to
    `LEVELS_THETA_MAX`), each the fastest of ``args.repeats``."""
    if axis == "theta":
        spec = WorkloadSpec(events=args.events, keys=args.keys, theta=value, seed=1)
        events, init = generate("sl", spec)
    else:
        size, share = (args.events, value) if axis == "share" else (int(value), SIZES_SHARE)
        base, init = generate("sl", WorkloadSpec(events=size, keys=args.keys, seed=1))
        events = with_cross_share(base, share, nodes, args.keys)
    one = _run(events, init, 1, address)
    modes = MODES if axis != "theta" or value <= LEVELS_THETA_MAX else ("gathered",)
    repeats = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode in modes:
            repeats[mode].append(_measure(events, init, nodes, address, one, mode))
    runs = []
    for mode, measured in repeats.items():
        run = min(measured, key=lambda r: r["seconds"])
        share = round(run["cross"] / run["events"], 3)
        runs.append(
            {"nodes": nodes, "axis": axis, "value": value, "mode": mode, "cross_share": share}
            | run
            | {"seconds_repeats": [r["seconds"] for r in measured]}
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


class _Prefer:
    """A cost model that takes a gathered plan wherever one fits."""

    @staticmethod
    def seconds(plan) -> int:
        return 0 if plan.gathered else 1


class _Timer:
    """Seconds spent in the functions it wraps."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, function):
        def timed(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - begin

        return timed


def _measure(events, init, nodes: int, address: str, one, mode: str) -> dict:
    """A run over ``nodes`` nodes, its units as the cost model chooses (``mode``
    "chosen"), gathered wherever they fit ("gathered") or never ("levels"), checked against
    the one-host run ``one``; its figures, with the seconds the driver spent building plans
    (``sequencing_s``)."""
    timer = _Timer()
    gather = (lambda *_: None) if mode == "levels" else Sequencer.gather
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(Sequencer, "plan", timer.wrap(Sequencer.plan)))
        stack.enter_context(mock.patch.object(Sequencer, "gather", timer.wrap(gather)))
        if mode == "gathered":
            stack.enter_context(mock.patch("txstream.nodes.session.COST", _Prefer()))
        many = _run(events, init, nodes, address)
    assert many.events.equals(one.events), "a run over nodes differs from one host"
    m = many.metrics
    return {
        "events": m["events"],
        "seconds": m["seconds"],
        "sequencing_s": round(timer.seconds, 6),
        "throughput_eps": m["throughput_eps"],
        "one_host_eps": one.metrics["throughput_eps"],
        **{k: m["nodes"][k] for k in ("units", "gathered_units", "cross", *COUNTS)},
        "step_s": [n["step_s"] for n in m["nodes"]["per_node"]],
    }


def _run(events: pa.Table, init: dict, nodes: int, address: str):
    return Job("sl", source="arrow", progress=False, address=address, nodes=nodes).run(events, init)


def model(runs: list[dict]) -> dict:
    """The cost model over ``runs`` (module docstring): held out, then fitted on every run
    and written to `FITTED`."""
    by_mode = [[r for r in runs if r["mode"] == mode] for mode in MODES]
    # Every other run of each mode: both halves span the sweep and hold both plans.
    halves = [[r for rs in by_mode for r in rs[::2]], [r for rs in by_mode for r in rs[1::2]]]
    errors = {}
    for train, test in (halves, halves[::-1]):
        base, per = fit(train)
        for r in test:
            errors[id(r)] = predict(base, per, r) / priced(r) - 1
    held_out = [errors[id(r)] for r in runs]
    worst = int(np.argmax(np.abs(held_out)))
    base, per = fit(runs)
    FITTED.write_text(json.dumps({"seconds_per": per}, indent=2) + "\n")
    return {
        "terms": list(TERMS),
        "base_s": round(base, 4),
        "seconds_per": per,
        "held_out_relative_error": [round(e, 3) for e in held_out],
        "held_out_mean_abs_error": round(float(np.mean(np.abs(held_out))), 3),
        "held_out_median_abs_error": round(float(np.median(np.abs(held_out))), 3),
        "held_out_worst_abs_error": round(abs(held_out[worst]), 3),
        "held_out_worst_run": {k: runs[worst][k] for k in ("nodes", "axis", "value", "mode")},
        "choices": choices(runs, per),
    }


def fit(runs: list[dict]) -> tuple[float, dict[str, float]]:
    """`priced` ``≈ base + Σ seconds_per[t]·t`` over `TERMS`, by least squares of the
    relative error (short runs count as much as long ones); a term fitted below 0 is held at
    0 (a count costs no less than nothing). ``base``: a run's own, not a unit's."""
    seconds = np.array([priced(r) for r in runs])
    design = np.array([[1.0, *(r[t] for t in TERMS)] for r in runs]) / seconds[:, None]
    kept = np.ones(1 + len(TERMS), bool)
    coef = np.zeros(len(kept))
    while True:
        coef[kept] = np.linalg.lstsq(design[:, kept], np.ones(len(runs)), rcond=None)[0]
        if coef[1:].min() >= 0:
            break
        kept[1 + np.argmin(coef[1:])] = False
        coef[~kept] = 0.0
    return float(coef[0]), {t: float(f"{c:.3g}") for t, c in zip(TERMS, coef[1:], strict=True)}


def priced(run: dict) -> float:
    """The run's seconds the model prices: all but building plans, which every unit does for
    each plan whichever runs."""
    return run["seconds"] - run["sequencing_s"]


def predict(base: float, per: dict[str, float], run: dict) -> float:
    return base + sum(per[t] * run[t] for t in TERMS)


def choices(runs: list[dict], per: dict[str, float]) -> list[dict]:
    """For each events run both gathered and in levels: how much faster gathered ran, and
    whether the model (``per``) takes the faster."""
    out = []
    for r in runs:
        if r["mode"] != "gathered":
            continue
        pair = [q for q in runs if q["mode"] == "levels" and _same_events(q, r)]
        if not pair:
            continue
        speedup = priced(pair[0]) / priced(r)
        gathers = predict(0.0, per, r) < predict(0.0, per, pair[0])
        out.append(
            {k: r[k] for k in ("nodes", "axis", "value")}
            | {"gathered_speedup": round(speedup, 2), "right": gathers == (speedup > 1)}
        )
    return out


def _same_events(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("nodes", "axis", "value"))


def plot(results: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, axis in zip(axes, ("share", "theta"), strict=True):
        runs = [r for r in results["sweep"] if r["axis"] == axis]
        for nodes in sorted({r["nodes"] for r in runs}):
            for mode, style in (("gathered", "o-"), ("levels", "x:")):
                rs = [r for r in runs if r["nodes"] == nodes and r["mode"] == mode]
                x = [r["value"] for r in rs]
                ax.plot(x, [r["throughput_eps"] for r in rs], style, label=f"{nodes} nodes, {mode}")
        rs = [r for r in runs if r["nodes"] == runs[0]["nodes"] and r["mode"] == "gathered"]
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
