"""Decimal value columns (contract §2) and the payments topology (§3): exact conversion at
the boundary, serial against the model and every scheduler against serial on workloads that
open, close and reopen accounts, pay to closed ones and reach the limits of decimal(18, 2);
a named session queried by account id from another process."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compare import assert_same_run, assert_same_tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn
from local_engine import run_local
from naive import run_payments_model
from test_keys import SCHEDULERS
from txstream import Job, ThreadTransport
from txstream.cli.main import main
from txstream.errors import SchemaError, TopologyError
from txstream.state.values import exact_decimals, typed_table, units, value_type
from txstream.topologies.api import Table, Topology
from txstream.topologies.generators import WorkloadSpec, generate

MONEY = value_type("decimal(18,2)")
TOP = Decimal("9999999999999999.99")
"""The largest decimal(18, 2)."""


# ---------------------------------------------------------------- conversion
def test_decimals_convert_exactly_or_are_marked():
    given_ = [Decimal("1.005"), Decimal("-2.50"), None, Decimal("10000000000000000.000"), TOP]
    column = exact_decimals(pa.array(given_, pa.decimal128(20, 3)), MONEY).combine_chunks()
    values, fits = units(column, MONEY)
    assert fits.tolist() == [False, True, True, False, True]
    assert values.tolist() == [0, -250, 0, 0, 10**18 - 1]
    ints = exact_decimals(pa.array([5, -7, 10**16]), MONEY).combine_chunks()
    assert units(ints, MONEY)[1].tolist() == [True, True, False]
    back = typed_table(pa.table({"b": pa.array([150, -3, 10**18 - 1])}), {"b": MONEY})
    assert back["b"].to_pylist() == [Decimal("1.50"), Decimal("-0.03"), TOP]


@pytest.mark.parametrize("text", ["decimal(19,2)", "decimal(2,3)", "float32", "decimal(0,0)"])
def test_a_column_type_that_is_not_one_fails_the_topology(text):
    with pytest.raises(TopologyError, match="decimal|int64"):
        Topology(
            name="t",
            tables=(Table("t", ("v",), types={"v": text}),),
            event_columns={"event_id": "int64"},
            kinds=(),
            pre_process=lambda e: None,
            state_access=lambda e, t: None,
        )


def test_init_state_of_inexact_decimals_is_a_schema_error():
    init = {
        "accounts": pa.table(
            {"key": ["a"], "balance": pa.array([Decimal("1.001")], pa.decimal128(10, 3))}
        )
    }
    with pytest.raises(SchemaError, match="'balance'.*decimal\\(18,2\\)"):
        run_local("payments", _events([]), init)


# ---------------------------------------------------------------- workloads
AMOUNT = pa.decimal128(20, 3)
"""Amounts as a producer may send them: a scale finer than the column's, and more digits."""
SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("kind", pa.string()),
        ("account", pa.string()),
        ("dst_account", pa.string()),
        ("amount", AMOUNT),
    ]
)


