"""Runs over several nodes (contract §8) on a Ray cluster of three nodes on this machine, as
Ray tests clusters (`ray.cluster_utils.Cluster`: a raylet and object store per node, a
custom resource naming each). Every run goes through the command line, as a user's would,
and equals `serial` on one host: every scheduler, node count, team size and punctuation
interval (sampled pairwise; the topologies in turn), on hypothesis workloads whose share
of transactions across nodes goes from none (one key) to nearly all (few keys, several
nodes), with hot keys, aborts, parametric reads and malformed events.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run
from conftest import actor_processes, run_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from local_engine import run_local
from pairwise import pairwise
from txstream import Job, topologies
from txstream.errors import RuntimeFailure, UsageError
from txstream.nodes.cost import COST
from txstream.nodes.sequencer import Partition, Sequencer, touched_cells
from txstream.nodes.session import UNIT_LEVELS
from txstream.state.keys import node_of
from txstream.state.layout import FOREIGN_ROWS, Layout, NodeShare
from txstream.topologies import BUNDLED
from txstream.topologies.generators import WorkloadSpec, generate, write_workload
from workloads import workloads

NODES = 3
STATUSES = ("committed", "aborted", "rejected")
AXES = {
    "scheduler": ("serial", "tstream", "morphstream", "lock", "mvlk", "sstore"),
    "nodes": (2, 3),
    "executors": (1, 2),
    "punctuation_interval": (7, 97, 10240),
    "keys": (1, 8, 40),
}
"""The matrix's axes; ``keys`` bounds the workload's keys (one key: every transaction on
one node; few keys over several nodes: nearly every transaction crosses)."""
CASES = [
    pytest.param(case, id="-".join(str(v) for v in case.values()))
    for case in (
        {"topology": BUNDLED[i % len(BUNDLED)], **axes} for i, axes in enumerate(pairwise(AXES))
    )
]
"""Pairwise cases, each on the next topology in turn (every topology several times)."""
ROOM_PRELUDE = (
    "import sys; from txstream.state import layout; layout.FOREIGN_ROWS = {room}; "
    "from txstream.cli.main import main; sys.exit(main(sys.argv[1:]))"
)
"""`txstream run` with less room on each node for other nodes' keys than it needs."""
LEVELS_PRELUDE = (
    "import sys; from txstream.nodes.sequencer import Sequencer; "
    "Sequencer.gather = lambda *_: None; "
    "from txstream.cli.main import main; sys.exit(main(sys.argv[1:]))"
)
"""`txstream run` with every unit run in levels, none gathered on one node."""


