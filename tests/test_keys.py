"""Natural keys (contract §2): the key index, serial against the model and every scheduler
against serial on workloads where keys arrive, are deleted and created again, are read
while missing, are hot or malformed; queries by natural key, limits and schema errors."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run, assert_same_tables
from conftest import actor_processes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn
from local_engine import run_local
from naive import KV_KINDS, MAX, run_natural_model
from txstream import Job, ThreadTransport
from txstream.cli.main import main
from txstream.errors import RuntimeFailure, SchemaError, TopologyError, UsageError
from txstream.state.keys import FULL, MISSING, KeyIndex, key_hash, node_of
from txstream.state.layout import Layout
from txstream.topologies import sl
from txstream.topologies.api import (
    EventShare,
    Table,
    Topology,
    Transactions,
    conform_events,
    one_batch,
)
from txstream.topologies.generators import WorkloadSpec, generate

KV = {"string": "kv_topology:string_keys", "int64": "kv_topology:int64_keys"}
INT64_EDGES = [0, -1, 1, 2**63 - 1, -(2**63), 7, 123456789012]


# ---------------------------------------------------------------- the key index
def test_new_keys_get_rows_in_order_of_first_appearance_event_by_event():
    index = KeyIndex("t", "string", 100)
    index.add_init(pa.array(["x", "y"]), "init")
    first = pa.array(["y", "q", None, "", "z"]).dictionary_encode()
    second = pa.array(["z", "w", "q", "x", "a"])
    rows = index.rows([pa.chunked_array([first]), second])
    assert rows[0].to_pylist() == [1, 3, None, MISSING, 2]
    assert rows[1].to_pylist() == [2, 4, 3, 0, 5]
    assert index.keys().to_pylist() == ["x", "y", "z", "q", "w", "a"]
    assert index.find(pa.array(["q", "nope", None])).tolist() == [3, MISSING, MISSING]
    sliced = pa.array(["b", "c", "d", "q", None]).dictionary_encode()  # chunks of a source
    rows = index.rows([pa.chunked_array([sliced.slice(2), sliced.slice(1, 2)])])
    assert rows[0].to_pylist() == [6, 3, None, 7, 6]


def test_int64_keys_of_any_value_and_growth_through_rehashes():
    index = KeyIndex("t", "int64", 1 << 20)
    keys = np.unique(np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 50_000))
    keys = np.concatenate([INT64_EDGES, keys[~np.isin(keys, INT64_EDGES)]])
    for part in np.array_split(keys, 7):
        index.rows([pa.array(part)])
    assert len(index) == len(keys)
    assert index.find(pa.array(keys)).tolist() == list(range(len(keys)))
    assert index.keys().to_pylist() == keys.tolist()
    assert index.nbytes <= 48 * len(keys)


@pytest.mark.parametrize("key_type", ["int64", "string"])
def test_keys_arriving_while_the_slots_double_keep_their_rows(key_type):
    # two key columns with nulls, chunk after chunk: every key keeps the row of its first
    # appearance (event by event, column by column), and is found whichever slots hold it
    rng = np.random.default_rng(7)
    index, model, moving = KeyIndex("t", key_type, 1 << 20), {}, False
    for _ in range(25):
        n = int(rng.integers(1, 24_000))
        first, second = rng.integers(0, 400_000, (2, n))
        null = rng.random(n) < 0.3
        columns = (
            [pa.array(first), pa.array(second, mask=null)]
            if key_type == "int64"
            else [
                pa.array([f"k{x}" for x in first]).dictionary_encode(),
                pa.array([None if m else f"k{x}" for x, m in zip(second, null, strict=True)]),
            ]
        )
        got = [column.to_pylist() for column in index.rows(columns)]
        # again, every key known: looked up (or gathered) without adding
        assert [column.to_pylist() for column in index.rows(columns)] == got
        for i in range(n):
            for key, row, missing in (
                (first[i], got[0][i], False),
                (second[i], got[1][i], null[i]),
            ):
                if missing:
                    assert row is None
                    continue
                key = int(key) if key_type == "int64" else f"k{key}"
                assert row == model.setdefault(key, len(model))
        known = list(model)
        assert index.find(pa.array(known)).tolist() == list(range(len(known)))
        moving |= 0 < index._done < len(index._old)
    assert moving and len(index) == len(model)
    assert index.keys().to_pylist() == list(model)


def test_long_string_keys_alike_in_their_first_words_keep_their_rows_where_they_lie():
    # keys compared and copied eight bytes at a time: lengths on and off a word, the same
    # first words, multi-byte UTF-8; the arrays of keys grow without moving
    keys = [f"{'account-' * (i % 4)}{i:07d}{'é' * (i % 3)}" for i in range(60_000)]
    index = KeyIndex("t", "string", 1 << 20)
    index.rows([pa.array(keys[:1000])])
    where = index._keys.ctypes.data, index._bytes.ctypes.data
    for part in np.array_split(np.arange(1000, len(keys)), 9):
        index.rows([pa.array([keys[i] for i in part]).dictionary_encode()])
    assert (index._keys.ctypes.data, index._bytes.ctypes.data) == where
    assert index.keys().to_pylist() == keys
    assert index.find(pa.array(keys[::-1] + ["account-", keys[5][:-1]])).tolist() == [
        *range(len(keys) - 1, -1, -1),
        MISSING,
        MISSING,
    ]


def test_a_table_past_its_limit_fails_naming_it():
    index = KeyIndex("accounts", "string", 3)
    index.rows([pa.array(["a", "b", "a", "c"])])
    with pytest.raises(RuntimeFailure, match="'accounts'.*more than 3 keys"):
        index.rows([pa.array(["a", "d"])])


@pytest.mark.parametrize(
    "keys,message",
    [
        (pa.array(["a", "b", "a"]), "twice"),
        (pa.array(["a", None]), "nulls"),
        (pa.array(["a", ""]), "empty"),
        (pa.array([1, 2]), "expected string"),
    ],
)
def test_bad_init_keys_are_schema_errors(keys, message):
    with pytest.raises(SchemaError, match=message):
        KeyIndex("t", "string", 10).add_init(keys, "init")


def test_the_limit_keeps_a_full_marker_in_the_kernel():
    index = KeyIndex("t", "int64", 1)
    assert index._add(pa.array([5, 6, 5])).tolist() == [0, FULL, 0]


def test_string_and_large_string_keys_are_the_same_keys():
    index = KeyIndex("t", "string", 1 << 10)
    words = ["a", "bb", "é-ключ", "a", "ccc"]
    assert index.rows([pa.array(words[:3])])[0].to_pylist() == [0, 1, 2]
    large = pa.array(words[2:], pa.large_string())
    assert index.rows([large])[0].to_pylist() == [2, 0, 3]
    assert index.find(pa.array(words[1:], pa.large_string())).tolist() == [1, 2, 0, 3]
    assert index.find(pa.array(words)[2:]).tolist() == [2, 0, 3]


def test_node_of_is_a_fixed_hash_of_the_key():
    # fixed values: the same in every process and on every host (no salted hash)
    assert key_hash(np.array([0, 1, -1])).tolist() == [
        0,
        6238072747940578789,
        13029008266876403067,
    ]
    strings = pa.array(["acct-0000001", "acct-0000002"])
    assert key_hash(strings).tolist() == key_hash(strings.dictionary_encode()).tolist()
    assert key_hash(strings).tolist() == key_hash(strings.cast(pa.large_string())).tolist()
    assert key_hash(strings[1:]).tolist() == key_hash(strings).tolist()[1:]
    nodes = node_of(pa.array([f"acct-{i:07d}" for i in range(10_000)]), 4)
    assert set(np.bincount(nodes, minlength=4) // 1000) <= {2, 3}  # spread evenly


# ---------------------------------------------------------------- workloads
def _pool(draw: DrawFn, key_type: str) -> list:
    if key_type == "string":
        return [f"k{i}" for i in range(draw(st.integers(1, 6)))] + ["é-ключ"]
    return draw(
        st.lists(
            st.sampled_from(INT64_EDGES) | st.integers(-(2**63), 2**63 - 1),
            min_size=1,
            max_size=6,
            unique=True,
        )
    )


def _key(draw: DrawFn, pool: list, key_type: str, malformed: int):
    """A key of the pool, hot ones first; rarely null, or empty (a malformed string)."""
    if draw(st.integers(0, 99)) < malformed:
        return draw(st.sampled_from([None, ""] if key_type == "string" else [None]))
    return pool[min(draw(st.integers(0, len(pool) - 1)), draw(st.integers(0, len(pool) - 1)))]


def _init(draw: DrawFn, pool: list, key_type: str, column: str) -> pa.Table:
    keys = draw(st.lists(st.sampled_from(pool), unique=True, max_size=len(pool)))
    values = draw(st.lists(st.integers(0, 40), min_size=len(keys), max_size=len(keys)))
    key = pa.array(keys, pa.string() if key_type == "string" else pa.int64())
    return pa.table({"key": key, column: pa.array(values, pa.int64())})


@st.composite
def sl_workloads(draw: DrawFn, key_type: str, max_events: int = 50):
    """SL on natural keys: deposits open accounts, transfers from missing ones abort."""
    pools = {t: _pool(draw, key_type) for t in ("accounts", "assets")}
    malformed = draw(st.sampled_from([0, 3, 10]))
    rows = []
    for i in range(draw(st.integers(0, max_events))):
        kind = draw(st.sampled_from(["deposit", "transfer", "transfer", None, "nope"]))
        row = {"event_id": i, "kind": kind}
        for column, table in (("account", "accounts"), ("asset", "assets")):
            row[column] = _key(draw, pools[table], key_type, malformed)
            row["dst_" + column] = _key(draw, pools[table], key_type, malformed)
        row["amount"] = draw(st.integers(1, 30) | st.sampled_from([0, MAX, MAX + 1]))
        row["asset_amount"] = draw(st.integers(1, 30))
        rows.append(row)
    key = pa.string() if key_type == "string" else pa.int64()
    schema = pa.schema(
        [("event_id", pa.int64()), ("kind", pa.string())]
        + [(c, key) for c in ("account", "asset", "dst_account", "dst_asset")]
        + [("amount", pa.int64()), ("asset_amount", pa.int64())]
    )
    init = {t: _init(draw, pools[t], key_type, "balance") for t in pools}
    return pa.Table.from_pylist(rows, schema=schema), init


@st.composite
def kv_workloads(draw: DrawFn, key_type: str, max_events: int = 50):
    """KV: puts, adds, deletes and creates again, reads of missing keys, moves."""
    pool = _pool(draw, key_type)
    malformed = draw(st.sampled_from([0, 3, 10]))
    rows = []
    for i in range(draw(st.integers(0, max_events))):
        kind = draw(st.sampled_from([*KV_KINDS, "delete", "get", "unknown"]))
        rows.append(
            {
                "event_id": i,
                "kind": kind,
                "key": _key(draw, pool, key_type, malformed),
                "value": draw(st.integers(0, 20) | st.sampled_from([None, -1, MAX + 1])),
                "other": _key(draw, pool, key_type, malformed),
            }
        )
    key = pa.string() if key_type == "string" else pa.int64()
    schema = pa.schema(
        [
            ("event_id", pa.int64()),
            ("kind", pa.string()),
            ("key", key),
            ("value", pa.int64()),
            ("other", key),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema), {"kv": _init(draw, pool, key_type, "value")}


def _workload(draw: DrawFn, max_events: int = 50) -> tuple[str, dict, pa.Table, dict]:
    """(topology, its options, events, init) of SL or KV on string or int64 keys."""
    topology = draw(st.sampled_from(["sl", "kv"]), label="topology")
    key_type = draw(st.sampled_from(["string", "int64"]), label="key_type")
    if topology == "sl":
        events, init = draw(sl_workloads(key_type, max_events))
        return "sl", {"key_type": key_type}, events, init
    events, init = draw(kv_workloads(key_type, max_events))
    return KV[key_type], {}, events, init


def _model(topology: str, events: pa.Table, init: dict) -> tuple[pa.Table, dict]:
    return run_natural_model("sl" if topology == "sl" else "kv", events, init)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_serial_equals_the_model(data):
    topology, options, events, init = _workload(data.draw)
    interval = data.draw(st.sampled_from([1, 3, 7, 10240]), label="interval")
    got = run_local(topology, events, init, punctuation_interval=interval, **options)
    assert_same_run(got.events, got.state, *_model(topology, events, init))


SCHEDULERS = [
    ("serial", {"executors": 2}),
    ("tstream", {"executors": 2}),
    ("tstream", {"executors": 3, "placement": "shared-everything"}),
    ("morphstream", {"executors": 2}),
    ("morphstream", {"executors": 3, "explore": "bfs", "granularity": "fine", "abort": "lazy"}),
    ("morphstream", {"executors": 2, "explore": "ns", "granularity": "coarse"}),
    ("sstore", {"executors": 2}),
    ("lock", {"executors": 3}),
    ("mvlk", {"executors": 2}),
]


@pytest.mark.parametrize(
    "scheduler,options", SCHEDULERS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(SCHEDULERS)]
)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_scheduler_equals_serial(scheduler, options, data):
    topology, topology_options, events, init = _workload(data.draw, max_events=120)
    interval = data.draw(st.sampled_from([1, 7, 97]), label="interval")
    common = {"punctuation_interval": interval, **topology_options}
    want = run_local(topology, events, init, **common)
    got = run_local(topology, events, init, scheduler=scheduler, **options, **common)
    assert_same_tables(got, want)


# ---------------------------------------------------------------- runs
def _sl_run(tmp_path, key_type: str, **options):
    events, init = generate(
        "sl", WorkloadSpec(events=4000, keys=300, key_type=key_type, new_keys=0.1, seed=3)
    )
    job = Job("sl", transport=ThreadTransport(), progress=False, **options)
    return events, init, job


@pytest.mark.parametrize("key_type", ["string", "int64"])
def test_generated_sl_on_natural_keys_equals_the_model(tmp_path, key_type):
    events, init, job = _sl_run(tmp_path, key_type)
    result = job.run(events, init, output=tmp_path / "out")
    assert_same_run(result.events, result.state, *run_natural_model("sl", events, init))
    accounts = result.state["accounts"]
    assert accounts.num_rows > 300  # deposits opened accounts
    assert accounts.column("key").equals(pc.take(accounts["key"], pc.sort_indices(accounts["key"])))


def test_generate_writes_string_ids_and_opens_new_keys():
    events, init = generate(
        "sl", WorkloadSpec(events=2000, keys=100, key_type="string", new_keys=0.25)
    )
    assert init["accounts"]["key"].to_pylist()[:2] == ["acct-0000000", "acct-0000001"]
    assert init["assets"]["key"].to_pylist()[-1] == "asset-0000099"
    known = set(init["accounts"]["key"].to_pylist())
    deposits = events.filter(pc.equal(events["kind"], "deposit"))
    new = [k for k in deposits["account"].to_pylist() if k not in known]
    assert 0.15 < len(new) / deposits.num_rows < 0.35
    dense, _ = generate("sl", WorkloadSpec(events=2000, keys=100))
    assert events["amount"].equals(dense["amount"]) and events["kind"].equals(dense["kind"])
    with pytest.raises(ValueError, match="natural keys"):
        WorkloadSpec(new_keys=0.1)


@pytest.mark.parametrize("key_type", ["string", "int64"])
def test_a_session_is_queried_by_natural_key(key_type):
    events, init = generate("sl", WorkloadSpec(events=3000, keys=50, key_type=key_type, seed=1))
    seventh, third = init["accounts"]["key"].to_pylist()[7], init["accounts"]["key"].to_pylist()[3]
    nobody = "nobody" if key_type == "string" else 12345
    job = Job("sl", transport=ThreadTransport(), progress=False)
    with job.start(init) as session:
        session.push(events)
        session.flush()
        _, rows = session.query("accounts", keys=[seventh, nobody, third])
        assert rows.column("key").to_pylist() == [seventh, third]
        assert rows.column_names == ["key", "balance"]
        _, every = session.query("accounts")
        if key_type == "int64":
            with pytest.raises(UsageError, match="int64"):
                session.query("accounts", keys=["acct-0000001"])
        result = session.close()
    assert every.equals(result.state["accounts"])


def test_more_keys_than_max_keys_fails_the_run_naming_the_table(tmp_path):
    events, init, job = _sl_run(tmp_path, "string", max_keys=310)
    with pytest.raises(RuntimeFailure, match="'(accounts|assets)'.*more than 310 keys"):
        job.run(events, init)


def test_a_key_column_of_the_wrong_type_is_a_schema_error():
    events, init = generate("sl", WorkloadSpec(events=100, keys=10, key_type="string"))
    dense_events, _ = generate("sl", WorkloadSpec(events=100, keys=10))
    job = Job("sl", transport=ThreadTransport(), progress=False)
    with pytest.raises(SchemaError, match="account"):
        job.run(dense_events, init)
    with pytest.raises(SchemaError, match="column 'account'.*expected int64"):
        Job("sl", transport=ThreadTransport(), progress=False, key_type="int64").run(events, init)


def test_other_topologies_refuse_a_key_type():
    events, init = generate("gs", WorkloadSpec(events=10, keys=10))
    with pytest.raises(UsageError, match="applies to sl"):
        Job("gs", transport=ThreadTransport(), key_type="string").run(events, init)


@pytest.mark.usefixtures("ray_cluster")
def test_an_interrupted_session_resumes_with_the_rows_of_its_keys(tmp_path):
    """The checkpoint holds the key index: keys opened before it keep their rows, keys
    opened after it (by the interrupted run too) are opened again."""
    events, init = generate(
        "sl", WorkloadSpec(events=6000, keys=100, key_type="string", new_keys=0.2, seed=5)
    )
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = Job("sl", checkpoint_dir=str(ckpt), progress=False)  # only the checkpoint asked for
    with pytest.raises(KeyboardInterrupt), job.start(init, output=out) as session:
        session.push(events.slice(0, 3000))
        session.checkpoint()
        session.push(events.slice(3000, 2000))  # opens keys the checkpoint does not hold
        session.flush()
        raise KeyboardInterrupt
    with job.start(init, output=out) as session:
        assert session.resumed_from == 3000
        session.push(events.slice(3000))
        result = session.close()
    assert_same_run(result.events, result.state, *run_natural_model("sl", events, init))


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("kind", ["ProgressController", "Executor"])
def test_a_killed_actor_is_recovered_with_the_rows_of_its_keys(tmp_path, kind):
    """The controller holds the key index: a new one gets the checkpoint's."""
    events, init = generate(
        "sl", WorkloadSpec(events=6000, keys=100, key_type="int64", new_keys=0.2, seed=6)
    )
    job = Job(
        "sl",
        transport="ray",
        scheduler="morphstream",
        executors=2,
        udf_cost_us=20,
        punctuation_interval=97,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_every=3,
        progress=False,
        timeout_s=120,
    )
    with job.start(init) as session:
        session.push(events.slice(0, 3000))
        session.flush()
        deadline = time.monotonic() + 60
        while not (pids := actor_processes(kind, wait_s=0)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(pids[-1], signal.SIGKILL)
        session.push(events.slice(3000))
        result = session.close()
    assert result.metrics["recoveries"], "the kill went unnoticed"
    assert_same_run(result.events, result.state, *run_natural_model("sl", events, init))


def test_sl_without_init_rows_starts_empty():
    events, init = generate("sl", WorkloadSpec(events=500, keys=20, key_type="int64"))
    result = run_local("sl", events, {}, key_type="int64")
    empty = {t: init[t].slice(0, 0) for t in init}
    assert_same_run(result.events, result.state, *run_natural_model("sl", events, empty))


def test_deletes_and_existence_need_a_table_that_declares_them():
    events, init = generate("sl", WorkloadSpec(events=100, keys=10, key_type="string"))

    def state_access(events, txn):
        (accounts, _) = events.topology.tables
        txn.exists(accounts, events.int("account"), reason="no such account")

    topology = sl.topology("string")
    rows = events.drop_columns(list(topology.key_columns))
    for name in topology.key_columns:
        rows = rows.append_column(name, pa.array(np.zeros(events.num_rows, np.int64)))
    share = EventShare(one_batch(conform_events(rows, topology.engine_schema)), topology, {})
    layout = Layout.of(topology.tables, {"accounts": 20, "assets": 20})
    with pytest.raises(TopologyError, match="deletes=True"):
        state_access(share, Transactions(share, layout))
    with pytest.raises(TopologyError, match="dense keys are never deleted"):
        Topology(
            name="x",
            tables=(Table("t", ("v",), deletes=True),),
            event_columns={"event_id": "int64"},
            kinds=(),
            pre_process=lambda e: None,
            state_access=lambda e, t: None,
        )


def test_the_command_line_generates_and_runs_sl_on_string_ids(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    generate_sl = ["generate", "sl", "--out", str(data), "--events", "2000", "--keys", "50"]
    assert main([*generate_sl, "--key-type", "string", "--new-keys", "0.1"]) == 0
    run = ["run", "sl", "--input", str(data / "events.parquet"), "--init-state"]
    options = ["--source", "arrow", "--transport", "threads", "--no-progress"]
    assert main([*run, str(data / "init"), "--output", str(out), *options]) == 0
    accounts = pq.read_table(out / "state" / "accounts.parquet")
    assert accounts.schema.field("key").type == pa.string() and accounts.num_rows > 50
    assert accounts["key"].to_pylist() == sorted(accounts["key"].to_pylist())
    assert (
        main(
            [
                *run,
                str(data / "init"),
                "--output",
                str(tmp_path / "o2"),
                *options,
                "--max-keys",
                "60",
            ]
        )
        == 1
    )
    assert "more than 60 keys" in capsys.readouterr().err
    assert main([*generate_sl, "--new-keys", "0.1"]) == 2  # new keys need natural ones
