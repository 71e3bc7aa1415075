"""The oracle checked against docs/contract.md by hand; the generator against the oracle."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from naive import EVENT_SCHEMAS, MAX, TABLES, output_schema, run_model
from workloads import workloads

TOPOLOGIES = ["sl", "gs", "ob", "tp"]
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def events(topology: str, *rows: dict) -> pa.Table:
    """An events table from partial rows (missing fields are null; event_id = 100 + ts)."""
    full = [{"event_id": 100 + ts} | row for ts, row in enumerate(rows)]
    return pa.Table.from_pylist(full, schema=EVENT_SCHEMAS[topology])


def table(**columns: list[int]) -> pa.Table:
    size = len(next(iter(columns.values())))
    return pa.table(
        {"key": pa.array(range(size), pa.int64())}
        | {c: pa.array(v, pa.int64()) for c, v in columns.items()}
    )


def run(topology: str, init: dict[str, pa.Table], *rows: dict) -> tuple[list[dict], dict]:
    out, state = run_model(topology, events(topology, *rows), init)
    values = {
        name: {c: t.column(c).to_pylist() for c in t.column_names if c != "key"}
        for name, t in state.items()
    }
    return out.to_pylist(), values


def statuses(out: list[dict]) -> list[str]:
    return [r["status"] for r in out]


# --- SL ---------------------------------------------------------------------------------

SL_INIT = {"accounts": table(balance=[10, 0]), "assets": table(balance=[5, 0])}


def transfer(src: int, dst: int, amount: int, asset_amount: int) -> dict:
    return {
        "kind": "transfer",
        "account": src,
        "dst_account": dst,
        "asset": src,
        "dst_asset": dst,
        "amount": amount,
        "asset_amount": asset_amount,
    }


def deposit(account: int, amount: int, asset_amount: int = 1) -> dict:
    return {
        "kind": "deposit",
        "account": account,
        "asset": account,
        "amount": amount,
        "asset_amount": asset_amount,
    }


def test_sl_transfer_needs_both_balances_and_aborts_without_effect():
    out, state = run(
        "sl", SL_INIT, transfer(0, 1, 10, 6), transfer(0, 1, 11, 5), transfer(0, 1, 10, 5)
    )
    assert statuses(out) == ["aborted", "aborted", "committed"]
    assert out[0]["reason"] and out[1]["reason"] and out[2]["reason"] is None
    assert state == {"accounts": {"balance": [0, 10]}, "assets": {"balance": [0, 5]}}


def test_sl_transfer_to_itself_keeps_balance():
    out, state = run("sl", SL_INIT, transfer(0, 0, 10, 5), transfer(0, 0, 11, 5))
    assert statuses(out) == ["committed", "aborted"]
    assert state == {"accounts": {"balance": [10, 0]}, "assets": {"balance": [5, 0]}}


def test_sl_transfer_depends_on_earlier_deposit():
    out, state = run(
        "sl",
        SL_INIT,
        transfer(1, 0, 3, 1),
        deposit(1, 3),
        transfer(1, 0, 3, 1),
        transfer(1, 0, 1, 1),
    )
    assert statuses(out) == ["aborted", "committed", "committed", "aborted"]
    assert state == {"accounts": {"balance": [13, 0]}, "assets": {"balance": [6, 0]}}


@pytest.mark.parametrize(
    ("row", "status"),
    [
        (deposit(0, 1), "committed"),  # dst_account, dst_asset unused and null
        (deposit(0, MAX, MAX), "committed"),
        (deposit(0, 0), "rejected"),
        (deposit(0, -3), "rejected"),
        (deposit(0, 1, MAX + 1), "rejected"),
        (deposit(2, 1), "rejected"),
        (deposit(-1, 1), "rejected"),
        (deposit(0, 1) | {"asset": 2}, "rejected"),
        (deposit(0, 1) | {"amount": None}, "rejected"),
        (deposit(0, 1) | {"event_id": None}, "rejected"),
        (deposit(0, 1) | {"kind": None}, "rejected"),
        (deposit(0, 1) | {"kind": "withdraw"}, "rejected"),
        (transfer(0, 1, 1, 1) | {"dst_asset": None}, "rejected"),
        (transfer(0, 2, 1, 1), "rejected"),
        (transfer(0, 1, 100, 1) | {"dst_account": -1}, "rejected"),  # rejected before abort
    ],
)
def test_sl_validation(row, status):
    out, state = run("sl", SL_INIT, row)
    assert out[0]["status"] == status
    assert (out[0]["reason"] is None) == (status == "committed")
    if status != "committed":
        assert state == {"accounts": {"balance": [10, 0]}, "assets": {"balance": [5, 0]}}


# --- GS ---------------------------------------------------------------------------------

GS_INIT = {"records": table(value=[10, 0, 0])}


def test_gs_write_deps_see_the_same_events_earlier_writes():
    out, state = run(
        "gs",
        GS_INIT,
        {"kind": "write", "keys": [1, 2], "deps": [0, 1], "delta": 1},
        {"kind": "read", "keys": [2, 2, 0]},
    )
    # j=0: (10 + 0) // 2 + 1 = 6 -> records[1]; j=1: (10 + 6) // 2 + 1 = 9 -> records[2]
    assert state["records"]["value"] == [10, 6, 9]
    assert statuses(out) == ["committed", "committed"]
    assert [r["sum"] for r in out] == [None, 9 + 9 + 10]  # duplicates counted each time


def test_gs_write_aborts_on_a_later_negative_value_and_undoes_the_earlier_one():
    out, state = run(
        "gs",
        GS_INIT,
        {"kind": "write", "keys": [0, 1], "deps": [0], "delta": -6},
        {"kind": "read", "keys": [0, 1]},
        {"kind": "write", "keys": [0, 1], "deps": [0], "delta": -5},
    )
    # aborted: j=0 writes 10 - 6 = 4, j=1 computes 4 - 6 = -2 < 0
    assert statuses(out) == ["aborted", "committed", "committed"]
    assert out[1]["sum"] == 10
    assert state["records"]["value"] == [5, 0, 0]  # j=1: 5 - 5 = 0 is allowed


def test_gs_write_empty_deps_and_floor_division():
    out, state = run(
        "gs",
        {"records": table(value=[1, 2, 0])},
        {"kind": "write", "keys": [2], "deps": [0, 1, 1], "delta": 0},
        {"kind": "write", "keys": [0], "deps": [], "delta": 7},
        {"kind": "write", "keys": [1], "deps": [], "delta": -1},
    )
    assert statuses(out) == ["committed", "committed", "aborted"]
    assert state["records"]["value"] == [7, 2, 1]  # 5 // 3 = 1


@pytest.mark.parametrize(
    ("row", "status"),
    [
        ({"kind": "read", "keys": [0]}, "committed"),  # deps, delta unused and null
        ({"kind": "write", "keys": [0], "deps": [], "delta": MAX}, "committed"),
        ({"kind": "write", "keys": [0], "deps": [0], "delta": -MAX}, "aborted"),
        ({"kind": "write", "keys": [0], "deps": [], "delta": MAX + 1}, "rejected"),
        ({"kind": "write", "keys": [0], "deps": [], "delta": -MAX - 1}, "rejected"),
        ({"kind": "write", "keys": [0], "deps": None, "delta": 1}, "rejected"),
        ({"kind": "write", "keys": [0], "deps": [], "delta": None}, "rejected"),
        ({"kind": "write", "keys": [], "deps": [], "delta": 1}, "rejected"),
        ({"kind": "read", "keys": []}, "rejected"),
        ({"kind": "read", "keys": None}, "rejected"),
        ({"kind": "read", "keys": [0, None]}, "rejected"),
        ({"kind": "read", "keys": [3]}, "rejected"),
        ({"kind": "write", "keys": [0], "deps": [1, -1], "delta": 1}, "rejected"),
        ({"kind": "write", "keys": [0], "deps": [None], "delta": 1}, "rejected"),
        ({"kind": "sum", "keys": [0]}, "rejected"),
    ],
)
def test_gs_validation(row, status):
    out, state = run("gs", GS_INIT, row)
    assert out[0]["status"] == status
    assert (out[0]["reason"] is None) == (status == "committed")
    assert out[0]["sum"] == (10 if status == "committed" and row["kind"] == "read" else None)
    if status != "committed":
        assert state["records"]["value"] == [10, 0, 0]


# --- OB ---------------------------------------------------------------------------------

OB_INIT = {"items": table(price=[10, 3], quantity=[5, 0])}


def bid(item: int, q: int, price: int) -> dict:
    return {"kind": "bid", "items": [item], "quantities": [q], "bid_price": price}


def test_ob_bid_boundaries():
    out, state = run(
        "ob",
        OB_INIT,
        bid(0, 5, 9),  # price too low
        bid(0, 6, 10),  # quantity too high
        bid(0, 5, 10),  # exactly enough: committed
        bid(0, 1, 100),  # exhausted
        {"kind": "top", "items": [0, 0], "quantities": [1, 2]},
        {"kind": "alter", "items": [0, 0], "prices": [4, 7]},
        bid(0, 3, 7),
    )
    assert statuses(out) == [
        "aborted",
        "aborted",
        "committed",
        "aborted",
        "committed",
        "committed",
        "committed",
    ]
    assert state["items"] == {"price": [7, 3], "quantity": [0, 0]}


@pytest.mark.parametrize(
    ("row", "status"),
    [
        (bid(1, 1, 3) | {"quantities": [MAX]}, "aborted"),
        (bid(1, 1, MAX), "aborted"),  # prices unused and null
        ({"kind": "alter", "items": [1], "prices": [MAX]}, "committed"),
        ({"kind": "top", "items": [1], "quantities": [MAX]}, "committed"),
        (bid(0, 1, 10) | {"items": [0, 1], "quantities": [1, 1]}, "rejected"),
        (bid(0, 1, 10) | {"quantities": []}, "rejected"),
        (bid(0, 1, 10) | {"quantities": [1, 1]}, "rejected"),
        (bid(0, 1, 0), "rejected"),
        (bid(0, 1, MAX + 1), "rejected"),
        (bid(0, 0, 10), "rejected"),
        (bid(0, 1, 10) | {"items": [2]}, "rejected"),
        (bid(0, 1, 10) | {"items": [None]}, "rejected"),
        (bid(0, 1, 10) | {"bid_price": None}, "rejected"),
        ({"kind": "alter", "items": [0, 1], "prices": [1]}, "rejected"),
        ({"kind": "alter", "items": [0], "prices": [0]}, "rejected"),
        ({"kind": "alter", "items": [0], "prices": None}, "rejected"),
        ({"kind": "top", "items": [0], "quantities": [1, 2]}, "rejected"),
        ({"kind": "top", "items": [0, -1], "quantities": [1, 2]}, "rejected"),
        ({"kind": "top", "items": [0], "quantities": [-1]}, "rejected"),
        ({"kind": "buy", "items": [0], "quantities": [1]}, "rejected"),
    ],
)
def test_ob_validation(row, status):
    out, state = run("ob", OB_INIT, row)
    assert out[0]["status"] == status
    assert (out[0]["reason"] is None) == (status == "committed")
    if status != "committed":
        assert state["items"] == {"price": [10, 3], "quantity": [5, 0]}


# --- TP ---------------------------------------------------------------------------------

TP_INIT = {"segment_speed": table(speed_sum=[0, 100], speed_count=[0, 2])}


def report(vehicle: int, speed: int, segment: int = 0) -> dict:
    return {"vehicle": vehicle, "segment": segment, "speed": speed}


def test_tp_toll_counts_distinct_vehicles_and_ignores_aborted_reports():
    rows = [report(v, 10) for v in range(51)]
    rows += [report(0, 10), report(999, 200), report(51, 10), report(52, 199)]
    out, state = run("tp", TP_INIT, *rows)
    assert statuses(out) == ["committed"] * 52 + ["aborted", "committed", "committed"]
    assert [r["toll"] for r in out[49:52]] == [0, 2, 2]  # cnt 50, 51, 51 (vehicle 0 again)
    assert out[52] | {"reason": None} == {
        "ts": 52,
        "event_id": 152,
        "status": "aborted",
        "reason": None,
        "toll": None,
        "avg_speed": None,
        "vehicle_count": None,
    }
    assert (out[53]["toll"], out[53]["avg_speed"], out[53]["vehicle_count"]) == (8, 10, 52)
    # 53 * 10 + 199 = 729 over 54 reports: avg 13, still below 40
    assert (out[54]["toll"], out[54]["avg_speed"], out[54]["vehicle_count"]) == (18, 13, 53)
    assert state["segment_speed"] == {"speed_sum": [729, 100], "speed_count": [54, 2]}
    assert state["segment_vehicles"] == {"vehicle_count": [53, 0]}


def test_tp_no_toll_at_average_40():
    rows = [report(v, 40) for v in range(60)] + [report(60, 39)]
    out, _ = run("tp", TP_INIT, *rows)
    assert {r["toll"] for r in out[:60]} == {0}
    assert (out[60]["avg_speed"], out[60]["toll"]) == (39, 2 * 11**2)  # 2439 // 61 = 39


def test_tp_average_includes_init_state():
    out, state = run("tp", TP_INIT, report(7, 0, segment=1))
    assert (out[0]["toll"], out[0]["avg_speed"], out[0]["vehicle_count"]) == (0, 33, 1)
    assert state["segment_vehicles"] == {"vehicle_count": [0, 1]}


@pytest.mark.parametrize(
    ("row", "status"),
    [
        (report(0, 0), "committed"),
        (report(0, 199), "committed"),
        (report(0, 200), "aborted"),
        (report(-1, 200), "rejected"),  # rejection is checked first
        (report(0, -1), "rejected"),
        (report(0, 1, segment=2), "rejected"),
        (report(0, 1, segment=-1), "rejected"),
        (report(0, 1) | {"segment": None}, "rejected"),
        (report(0, 1) | {"speed": None}, "rejected"),
        (report(0, 1) | {"event_id": None}, "rejected"),
    ],
)
def test_tp_validation(row, status):
    out, state = run("tp", TP_INIT, row)
    assert out[0]["status"] == status
    assert (out[0]["reason"] is None) == (status == "committed")
    if status != "committed":
        assert state["segment_vehicles"] == {"vehicle_count": [0, 0]}
        assert state["segment_speed"] == {"speed_sum": [0, 100], "speed_count": [0, 2]}


# --- the oracle on generated workloads ----------------------------------------------------


def test_empty_stream_keeps_init_state():
    out, state = run_model("ob", events("ob"), OB_INIT)
    assert out.num_rows == 0 and out.schema == output_schema("ob")
    assert state["items"].equals(OB_INIT["items"])


@pytest.mark.parametrize("topology", TOPOLOGIES)
@FAST
@given(data=st.data())
def test_model_on_workloads(topology, data):
    ev, init = data.draw(workloads(topology))
    assert ev.schema == EVENT_SCHEMAS[topology]
    out, state = run_model(topology, ev, init)
    assert out.schema == output_schema(topology)
    assert out.column("ts").to_pylist() == list(range(ev.num_rows))
    assert out.column("event_id").equals(ev.column("event_id"))
    for row in out.to_pylist():
        assert row["status"] in {"committed", "aborted", "rejected"}
        assert (row["reason"] is None) == (row["status"] == "committed")
        extra = [row[c] for c in out.column_names[4:]]
        if topology == "tp":
            assert all((v is None) == (row["status"] != "committed") for v in extra)
    assert set(state) == set(TABLES[topology])
    for name, columns in TABLES[topology].items():
        assert state[name].column_names == ["key", *columns]
        size = init["segment_speed" if name == "segment_vehicles" else name].num_rows
        assert state[name].column("key").to_pylist() == list(range(size))
    _check_conservation(topology, ev, init, out, state)


def total_of(column: pa.ChunkedArray) -> int:
    return pc.sum(column).as_py() or 0


def _check_conservation(topology, ev, init, out, state):
    """Totals only move by what committed events say (catches partial writes)."""
    rows = [
        r
        for r, o in zip(ev.to_pylist(), out.to_pylist(), strict=True)
        if o["status"] == "committed"
    ]
    if topology == "sl":
        for table_name, field in [("accounts", "amount"), ("assets", "asset_amount")]:
            added = sum(r[field] for r in rows if r["kind"] == "deposit")
            total = total_of(state[table_name]["balance"])
            assert total == total_of(init[table_name]["balance"]) + added
    if topology == "ob":
        moved = sum(
            sum(r["quantities"]) * (-1 if r["kind"] == "bid" else 1)
            for r in rows
            if r["kind"] != "alter"
        )
        total = total_of(state["items"]["quantity"])
        assert total == total_of(init["items"]["quantity"]) + moved
    if topology == "tp":
        speeds = sum(r["speed"] for r in rows)
        assert (
            total_of(state["segment_speed"]["speed_sum"])
            == total_of(init["segment_speed"]["speed_sum"]) + speeds
        )


@pytest.mark.parametrize("topology", TOPOLOGIES)
@FAST
@given(data=st.data())
def test_every_generated_malformation_is_rejected(topology, data):
    ev, init = data.draw(workloads(topology, max_events=20, malformed_pct=100))
    out, _ = run_model(topology, ev, init)
    assert set(out.column("status").to_pylist()) <= {"rejected"}


@pytest.mark.parametrize("topology", TOPOLOGIES)
@FAST
@given(data=st.data())
def test_well_formed_workloads_reject_nothing(topology, data):
    ev, init = data.draw(workloads(topology, malformed_pct=0))
    out, _ = run_model(topology, ev, init)
    assert "rejected" not in out.column("status").to_pylist()