def _events(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _amount(draw: DrawFn) -> Decimal | None:
    """Cents, hot values near the limits, or malformed: a tenth of a cent, too many digits,
    zero or negative, null."""
    small = st.integers(1, 5000).map(lambda c: Decimal(c) / 100)
    near = st.sampled_from([TOP, TOP - Decimal("0.01"), Decimal("5000000000000000.00")])
    bad = st.sampled_from(
        [Decimal("1.005"), Decimal("10000000000000000"), Decimal(0), Decimal("-1.00"), None]
    )
    return draw(st.one_of(small, small, small, near, bad))


@st.composite
def payment_workloads(draw: DrawFn, max_events: int = 50):
    """Deposits open accounts, closes remove them, deposits reopen them; transfers from
    and to accounts that are missing or closed; balances that start near the limit."""
    pool = [f"acct-{i}" for i in range(draw(st.integers(1, 6)))]
    kinds = st.sampled_from(["deposit", "deposit", "transfer", "transfer", "close", "nope"])
    account = st.sampled_from(pool) | st.sampled_from([None, ""])
    rows = [
        {
            "event_id": i,
            "kind": draw(kinds),
            "account": draw(account),
            "dst_account": draw(account),
            "amount": _amount(draw),
        }
        for i in range(draw(st.integers(0, max_events)))
    ]
    opened = draw(st.lists(st.sampled_from(pool), unique=True))
    balances = [draw(st.sampled_from([Decimal("0.00"), Decimal("7.25"), TOP])) for _ in opened]
    init = pa.table({"key": pa.array(opened, pa.string()), "balance": pa.array(balances, AMOUNT)})
    return _events(rows), {"accounts": init}


def _same_as_model(got, events: pa.Table, init: dict) -> None:
    want_events, want_state = run_payments_model(events, init)
    assert_same_run(got.events, got.state, want_events, want_state)
    aborted = np.asarray(want_events["status"]) == "aborted"
    got_reasons = np.asarray(got.events["reason"].to_pylist(), object)[aborted]
    want_reasons = np.asarray(want_events["reason"].to_pylist(), object)[aborted]
    assert got_reasons.tolist() == want_reasons.tolist()


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_serial_equals_the_model(data):
    events, init = data.draw(payment_workloads())
    interval = data.draw(st.sampled_from([1, 3, 7, 10240]), label="interval")
    _same_as_model(run_local("payments", events, init, punctuation_interval=interval), events, init)


@pytest.mark.parametrize(
    "scheduler,options", SCHEDULERS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(SCHEDULERS)]
)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_scheduler_equals_serial(scheduler, options, data):
    events, init = data.draw(payment_workloads(max_events=120))
    interval = data.draw(st.sampled_from([1, 7, 97]), label="interval")
    want = run_local("payments", events, init, punctuation_interval=interval)
    got = run_local(
        "payments", events, init, scheduler=scheduler, punctuation_interval=interval, **options
    )
    assert_same_tables(got, want)


def test_a_balance_past_18_digits_aborts_with_decimal_overflow():
    rows = [
        {"event_id": 0, "kind": "deposit", "account": "a", "amount": TOP},
        {"event_id": 1, "kind": "deposit", "account": "a", "amount": Decimal("0.01")},
        {"event_id": 2, "kind": "deposit", "account": "b", "amount": Decimal("0.01")},
        {
            "event_id": 3,
            "kind": "transfer",
            "account": "b",
            "dst_account": "a",
            "amount": Decimal("0.01"),
        },
    ]
    got = run_local("payments", _events(rows), {})
    assert got.events["reason"].to_pylist() == [None, "decimal overflow", None, "decimal overflow"]
    assert got.state["accounts"]["balance"].to_pylist() == [TOP, Decimal("0.01")]


def test_bad_events_are_rejected_with_their_reason_and_apply_nothing():
    deposit = {"kind": "deposit", "amount": Decimal("10.00")}
    rows = [
        {"account": "a", **deposit},
        {"account": None, **deposit},
        {"account": "", **deposit},
        {"account": "a", "kind": "deposit", "amount": Decimal("1.005")},
        {"account": "a", "kind": "deposit", "amount": Decimal("10000000000000000")},
        {"account": "a", "kind": "transfer", "dst_account": None, "amount": Decimal(1)},
        {"account": "a", "kind": "transfer", "dst_account": "", "amount": Decimal(1)},
    ]
    got = run_local("payments", _events([{"event_id": i} | r for i, r in enumerate(rows)]), {})
    assert got.events["status"].to_pylist() == ["committed"] + ["rejected"] * 6
    assert got.events["reason"].to_pylist() == [
        None,
        "null field: account",
        "malformed key: account",
        "inexact decimal: amount",
        "inexact decimal: amount",
        "null field: dst_account",
        "malformed key: dst_account",
    ]
    assert got.state["accounts"].to_pylist() == [{"key": "a", "balance": Decimal("10.00")}]