@pytest.fixture(scope="module")
def local_cluster():
    """A local Ray cluster of `NODES` nodes (this process does not join it: the runs under
    test do, from their own processes)."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 2, "resources": {"txstream_node_0": 1}}  # for Spark
    with _cluster_folder() as folder:
        cluster = Cluster(initialize_head=True, head_node_args={**_node(folder), **head})
        try:
            for i in range(1, NODES):
                cluster.add_node(**_node(folder), resources={f"txstream_node_{i}": 1})
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()


@contextmanager
def _cluster_folder() -> Iterator[str]:
    """A private folder for a local cluster's files, removed afterwards. Ray notes the
    cluster's address in its default folder whatever temp_dir says, and fails if that
    folder does not exist (a fresh machine's /tmp has no ray/): made for the duration."""
    ray_default = Path(tempfile.gettempdir()) / "ray"
    made = not ray_default.exists()
    ray_default.mkdir(exist_ok=True)
    folder = tempfile.mkdtemp(prefix="txs-ray-nodes-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if made:
            shutil.rmtree(ray_default, ignore_errors=True)


def _node(folder: str) -> dict:
    """A node's Ray options: one CPU, a small object store, its files under ``folder``."""
    return {"num_cpus": 1, "object_store_memory": 80 * 1024**2, "temp_dir": folder}


@pytest.fixture(scope="module")
def cluster(local_cluster) -> str:
    """The local cluster's address."""
    return local_cluster.address


def _run_on_nodes(
    address: str, topology: str, events: pa.Table, init: dict, *options: str, room: int = 0
) -> tuple[subprocess.CompletedProcess, pa.Table | None, dict, dict]:
    """`txstream run` over the cluster; its process, outputs, final state and metrics.
    ``room``: if given, the rows a node keeps for other nodes' keys of a table."""
    with tempfile.TemporaryDirectory() as folder:
        data, out = Path(folder) / "data", Path(folder) / "out"
        write_workload(data, events, init)
        command = run_command(
            topology,
            str(data / "events.parquet"),
            str(data / "init"),
            str(out),
            "--address",
            address,
            "--source",
            "arrow",
            "--no-progress",
            *options,
        )
        if room:
            command[1:3] = ["-c", ROOM_PRELUDE.format(room=room)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return proc, None, {}, {}
        state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
        metrics = json.loads((out / "metrics.json").read_text())
        return proc, pq.read_table(out / "events.parquet"), state, metrics


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_equals_serial(cluster, case, data):
    case = dict(case)
    topology, keys = case.pop("topology"), case.pop("keys")
    events, init = data.draw(workloads(topology, max_keys=keys))
    want = run_local(topology, events, init)
    options = [f"--{name.replace('_', '-')}={value}" for name, value in case.items()]
    proc, got, state, _ = _run_on_nodes(cluster, topology, events, init, *options)
    assert proc.returncode == 0, proc.stderr
    assert_same_run(got, state, want.events, want.state)


@pytest.mark.parametrize("key_type", ["string", "int64"])
def test_natural_keys_over_nodes_equal_serial(cluster, key_type):
    """SL on string or sparse int64 ids over two nodes, a tenth of the events opening
    accounts and assets not in the init state: each new key gets its row in ts order at
    the driver and lives on the node of its key's `node_of`; outputs and the state (live
    keys, sorted by key) equal serial on one host."""
    spec = WorkloadSpec(events=4000, keys=300, key_type=key_type, new_keys=0.1, seed=3)
    events, init = generate("sl", spec)
    want = run_local("sl", events, init)
    options = ("--nodes", "2", "--punctuation-interval", "97")
    proc, got, state, metrics = _run_on_nodes(cluster, "sl", events, init, *options)
    assert proc.returncode == 0, proc.stderr
    assert_same_run(got, state, want.events, want.state)
    assert state["accounts"].num_rows > 300 and metrics["nodes"]["cross"] > 0


@pytest.mark.parametrize("share", [0, 100])
def test_cross_node_share(cluster, share):
    """SL transfers between accounts of node 0 and assets of node 1 cross two nodes;
    between keys of node 0 alone, none do: the run says how many crossed, and equals
    serial. Every cross transfer on so few keys would be a level of its own: the unit is
    gathered on one node instead (three levels); with none crossing, it runs where its keys
    live."""
    n = 400
    crossing = [i * 100 < share * n for i in range(n)]
    home = node_of(np.arange(10, dtype=np.int64), 2)
    ours, theirs = np.flatnonzero(home == 0).tolist(), np.flatnonzero(home == 1).tolist()
    assert len(ours) >= 2 and theirs

    def key(i: int, cross: bool) -> int:
        keys = theirs if cross else ours
        return keys[i % len(keys)]

    rows = [
        {
            "event_id": i,
            "kind": "transfer",
            "account": key(i, False),
            "asset": key(i, cross),
            "dst_account": key(i + 1, False),
            "dst_asset": key(i + 1, cross),
            "amount": 1 + i % 7,
            "asset_amount": 1 + i % 5,
        }
        for i, cross in enumerate(crossing)
    ]
    events = pa.Table.from_pylist(rows, schema=_sl_schema())
    init = {
        name: pa.table({"key": pa.array(range(10), pa.int64()), "balance": [50] * 10})
        for name in ("accounts", "assets")
    }
    want = run_local("sl", events, init)
    proc, got, state, metrics = _run_on_nodes(cluster, "sl", events, init, "--nodes", "2")
    assert proc.returncode == 0, proc.stderr
    assert_same_run(got, state, want.events, want.state)
    assert metrics["nodes"]["cross"] == sum(crossing)
    assert metrics["nodes"]["unit_levels_max"] <= UNIT_LEVELS
    assert metrics["nodes"]["gathered_units"] == (1 if share else 0)
    if share:
        assert metrics["nodes"]["levels"] == 3


def test_hot_keys_are_gathered_on_one_node_and_equal_serial(cluster):
    """Transfers among a few hot keys of three nodes chain one cross transaction to the
    next: units run gathered on one node, their keys' cells sent there and back."""
    events, init = generate("sl", WorkloadSpec(events=3000, keys=200, theta=0.99, seed=6))
    want = run_local("sl", events, init)
    proc, got, state, metrics = _run_on_nodes(cluster, "sl", events, init, "--nodes", "3")
    assert proc.returncode == 0, proc.stderr
    assert_same_run(got, state, want.events, want.state)
    assert metrics["nodes"]["gathered_units"] == metrics["nodes"]["units"]


def test_a_chain_across_nodes_is_gathered_by_the_cost_model():
    """A chain of transfers each way between keys of two nodes is a level per transfer
    when run where its keys live; gathered, three levels: the other node's cells go to
    one node, which runs every event, and come back. The cost model takes the latter;
    for transfers that stay on their nodes, the former. A plan deeper than asked for is
    not built."""
    topology = topologies.get("sl")
    layout = Layout.of(topology.tables, {"accounts": 10, "assets": 10})
    sequencer = Sequencer(topology, layout, Partition(layout, topology, 2))
    n = 60

    def transfers(cross: bool) -> pa.Table:
        """Transfers between keys 0 and 1 (nodes 0 and 1), in turn each way; or from
        either to itself."""
        rows = [
            {
                "event_id": i,
                "kind": "transfer",
                **{"account": i % 2, "asset": i % 2},
                **dict.fromkeys(("dst_account", "dst_asset"), (i + cross) % 2),
                **{"amount": 1, "asset_amount": 1},
            }
            for i in range(n)
        ]
        return pa.Table.from_pylist(rows, schema=_sl_schema())

    txn, cells = touched_cells(topology, layout, transfers(cross=True))
    levels, gathered = sequencer.plan(n, txn, cells), sequencer.gather(n, txn, cells)
    assert len(levels.steps) > n and len(gathered.steps) == 3
    assert sequencer.plan(n, txn, cells, levels_max=n) is None  # too deep: left unbuilt
    to = int(gathered.home[0])
    assert (gathered.home == to).all() and gathered.cross == levels.cross == n
    assert gathered.steps[1][to].events.tolist() == list(range(n))
    (_, sent), (_, back) = gathered.steps[0][1 - to].send[0], gathered.steps[2][1 - to].receive[0]
    assert sent.tolist() == back.tolist() and len(sent)
    assert COST.seconds(gathered) < COST.seconds(levels)
    txn, cells = touched_cells(topology, layout, transfers(cross=False))
    levels, gathered = sequencer.plan(n, txn, cells), sequencer.gather(n, txn, cells)
    assert levels.cross == 0 and COST.seconds(levels) < COST.seconds(gathered)


def test_a_node_with_little_room_for_other_nodes_keys_runs_units_in_smaller_steps(cluster):
    """With room for 2 other nodes' keys per table, a unit whose steps need more is cut
    into smaller units until they fit; the run over every node still equals serial."""
    events, init = generate("sl", WorkloadSpec(events=600, keys=40, seed=3))
    want = run_local("sl", events, init)
    proc, got, state, metrics = _run_on_nodes(
        cluster, "sl", events, init, "--nodes", str(NODES), room=2
    )
    assert proc.returncode == 0, proc.stderr
    assert_same_run(got, state, want.events, want.state)
    assert metrics["nodes"]["units"] > 1  # all 600 events were pushed as one unit
    # each node holds its own keys of both tables and 2 rows each for other nodes' keys
    home = node_of(np.arange(40, dtype=np.int64), NODES)
    held = [2 * (int((home == node).sum()) + 2) for node in range(NODES)]
    assert [n["rows"] for n in metrics["nodes"]["per_node"]] == held
    # the nodes share this host: each one's executor is pinned to a CPU of its own
    cpus = [n["cpus"][0] for n in metrics["nodes"]["per_node"]]
    assert len(set(cpus)) == min(NODES, len(os.sched_getaffinity(0)))


def test_spark_input_reaches_the_nodes_by_partition(cluster, tmp_path):
    """Each Spark partition is prepared where it lies and each node takes its events
    from there, not from the driver; the run equals serial."""
    events, init = generate("sl", WorkloadSpec(events=3000, keys=50, seed=5))
    write_workload(tmp_path / "data", events, init)
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, first in enumerate(range(0, events.num_rows, 1000)):  # a partition per file
        pq.write_table(events.slice(first, 1000), parts / f"part-{i}.parquet")
    command = run_command(
        "sl",
        str(parts),
        str(tmp_path / "data" / "init"),
        str(tmp_path / "out"),
        *("--address", cluster, "--source", "spark", "--no-progress", "--nodes", "2"),
    )
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
    want = run_local("sl", events, init)
    assert_same_run(pq.read_table(out / "events.parquet"), state, want.events, want.state)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["nodes"]["partitions_prepared"] >= 3


def test_a_node_holds_its_own_keys_and_room_for_others():
    """Key k of a table on node node_of(k, N), in the node's rows in key order; then rows
    for other nodes' keys, which hold only the keys given for the step."""
    share = NodeShare(1, 3, {"accounts": 10, "assets": 1_000_000})
    tables = topologies.get("sl").tables
    layout = Layout.of(tables, share.sizes, share)
    own = np.flatnonzero(node_of(np.arange(10), 3) == 1)
    others = np.setdiff1d(np.arange(10), own)
    assets = int((node_of(np.arange(1_000_000), 3) == 1).sum())
    assert layout.stored == {"accounts": 10, "assets": assets + FOREIGN_ROWS}
    assert layout.keys("accounts").tolist() == own.tolist()
    base = layout.bases[("accounts", "balance")]
    assert (layout.cells_of("accounts", "balance", own[::-1]) - base).tolist() == list(
        range(len(own))
    )[::-1]
    with pytest.raises(RuntimeFailure, match="neither its own nor held"):
        layout.cells_of("accounts", "balance", others[:1])
    share.hold("accounts", others[:2])
    got = layout.cells_of("accounts", "balance", np.array([others[1], own[0], others[0]]))
    assert (got - base).tolist() == [len(own) + 1, 0, len(own)]
    with pytest.raises(RuntimeFailure, match=f"room for {len(others)}"):
        share.hold("accounts", np.arange(len(others) + 1))


def test_a_node_holds_the_rows_of_its_natural_keys_as_they_are_placed():
    """A table of natural keys: row r on the node its placement says (`node_of` of the
    key, at the driver), in the node's rows in the order placed; room for all its keys
    (any key may hash to it), then for other nodes' keys; rows grow as they are placed."""
    placed = {"accounts": np.array([1, 0, 1, 2]), "assets": np.array([0, 1])}
    share = NodeShare(1, 3, {"accounts": 10, "assets": 8}, placed)
    layout = Layout.of(topologies.get("sl", "string").tables, share.sizes, share)
    assert layout.stored == {"accounts": 20, "assets": 16}
    assert layout.keys("accounts").tolist() == [0, 2]
    base = layout.bases[("accounts", "balance")]
    assert (layout.cells_of("accounts", "balance", np.array([2, 0])) - base).tolist() == [1, 0]
    share.place("accounts", np.array([2, 1, 1]))
    assert layout.keys("accounts").tolist() == [0, 2, 5, 6]
    assert share.others("accounts", np.array([3, 4, 5])).tolist() == [True, True, False]
    share.hold("accounts", np.array([1, 4]))
    got = layout.cells_of("accounts", "balance", np.array([6, 4, 1]))
    assert (got - base).tolist() == [3, 11, 10]
    with pytest.raises(RuntimeFailure, match="rows placed"):
        share.place("accounts", np.zeros(4, np.int64))


def _sl_schema() -> pa.Schema:
    return topologies.get("sl").event_schema


def test_more_nodes_than_the_cluster_has_is_refused(cluster):
    init = {
        name: pa.table({"key": pa.array([0, 1], pa.int64()), "balance": [5, 5]})
        for name in ("accounts", "assets")
    }
    events = pa.Table.from_pylist([], schema=_sl_schema())
    proc, *_ = _run_on_nodes(cluster, "sl", events, init, "--nodes", str(NODES + 1))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert f"has {NODES} nodes alive" in proc.stderr


def test_what_several_nodes_do_not_take_is_refused():
    init = {"records": pa.table({"key": pa.array([0], pa.int64()), "value": [1]})}
    with pytest.raises(UsageError, match="give its --address"):
        Job("gs", nodes=2, source="arrow").run(pa.table({}), init)
    with pytest.raises(UsageError, match="no --follow"):
        Job("gs", nodes=2, address="127.0.0.1:1").follow("x", init, "out", threading.Event())
    with pytest.raises(UsageError, match="between 1 and"):
        Job("gs", nodes=0)
    with pytest.raises(UsageError, match="no --transport ray"):
        Job("gs", nodes=2, transport="ray")
    with pytest.raises(UsageError, match="does not run on several nodes"):
        Job("gs", nodes=2, scheduler="nolock")


def _sl_command(tmp_path: Path, events: pa.Table, init: dict, *options: str) -> list[str]:
    """`txstream run sl` (no progress bar) over ``events`` and ``init``, written under
    ``tmp_path``/data, into ``tmp_path``/out, with more ``options``."""
    write_workload(tmp_path / "data", events, init)
    data = tmp_path / "data"
    out = str(tmp_path / "out")
    return run_command(
        "sl", str(data / "events.parquet"), str(data / "init"), out, "--no-progress", *options
    )


def _checkpointed_run(
    tmp_path: Path,
    address: str,
    nodes: int,
    seed: int,
    source: str = "arrow",
    keys: int = 20_000,
    key_type: str = "dense",
):
    """40,000 SL events on ``keys`` keys (theta 0.99 if few) on disk, the `txstream run`
    command over ``nodes`` nodes with a checkpoint every 2,000 events, reading with
    ``source``, and the reference result. Natural keys (``key_type``): a tenth of the
    events open new ones."""
    theta = 0.99 if keys < 1000 else 0.2
    new_keys = 0.1 if key_type != "dense" else 0.0
    spec = WorkloadSpec(
        events=40_000, keys=keys, theta=theta, seed=seed, key_type=key_type, new_keys=new_keys
    )
    events, init = generate("sl", spec)
    command = _sl_command(
        tmp_path,
        events,
        init,
        *("--address", address, "--source", source, "--nodes", str(nodes)),
        *("--checkpoint-dir", str(tmp_path / "checkpoints"), "--checkpoint-every", "1"),
        *("--punctuation-interval", "2000"),
    )
    return command, run_local("sl", events, init)


@pytest.mark.parametrize(
    "lose, source",
    # a Ray node lost under a Spark run: the next test (the node of Spark's executor)
    [("process", "spark"), ("ray node", "arrow")],
)
def test_a_lost_node_is_recovered_from_the_checkpoints(local_cluster, lose, source, tmp_path):
    """One node's process killed mid-run with checkpoints on, or its whole Ray node (raylet,
    object store and all): every node goes back to the last checkpoint they all took, on the
    nodes still alive, and the run ends well and equals serial. Read by Spark, the units
    run again take their events from the partitions prepared on the driver's node."""

    def lose_one(teams: list[int]) -> None:
        if lose == "process":
            os.kill(max(teams), signal.SIGKILL)
        else:
            local_cluster.remove_node(next(iter(local_cluster.worker_nodes)), allow_graceful=False)

    try:
        _lose_a_node_mid_run(local_cluster.address, lose_one, source, tmp_path)
    finally:
        if len(local_cluster.worker_nodes) < NODES - 1:  # the next tests get three nodes
            local_cluster.add_node(**_node(local_cluster.head_node._ray_params.temp_dir))
            local_cluster.wait_for_nodes()


def test_a_lost_node_with_sparks_executor_is_recovered_from_the_checkpoints(tmp_path):
    """The Ray node lost mid-run is the one Spark's executor runs on (the only node with
    the 2 CPUs it asks for), so the partitions Spark converted there are lost too: the run
    still recovers from the checkpoints and equals serial (before the partitions were
    prepared on the driver's node, Ray could not rebuild them, or rebuilt them wrong)."""
    from ray.cluster_utils import Cluster

    with _cluster_folder() as folder:
        cluster = Cluster(initialize_head=True, head_node_args=_node(folder))
        try:
            sparks = cluster.add_node(**{**_node(folder), "num_cpus": 2})
            cluster.add_node(**_node(folder))
            cluster.wait_for_nodes()

            def lose_sparks_node(teams: list[int]) -> None:
                cluster.remove_node(sparks, allow_graceful=False)

            _lose_a_node_mid_run(cluster.address, lose_sparks_node, "spark", tmp_path)
        finally:
            cluster.shutdown()


def _lose_a_node_mid_run(
    address: str,
    lose: Callable[[list[int]], None],
    source: str,
    tmp_path,
    keys: int = 20_000,
    key_type: str = "dense",
) -> dict:
    """`_checkpointed_run` over 3 nodes, ``lose`` called with the nodes' pids once node 2
    took two checkpoints; the run must end well, recovered, and equal serial. Its metrics."""
    command, want = _checkpointed_run(
        tmp_path, address, 3, seed=5, source=source, keys=keys, key_type=key_type
    )
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(checkpoints.glob("node-2/ckpt-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        teams = actor_processes("NodeTeam", wait_s=0)
        assert len(teams) == 3, "the run ended before a node could be lost"
        lose(teams)
        _, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["recoveries"]) >= 1 and metrics["recoveries"][0]["from_ts"] > 0
    state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
    assert_same_run(pq.read_table(out / "events.parquet"), state, want.events, want.state)
    return metrics


def test_a_node_killed_during_a_run_on_hot_keys_is_recovered_once(local_cluster, tmp_path):
    """On 200 hot keys every unit runs gathered on one node: a node's process killed
    mid-run sends every node back to the last checkpoint once, and the run equals serial."""

    def kill(teams: list[int]) -> None:
        os.kill(max(teams), signal.SIGKILL)

    metrics = _lose_a_node_mid_run(local_cluster.address, kill, "arrow", tmp_path, keys=200)
    assert len(metrics["recoveries"]) == 1
    assert metrics["nodes"]["gathered_units"] == metrics["nodes"]["units"]


def test_a_node_killed_during_a_run_on_natural_keys_is_recovered(local_cluster, tmp_path):
    """String ids, new ones opened as the run goes: a node's process killed mid-run, every
    node goes back to the last checkpoint and the driver's key index to the one saved with
    it; the units since are run again, and the run equals serial."""

    def kill(teams: list[int]) -> None:
        os.kill(max(teams), signal.SIGKILL)

    _lose_a_node_mid_run(local_cluster.address, kill, "arrow", tmp_path, key_type="string")


SESSION = """
import json, sys
import pyarrow.parquet as pq
from txstream import Job
events = pq.read_table(sys.argv[1])
init = {t: pq.read_table(f"{sys.argv[2]}/{t}.parquet") for t in ("accounts", "assets")}
half = events.num_rows // 2
job = Job("sl", address=sys.argv[3], nodes=3, progress=False, punctuation_interval=500)
with job.start(init) as session:
    session.push(events.slice(0, half))
    w, rows = session.query("accounts", [7, 0, 5, 3])
    session.push(events.slice(half))
    result = session.close()
print(json.dumps({"w": w, "rows": rows.to_pylist(), "events": result.events.num_rows}))
"""


def _session_script(script: str, folder: Path, cluster: str, *args: object) -> dict:
    """The last line of ``script``'s output, as JSON: ``script`` run in a process of its
    own over the workload written in ``folder`` and ``cluster``'s address, then ``args``."""
    data = [str(folder / "events.parquet"), str(folder / "init"), cluster]
    command = [sys.executable, "-c", script, *data, *map(str, args)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_session_over_nodes_answers_queries_at_a_cut_of_every_node(cluster, tmp_path):
    """`Job.start` over three nodes: a query between two pushes reads every node as of
    exactly the events pushed before it, in the order of the keys asked."""
    # 1,000 keys: few transactions depend on another node's previous step (each such
    # level is a round trip between the nodes)
    events, init = generate("sl", WorkloadSpec(events=6000, keys=1_000, seed=2))
    write_workload(tmp_path, events, init)
    got = _session_script(SESSION, tmp_path, cluster)
    half = events.num_rows // 2
    assert got["w"] == half and got["events"] == events.num_rows
    want = run_local("sl", events.slice(0, half), init).state["accounts"].to_pylist()
    assert got["rows"] == [want[k] for k in (7, 0, 5, 3)]


NATURAL_SESSION = """
import json, sys
import pyarrow.parquet as pq
from txstream import Job
events = pq.read_table(sys.argv[1])
init = {t: pq.read_table(f"{sys.argv[2]}/{t}.parquet") for t in ("accounts", "assets")}
half, asked = events.num_rows // 2, json.loads(sys.argv[4])
job = Job("sl", address=sys.argv[3], nodes=2, progress=False, punctuation_interval=500)
with job.start(init) as session:
    session.push(events.slice(0, half))
    w, rows = session.query("accounts", asked)
    _, every = session.query("accounts")
    session.close()
print(json.dumps({"w": w, "rows": rows.to_pylist(), "every": every.to_pylist()}))
"""


def test_a_session_over_nodes_is_queried_by_natural_key(cluster, tmp_path):
    """`Job.start` over two nodes on string ids: a query by id (a missing one left out)
    reads the nodes that own them as of the events pushed before it; a query of every key
    gives the live ones sorted by key, as on one host."""
    spec = WorkloadSpec(events=4000, keys=200, key_type="string", new_keys=0.1, seed=4)
    events, init = generate("sl", spec)
    write_workload(tmp_path, events, init)
    half = events.num_rows // 2
    want = run_local("sl", events.slice(0, half), init).state["accounts"].to_pylist()
    opened = [r["key"] for r in want if r["key"] not in set(init["accounts"]["key"].to_pylist())]
    asked = [opened[0], "nobody", want[7]["key"], want[3]["key"]]
    got = _session_script(NATURAL_SESSION, tmp_path, cluster, json.dumps(asked))
    by_key = {r["key"]: r for r in want}
    assert got["w"] == half and got["every"] == want
    assert got["rows"] == [by_key[k] for k in asked if k in by_key]


OUTPUTS = """
import json, sys
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from txstream import Job
events = pq.read_table(sys.argv[1])
init = {t: pq.read_table(f"{sys.argv[2]}/{t}.parquet") for t in ("accounts", "assets")}
half = events.num_rows // 2
job = Job("sl", address=sys.argv[3], nodes=2, progress=False, punctuation_interval=500)
def rows(batches):
    return pa.Table.from_batches(list(batches)).to_pylist()
with job.start(init) as session:
    session.push(events.slice(0, half))
    first = rows(session.outputs())
    session.push(events.slice(half))
    w = session.flush()
    rest = rows(session.outputs(since=half))
    late = list(session.outputs(since=w))
    result = session.close()
print(json.dumps({
    "w": w,
    "first": [r["ts"] for r in first],
    "rest": [r["ts"] for r in rest],
    "late": len(late),
    "same": first + rest == result.events.to_pylist(),
}))
"""


def test_a_session_over_nodes_yields_its_outputs_since_a_ts(cluster, tmp_path):
    """`outputs(since)` of a session over two nodes: the rows of every event pushed before
    it, from ``since`` on, in ts order, as the committed outputs hold them at the end."""
    events, init = generate("sl", WorkloadSpec(events=4000, keys=1_000, seed=3))
    write_workload(tmp_path, events, init)
    got = _session_script(OUTPUTS, tmp_path, cluster)
    n, half = events.num_rows, events.num_rows // 2
    assert got["w"] == n and got["late"] == 0 and got["same"]
    assert got["first"] == list(range(half)) and got["rest"] == list(range(half, n))


METRICS_SESSION = """
import json, sys, threading, time, urllib.error, urllib.request
import pyarrow.parquet as pq
from txstream import Job
events = pq.read_table(sys.argv[1])
init = {t: pq.read_table(f"{sys.argv[2]}/{t}.parquet") for t in ("accounts", "assets")}
served = f"http://127.0.0.1:{sys.argv[4]}"


def get(path):
    try:
        with urllib.request.urlopen(served + path, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


starting, started = [], threading.Event()


def watch():  # /readyz while the nodes start
    while not started.is_set():
        try:
            starting.append(get("/readyz")[0])
        except OSError:  # not listening yet
            pass
        time.sleep(0.02)


watcher = threading.Thread(target=watch)
watcher.start()
job = Job("sl", address=sys.argv[3], nodes=2, progress=False, punctuation_interval=500,
          metrics_port=int(sys.argv[4]))
try:
    session = job.start(init)
finally:
    started.set()
    watcher.join()
with session:
    half = events.num_rows // 2
    session.push(events.slice(0, half))
    during = get("/metrics")[1]
    session.push(events.slice(half))
    session.flush()
    end = {path: get(path) for path in ("/metrics", "/healthz", "/readyz")}
    result = session.close()
counts = {k: result.metrics[k] for k in ("events", "committed", "aborted", "rejected")}
print(json.dumps({"starting": starting, "during": during, "end": end, "counts": counts}))
"""


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape, by name and labels (without run and topology)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("run", "topology")}
            found[s.name, tuple(sorted(labels.items()))] = s.value
    return found


def test_a_run_over_nodes_serves_its_metrics_from_the_driver(cluster, tmp_path):
    """`Job.start` over two nodes with a metrics port: the driver serves /readyz 503 while
    the nodes start, then 200; a scrape between two pushes counts no more events than
    were pushed; once flushed, the events by status are the run's own counts."""
    events, init = generate("sl", WorkloadSpec(events=6000, keys=300, abort_ratio=0.1, seed=3))
    amount = events.column("amount")
    malformed = pa.array(np.arange(events.num_rows) % 50 == 0)
    events = events.set_column(
        events.schema.get_field_index("amount"), "amount", pc.if_else(malformed, None, amount)
    )
    write_workload(tmp_path, events, init)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    got = _session_script(METRICS_SESSION, tmp_path, cluster, port)
    assert 503 in got["starting"], got["starting"]
    during = _samples(got["during"])
    half = events.num_rows // 2
    assert during["txstream_events_pushed_total", ()] == half
    decided = [during["txstream_events_total", (("status", s),)] for s in STATUSES]
    assert sum(decided) <= half and during["txstream_watermark_events", ()] <= half
    assert {path: code for path, (code, _) in got["end"].items()} == {
        "/metrics": 200,
        "/healthz": 200,
        "/readyz": 200,
    }
    end, counts, n = _samples(got["end"]["/metrics"][1]), got["counts"], events.num_rows
    assert counts["events"] == n and counts["aborted"] > 0 and counts["rejected"] > 0
    for status in STATUSES:
        assert end["txstream_events_total", (("status", status),)] == counts[status]
    reasons = {k: v for (name, k), v in end.items() if name == "txstream_rejections_total"}
    assert reasons[(("reason", "null field: amount"),)] > 0
    assert sum(reasons.values()) == counts["rejected"]
    assert end["txstream_events_pushed_total", ()] == end["txstream_watermark_events", ()] == n
    assert end["txstream_backlog_events", ()] == 0
    assert end["txstream_latency_seconds_count", ()] == n
    assert end["txstream_latency_seconds_bucket", (("le", "+Inf"),)] == n
    assert end["txstream_recoveries_total", ()] == end["txstream_checkpoints_total", ()] == 0
    assert end["txstream_ready", ()] == 1


def _txstream(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "txstream", *args], capture_output=True, text=True, timeout=120
    )


def test_a_named_run_over_nodes_answers_outside_readers(cluster, tmp_path):
    """`txstream query` and `txstream status` from other processes reach a named run over
    two nodes while it runs: the rows are those after exactly the watermark's events (each
    answer comes once the nodes have run what was submitted before it). Answered, the run
    is interrupted as by Ctrl-C, and ends so."""
    # 1,000 keys, every unit in levels: hundreds per 65,536 events, of which a reader's
    # answer waits for the units submitted before it (at most `UNIT_LEVELS` each); enough
    # events to outlast the readers
    events, init = generate("sl", WorkloadSpec(events=800_000, keys=1_000, seed=4))
    command = _sl_command(
        tmp_path,
        events,
        init,
        *("--address", cluster, "--source", "arrow", "--nodes", "2", "--name", "ledger-nodes"),
    )
    command[1:3] = ["-c", LEVELS_PRELUDE]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    answer, status, refused = None, None, []
    try:
        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline and not (answer and status):
            if status is None:
                asked = _txstream("status", "--address", cluster, "--name", "ledger-nodes")
                status = (asked.stdout.splitlines() or None) if asked.returncode == 0 else None
            if answer is None:
                asked = _txstream(
                    "query",
                    *("accounts", "--address", cluster, "--name", "ledger-nodes", "--keys", "3,0"),
                )
                refused.append(asked.stderr)
                answer = asked.stdout.splitlines() if asked.returncode == 0 else None
            time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    assert answer and status, f"the run ended before its readers were answered: {refused[-3:]}"
    assert run.returncode == 130, stderr
    assert "nodes: 2" in status
    w = int(answer[0].removeprefix("watermark "))
    want = run_local("sl", events.slice(0, w), init).state["accounts"].to_pylist()
    assert answer[1:] == ["key,balance"] + [f"{k},{want[k]['balance']}" for k in (3, 0)]


MICRO_BATCHES = """
import json, os, sys
import pyarrow.parquet as pq
from txstream import Job
events = pq.read_table(sys.argv[1])
init = {t: pq.read_table(f"{sys.argv[2]}/{t}.parquet") for t in ("accounts", "assets")}
third = events.num_rows // 3
batches = [events.slice(0, third), events.slice(third, third), events.slice(2 * third)]
job = Job("sl", address=sys.argv[3], nodes=2, progress=False, punctuation_interval=500,
          checkpoint_dir=sys.argv[4])
with job.start(init, output=sys.argv[5]) as session:
    seen = {"last": session.last_batch_id, "resumed": session.resumed_from}
    for batch_id in range(int(sys.argv[6])):  # as Spark's foreachBatch delivers them
        if batch_id > session.last_batch_id:
            session.push(batches[batch_id], batch_id=batch_id)
            session.checkpoint()
    if sys.argv[6] != "3":  # the driver dies with the micro-batches applied
        print(json.dumps(seen), flush=True)
        os._exit(0)
    seen["w"] = session.flush()
print(json.dumps(seen))
"""


def test_a_session_over_nodes_applies_each_micro_batch_once_across_a_lost_driver(cluster, tmp_path):
    """Micro-batches pushed with their ``batch_id`` and checkpointed: the driver dies, a
    new one resumes with ``last_batch_id``, skips the batches it covers, pushes the rest,
    and the run equals serial over every event once."""
    events, init = generate("sl", WorkloadSpec(events=3000, keys=1_000, seed=5))
    write_workload(tmp_path, events, init)
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"

    def driver(batches: int) -> dict:
        return _session_script(MICRO_BATCHES, tmp_path, cluster, checkpoints, out, batches)

    assert driver(2) == {"last": -1, "resumed": 0}
    assert json.loads((checkpoints / "nodes.json").read_text())["last_batch_id"] == 1
    again = driver(3)
    assert again["last"] == 1 and again["resumed"] == 2 * (events.num_rows // 3)
    assert again["w"] == events.num_rows
    want = run_local("sl", events, init)
    state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
    assert_same_run(pq.read_table(out / "events"), state, want.events, want.state)


@pytest.mark.parametrize("key_type", ["dense", "string"])
def test_a_killed_driver_resumes_from_the_checkpoints_every_node_took(cluster, tmp_path, key_type):
    """The driver (`txstream run`) killed mid-run: the same command run again continues
    from the last checkpoint every node took (of natural keys, with the key index saved
    with it) and equals serial."""
    command, want = _checkpointed_run(tmp_path, cluster, 2, seed=6, key_type=key_type)
    out, checkpoints = tmp_path / "out", tmp_path / "checkpoints"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        meta = checkpoints / "nodes.json"
        while time.monotonic() < deadline and (
            not meta.exists() or json.loads(meta.read_text())["ts"] < 10_000
        ):
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before its driver could be killed"
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "resumed at event" in again.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["resumed_from"] >= 10_000
    state = {p.stem: pq.read_table(p) for p in (out / "state").glob("*.parquet")}
    assert_same_run(pq.read_table(out / "events.parquet"), state, want.events, want.state)
    assert not list(checkpoints.glob("node-*")), "a completed run keeps no checkpoint"
