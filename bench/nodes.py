"""Runs over several nodes on a simulated cluster: what a level costs, and the model of
docs/design.md (nodes/) checked against measured runs.

A local Ray cluster of up to three nodes on this host (`ray.cluster_utils.Cluster`), SL
events whose share of transactions across nodes is set from none to all (the keys of an
event moved to one residue mod N, or to two), the same events on one host as reference.
Each run's time is modelled as ``base + t_l·levels`` (``t_l``: the cost of one level, the
exchange between nodes included; the runs have the same events); both are fitted per node
count on half of the shares and predict the other half. On one 2-core host the nodes share
the cores, so this measures the protocol's cost, not a cluster's speed-up.

    ../shared/tools/heavy --bench .venv/bin/python bench/nodes.py [--events 100000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import numpy as np
import pyarrow as pa
from common import write_results
from txstream import Job
from txstream.topologies.generators import WorkloadSpec, generate

SHARES = (0.0, 0.01, 0.05, 0.2, 1.0)


def with_cross_share(events: pa.Table, share: float, nodes: int, keys: int, seed: int = 0):
    """``events`` with about ``share`` of them across nodes: the keys of the others moved
    to the residue of their account (mod ``nodes``), those of these to two residues."""
    rng = np.random.default_rng(seed)
    cross = rng.random(events.num_rows) < share
    account = events.column("account").fill_null(0).to_numpy()
    home = account % nodes
    columns = {}
    for name, shift in (("asset", 1), ("dst_account", 0), ("dst_asset", 1)):
        column = events.column(name)
        key = column.fill_null(0).to_numpy()
        want = np.where(cross, (home + shift) % nodes, home)
        moved = key - key % nodes + want
        moved = np.where(moved >= keys, moved - nodes, moved)
        columns[name] = pa.array(moved, pa.int64(), mask=column.is_null().to_numpy())
    for name, values in columns.items():
        events = events.set_column(events.schema.get_field_index(name), name, values)
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--nodes", default="2,3")
    parser.add_argument("--out", default="nodes")
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    counts = [int(n) for n in args.nodes.split(",")]
    folder = tempfile.mkdtemp(prefix="txs-bench-nodes-")
    node = {"num_cpus": 1, "object_store_memory": 200 * 1024**2, "temp_dir": folder}
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
    """Every node count and share; the fitted model per node count."""
    base, init = generate("sl", WorkloadSpec(events=args.events, keys=args.keys, seed=1))
    runs = []
    for nodes in counts:
        for share in SHARES:
            events = with_cross_share(base, share, nodes, args.keys)
            one = _run(events, init, 1, address)
            many = _run(events, init, nodes, address)
            assert many.events.equals(one.events), "a run over nodes differs from one host"
            m = many.metrics
            runs.append(
                {
                    "nodes": nodes,
                    "share": share,
                    "events": m["events"],
                    "seconds": m["seconds"],
                    "throughput_eps": m["throughput_eps"],
                    "one_host_eps": one.metrics["throughput_eps"],
                    **{k: m["nodes"][k] for k in ("levels", "steps", "cross", "exchanged_values")},
                    "per_node": m["nodes"]["per_node"],
                }
            )
            print({k: v for k, v in runs[-1].items() if k != "per_node"}, flush=True)
    return {
        "events": args.events,
        "keys": args.keys,
        "runs": runs,
        "model": {str(n): fit([r for r in runs if r["nodes"] == n]) for n in counts},
    }


def _run(events: pa.Table, init: dict, nodes: int, address: str):
    options = {"address": address, "nodes": nodes} if nodes > 1 else {"transport": "threads"}
    return Job("sl", source="arrow", progress=False, **options).run(events, init)


def fit(runs: list[dict]) -> dict:
    """``seconds ≈ base + t_l·levels`` (the runs have the same events), fitted on every
    other share, checked on the rest: the coefficients, the held-out runs' relative
    errors, and how much of a level the nodes spent in their steps (the rest is Ray's)."""
    train, test = runs[::2], runs[1::2]

    def design(rs):
        return np.array([[1.0, r["levels"]] for r in rs])

    coef, *_ = np.linalg.lstsq(design(train), np.array([r["seconds"] for r in train]), rcond=None)
    predicted = design(test) @ coef
    errors = [round(float(p / r["seconds"] - 1), 3) for p, r in zip(predicted, test, strict=True)]
    busiest = runs[-1]
    return {
        "base_s": round(float(coef[0]), 3),
        "ms_per_level": round(float(coef[1]) * 1e3, 3),
        "held_out_shares": [r["share"] for r in test],
        "held_out_relative_error": errors,
        "ms_in_steps_per_level_at_share_1": round(
            1e3 * max(n["step_s"] for n in busiest["per_node"]) / busiest["levels"], 3
        ),
    }


def plot(results: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for nodes in sorted({r["nodes"] for r in results["runs"]}):
        rs = [r for r in results["runs"] if r["nodes"] == nodes]
        shares = [100 * r["share"] for r in rs]
        left.plot(shares, [r["throughput_eps"] for r in rs], "o-", label=f"{nodes} nodes")
        right.plot(shares, [r["levels"] for r in rs], "o-", label=f"{nodes} nodes")
    one = [r["one_host_eps"] for r in results["runs"] if r["nodes"] == results["runs"][0]["nodes"]]
    left.plot([100 * s for s in SHARES], one, "k--", label="one host")
    left.set(
        xscale="symlog",
        yscale="log",
        xlabel="cross-node transactions (%)",
        ylabel="events/s",
        title="SL over a simulated cluster (one 2-core host)",
    )
    right.set(
        xscale="symlog",
        xlabel="cross-node transactions (%)",
        ylabel="levels",
        title="levels (exchanges) per run",
    )
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