def test_a_key_column_of_the_wrong_type_is_one_line_and_exit_2(tmp_path, capsys):
    numbers = pa.table(
        {"event_id": [0], "kind": ["deposit"], "account": [7], "dst_account": [8], "amount": [5]}
    )
    pq.write_table(numbers, tmp_path / "events.parquet")
    (tmp_path / "init").mkdir()  # no accounts
    run = ["run", "payments", "--input", str(tmp_path / "events.parquet")]
    run += ["--init-state", str(tmp_path / "init"), "--output", str(tmp_path / "out")]
    assert main([*run, "--no-progress", "--transport", "threads", "--source", "arrow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "column 'account' has type int64, expected string" in err
    assert not list(tmp_path.glob("out/**/*.parquet"))
    with Job("payments", transport=ThreadTransport(), progress=False).start({}) as session:
        with pytest.raises(SchemaError, match="'account'.*expected string"):
            session.push(numbers)
        deposit = {"event_id": 1, "kind": "deposit", "account": "a", "amount": Decimal(5)}
        session.push(_events([deposit]))
        result = session.close()
    assert result.events["event_id"].to_pylist() == [1]


# ---------------------------------------------------------------- runs
def test_generated_payments_equal_the_model():
    events, init = generate("payments", WorkloadSpec(events=4000, keys=60, seed=5))
    assert events.schema.field("amount").type == pa.decimal128(18, 2)
    got = run_local("payments", events, init, batches_per_chunk=None)
    _same_as_model(got, events, init)
    reasons = set(got.events["reason"].to_pylist())
    assert {"no such account", "no such destination", "insufficient balance"} <= reasons


def test_the_command_line_generates_and_runs_payments(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    generate_ = ["generate", "payments", "--out", str(data), "--events", "3000", "--keys", "40"]
    assert main(generate_) == 0
    run = ["run", "payments", "--input", str(data / "events.parquet")]
    run += ["--init-state", str(data / "init"), "--output", str(out), "--no-progress"]
    assert main([*run, "--transport", "threads"]) == 0
    state = pq.read_table(out / "state" / "accounts.parquet")
    assert state.schema.field("balance").type == pa.decimal128(18, 2)
    events = pq.read_table(data / "events.parquet")
    init = {"accounts": pq.read_table(data / "init" / "accounts.parquet")}
    want_events, want_state = run_payments_model(events, init)
    assert state.equals(want_state["accounts"])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "txstream", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.usefixtures("ray_cluster")
def test_a_payments_session_is_queried_by_account_from_another_process():
    import ray

    address = ray.get_runtime_context().gcs_address
    pay = [
        ("deposit", "acct-alice", None, "100.00"),
        ("deposit", "acct-bob", None, "5.50"),
        ("transfer", "acct-alice", "acct-bob", "30.25"),
        ("close", "acct-bob", None, None),
        ("transfer", "acct-alice", "acct-bob", "1.00"),  # closed: aborted
        ("deposit", "acct-carol", None, "0.01"),
    ]
    rows = [
        {"event_id": i, "kind": k, "account": a, "dst_account": d, "amount": m and Decimal(m)}
        for i, (k, a, d, m) in enumerate(pay)
    ]
    with Job("payments", progress=False).start({}, name="payments-test") as session:
        session.push(_events(rows))
        session.flush()
        where = ("--address", address, "--name", "payments-test")
        keys = "acct-carol,acct-bob,acct-alice"
        query = _cli("query", "accounts", *where, "--keys", keys)
        assert query.returncode == 0, query.stderr
        assert query.stdout.splitlines() == [
            "watermark 6",
            "key,balance",
            "acct-carol,0.01",
            "acct-alice,69.75",
        ]
        _, every = session.query("accounts")
        assert every["key"].to_pylist() == ["acct-alice", "acct-carol"]
        assert every.schema.field("balance").type == pa.decimal128(18, 2)
    result = session.close()
    assert result.events["reason"].to_pylist()[4] == "no such destination"
