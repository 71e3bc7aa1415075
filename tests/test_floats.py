"""float64 value columns (contract §2): held as their bits in the one state array, their
functions compiled on floats; KV on floats (tests/kv_topology.py) against the model, every
scheduler against serial, and a session's queries and checkpoint."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from compare import assert_same_run, assert_same_tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn
from local_engine import run_local
from naive import KV_KINDS, MAX, run_natural_model
from test_keys import SCHEDULERS
from txstream import Job
from txstream.errors import SchemaError, TopologyError
from txstream.schedulers.statements import Statements
from txstream.state.layout import Layout
from txstream.state.values import bits_float, float_bits, typed_table, value_type
from txstream.topologies.api import FLOAT, INT, EventShare, ListColumn, Table, Topology
from txstream.topologies.functions import add

KV = "kv_topology:floats"
SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("kind", pa.string()),
        ("key", pa.string()),
        ("value", pa.float64()),
        ("other", pa.string()),
    ]
)


def test_floats_are_held_as_their_bits():
    values = np.array([0.1, -0.0, math.inf, -2.5e-300, 2.0**53 + 1])
    assert bits_float(float_bits(values)).tobytes() == values.tobytes()
    of = value_type("float64")
    assert of.floating and not of.decimal and of.arrow == pa.float64() and str(of) == "float64"
    back = typed_table(pa.table({"v": pa.array(float_bits(values))}), {"v": of})
    assert back.schema.field("v").type == pa.float64()
    assert back["v"].to_numpy().tobytes() == values.tobytes()


# ---------------------------------------------------------------- workloads
@st.composite
def kv_float_workloads(draw: DrawFn, max_events: int = 50):
    """KV on floats whose sums round (0.1 + 0.2), tiny and huge values, and malformed ones
    (negative, past the bound, not a number, null)."""
    pool = [f"k{i}" for i in range(draw(st.integers(1, 5)))]
    key = st.sampled_from(pool) | st.sampled_from([None, ""])
    value = st.one_of(
        st.floats(0, 20, allow_nan=False),
        st.sampled_from([0.1, 0.2, 0.3, 5e-324, 1e-300, float(MAX), 1e15 + 0.3]),
        st.sampled_from([None, -1.0, MAX + 1.0, math.nan, math.inf]),
    )
    kinds = st.sampled_from([*KV_KINDS, "add", "move", "unknown"])
    rows = [
        {
            "event_id": i,
            "kind": draw(kinds),
            "key": draw(key),
            "value": draw(value),
            "other": draw(key),
        }
        for i in range(draw(st.integers(0, max_events)))
    ]
    opened = draw(st.lists(st.sampled_from(pool), unique=True))
    values = [draw(st.floats(0, 40, allow_nan=False)) for _ in opened]
    init = pa.table({"key": pa.array(opened, pa.string()), "value": pa.array(values, pa.float64())})
    return pa.Table.from_pylist(rows, schema=SCHEMA), {"kv": init}


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_serial_equals_the_model(data):
    events, init = data.draw(kv_float_workloads())
    interval = data.draw(st.sampled_from([1, 3, 7, 10240]), label="interval")
    got = run_local(KV, events, init, punctuation_interval=interval)
    assert got.events.schema.field("value").type == pa.float64()
    assert_same_run(got.events, got.state, *run_natural_model("kv-float", events, init))


@pytest.mark.parametrize(
    "scheduler,options", SCHEDULERS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(SCHEDULERS)]
)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_scheduler_equals_serial(scheduler, options, data):
    events, init = data.draw(kv_float_workloads(max_events=120))
    interval = data.draw(st.sampled_from([1, 7, 97]), label="interval")
    want = run_local(KV, events, init, punctuation_interval=interval)
    got = run_local(KV, events, init, scheduler=scheduler, punctuation_interval=interval, **options)
    assert_same_tables(got, want)


def test_init_state_of_strings_for_a_float_column_is_a_schema_error():
    init = {"kv": pa.table({"key": ["a"], "value": ["1.5"]})}
    with pytest.raises(SchemaError, match="'value'.*expected float64"):
        run_local(KV, pa.Table.from_pylist([], schema=SCHEMA), init)


# ---------------------------------------------------------------- definition
FLOATS = Table("f", ("x",), types={"x": FLOAT})
INTS = Table("i", ("y",))


def _statements() -> Statements:
    topology = Topology(
        name="floats",
        tables=(FLOATS, INTS),
        event_columns={"event_id": INT},
        kinds=(),
        functions=(add,),
        outputs=("fo", "io"),
        output_types={"fo": FLOAT},
        pre_process=lambda events: None,
        state_access=lambda events, txn: None,
    )
    batch = pa.RecordBatch.from_pydict({"event_id": [0, 1]})
    sizes = {"f": 3, "i": 3}
    return Statements(EventShare(batch, topology, sizes), Layout.of(topology.tables, sizes))


def test_a_float_output_reads_one_float_key_of_one_statement():
    keys = np.array([0, 1])
    txn = _statements()
    txn.read(FLOATS["x"], keys, out="fo")
    with pytest.raises(TopologyError, match="'fo': one statement, one key"):
        txn.read(FLOATS["x"], keys, out="fo")
    with pytest.raises(TopologyError, match="one statement, one key"):
        _statements().read(FLOATS["x"], ListColumn(np.array([0, 1, 2]), keys), out="fo")
    with pytest.raises(TopologyError, match="'io' is int64, its column float64"):
        _statements().read(FLOATS["x"], keys, out="io")
    with pytest.raises(TopologyError, match="reads are of its column's type"):
        _statements().read_modify(INTS["y"], keys, add, args=[1], reads=[(FLOATS["x"], keys)])


# ---------------------------------------------------------------- a session
@pytest.mark.usefixtures("ray_cluster")
def test_a_float_session_is_queried_and_resumed_from_its_checkpoint(tmp_path):
    rows = [
        {"event_id": 0, "kind": "put", "key": "a", "value": 0.1, "other": None},
        {"event_id": 1, "kind": "add", "key": "a", "value": 0.2, "other": None},
        {"event_id": 2, "kind": "move", "key": "a", "value": 0.25, "other": "b"},
        {"event_id": 3, "kind": "get", "key": "b", "value": None, "other": None},
        {"event_id": 4, "kind": "add", "key": "b", "value": 1e-300, "other": None},
        {"event_id": 5, "kind": "delete", "key": "a", "value": None, "other": None},
    ]
    events = pa.Table.from_pylist(rows, schema=SCHEMA)
    init = {"kv": pa.table({"key": ["z"], "value": [2.5]})}
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = Job(KV, checkpoint_dir=str(ckpt), progress=False)
    with pytest.raises(KeyboardInterrupt), job.start(init, output=out) as session:
        session.push(events.slice(0, 3))
        session.checkpoint()
        session.push(events.slice(3, 1))
        session.flush()
        _, got = session.query("kv", keys=["a", "b", "nobody"])
        assert got["key"].to_pylist() == ["a", "b"]
        assert got["value"].to_pylist() == [0.1 + 0.2 - 0.25, 0.25]
        raise KeyboardInterrupt
    with job.start(init, output=out) as session:
        assert session.resumed_from == 3
        session.push(events.slice(3))
        session.flush()
        _, every = session.query("kv")
        result = session.close()
    assert every.equals(result.state["kv"])
    assert_same_run(result.events, result.state, *run_natural_model("kv-float", events, init))
