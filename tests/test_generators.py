import time

import naive
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from txstream.topologies.generators import (
    GS_MIX,
    MAX_VALUE,
    OB_MIX,
    OB_TXN_LENGTH,
    SL_MIX,
    WorkloadSpec,
    ZipfKeys,
    generate,
    write_workload,
)

I64 = pa.int64()
LIST = pa.list_(pa.int64())
TOPOLOGIES = ["sl", "gs", "ob", "tp"]

# contract §3, written out by hand.
EVENT_SCHEMAS = {
    "sl": pa.schema(
        [("event_id", I64), ("kind", pa.string()), ("account", I64), ("asset", I64)]
        + [("dst_account", I64), ("dst_asset", I64), ("amount", I64), ("asset_amount", I64)]
    ),
    "gs": pa.schema(
        [("event_id", I64), ("kind", pa.string()), ("keys", LIST), ("deps", LIST), ("delta", I64)]
    ),
    "ob": pa.schema(
        [("event_id", I64), ("kind", pa.string()), ("items", LIST), ("prices", LIST)]
        + [("quantities", LIST), ("bid_price", I64)]
    ),
    "tp": pa.schema([("event_id", I64), ("vehicle", I64), ("segment", I64), ("speed", I64)]),
}
INIT_SCHEMAS = {
    "sl": {
        "accounts": pa.schema([("key", I64), ("balance", I64)]),
        "assets": pa.schema([("key", I64), ("balance", I64)]),
    },
    "gs": {"records": pa.schema([("key", I64), ("value", I64)])},
    "ob": {"items": pa.schema([("key", I64), ("price", I64), ("quantity", I64)])},
    "tp": {"segment_speed": pa.schema([("key", I64), ("speed_sum", I64), ("speed_count", I64)])},
}
KEY_COLUMNS = {
    "sl": ["account", "asset", "dst_account", "dst_asset"],
    "gs": ["keys", "deps"],
    "ob": ["items"],
    "tp": ["segment"],
}

SMALL = WorkloadSpec(events=5_000, keys=64, seed=7)


def col(table: pa.Table, name: str) -> np.ndarray:
    """Non-null values of a column (list columns flattened) as numpy."""
    column = table.column(name).combine_chunks()
    if pa.types.is_list(column.type):
        column = column.flatten()
    return column.drop_null().to_numpy()


def kinds(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column("kind").to_pylist())


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("events", [0, 1, SMALL.events])
def test_schema_is_exactly_spec(topology, events):
    events_table, init = generate(topology, WorkloadSpec(events=events, keys=SMALL.keys))
    assert events_table.schema == EVENT_SCHEMAS[topology]
    assert events_table.num_rows == events
    assert col(events_table, "event_id").tolist() == list(range(events))
    assert {name: t.schema for name, t in init.items()} == INIT_SCHEMAS[topology]
    for table in init.values():
        assert table.column("key").to_pylist() == list(range(SMALL.keys))
        assert all(column.null_count == 0 for column in table.columns)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_same_spec_same_tables_other_seed_other_tables(topology):
    events, init = generate(topology, SMALL)
    again, init_again = generate(topology, SMALL)
    assert events.equals(again)
    assert init.keys() == init_again.keys()
    assert all(init[name].equals(init_again[name]) for name in init)
    other, _ = generate(topology, WorkloadSpec(events=SMALL.events, keys=SMALL.keys, seed=8))
    assert not events.equals(other)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_keys_in_range(topology):
    events, _ = generate(topology, SMALL)
    for name in KEY_COLUMNS[topology]:
        keys = col(events, name)
        assert keys.size > 0
        assert keys.min() >= 0 and keys.max() < SMALL.keys, name


def test_sl_domains_and_nulls():
    events, init = generate("sl", SMALL)
    deposit = kinds(events) == "deposit"
    assert set(kinds(events)) == set(SL_MIX)
    for name in ("dst_account", "dst_asset"):
        assert events.column(name).is_null().to_pylist() == deposit.tolist()
    for name in ("account", "asset", "amount", "asset_amount"):
        assert events.column(name).null_count == 0
    for name in ("amount", "asset_amount"):
        assert col(events, name).min() >= 1 and col(events, name).max() <= MAX_VALUE
    assert all(col(table, "balance").min() > 0 for table in init.values())


def test_gs_domains_lengths_and_nulls():
    events, init = generate("gs", SMALL)
    read = kinds(events) == "read"
    assert set(kinds(events)) == set(GS_MIX)
    assert set(pc.list_value_length(events.column("keys")).to_pylist()) == {1}
    deps = pc.list_value_length(events.column("deps")).to_numpy(zero_copy_only=False)
    assert np.isnan(deps[read]).all() and (deps[~read] == 2).all()
    assert events.column("delta").null_count == read.sum()
    assert np.abs(col(events, "delta")).max() <= MAX_VALUE
    assert col(init["records"], "value").min() >= 0


def test_ob_domains_lengths_and_nulls():
    events, init = generate("ob", SMALL)
    kind = kinds(events)
    assert set(kind) == set(OB_MIX)
    length = {
        name: pc.list_value_length(events.column(name)).to_numpy(zero_copy_only=False)
        for name in ("items", "prices", "quantities")
    }
    bid, alter, top = (kind == name for name in ("bid", "alter", "top"))
    assert (length["items"][bid] == 1).all() and (length["quantities"][bid] == 1).all()
    assert (length["items"][alter] == OB_TXN_LENGTH).all()
    assert (length["prices"][alter] == OB_TXN_LENGTH).all()
    assert (length["items"][top] == OB_TXN_LENGTH).all()
    assert (length["quantities"][top] == OB_TXN_LENGTH).all()
    assert np.isnan(length["prices"][bid | top]).all()
    assert np.isnan(length["quantities"][alter]).all()
    assert events.column("bid_price").null_count == (~bid).sum()
    for name in ("prices", "quantities", "bid_price"):
        assert col(events, name).min() >= 1 and col(events, name).max() <= MAX_VALUE
    for name in ("price", "quantity"):
        assert col(init["items"], name).min() >= 1


def test_tp_domains_and_init():
    events, init = generate("tp", SMALL)
    assert events.column("vehicle").null_count == 0
    assert col(events, "vehicle").min() >= 0 and col(events, "speed").min() >= 0
    assert col(init["segment_speed"], "speed_sum").tolist() == [0] * SMALL.keys
    assert col(init["segment_speed"], "speed_count").tolist() == [0] * SMALL.keys


@pytest.mark.parametrize(("topology", "column"), [("gs", "keys"), ("ob", "items")])
def test_txn_length_sets_list_lengths(topology, column):
    events, _ = generate(topology, WorkloadSpec(events=2_000, txn_length=3, deps=4))
    lengths = pc.list_value_length(events.column(column)).to_numpy()
    kind = kinds(events)
    assert (lengths[kind != "bid"] == 3).all() and (lengths[kind == "bid"] == 1).all()
    if topology == "gs":
        deps = pc.list_value_length(events.column("deps")).drop_null().to_numpy()
        assert (deps == 4).all()


def planted(topology: str, events: pa.Table) -> np.ndarray:
    """Events the generator meant to abort, recognised by their planted values."""
    if topology == "sl":
        return (col(events, "amount") == MAX_VALUE) | (col(events, "asset_amount") == MAX_VALUE)
    if topology == "gs":
        return events.column("delta").fill_null(0).to_numpy() < 0
    if topology == "ob":
        return events.column("bid_price").fill_null(0).to_numpy() == 1
    return col(events, "speed") >= 200


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("txn_length", [None, 1])
def test_only_planted_events_abort(topology, txn_length):
    # Hot keys and a short OB top list are the hardest case for the headroom.
    spec = WorkloadSpec(events=4_000, keys=4, theta=1.0, abort_ratio=0.05, txn_length=txn_length)
    events, init = generate(topology, spec)
    expected = planted(topology, events)
    assert 0 < expected.sum() < len(expected)
    status = np.asarray(naive.run_model(topology, events, init)[0].column("status").to_pylist())
    assert set(status) == {"committed", "aborted"}
    assert ((status == "aborted") == expected).all()


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("abort_ratio", [0.0, 0.01, 0.3])
def test_abort_ratio_and_kind_mix_are_honoured(topology, abort_ratio):
    n = 100_000
    events, _ = generate(topology, WorkloadSpec(events=n, abort_ratio=abort_ratio))
    assert planted(topology, events).mean() == pytest.approx(abort_ratio, abs=0.005)
    mix = {"sl": SL_MIX, "gs": GS_MIX, "ob": OB_MIX}.get(topology, {})
    kind = kinds(events) if mix else None
    for name, share in mix.items():
        assert (kind == name).mean() == pytest.approx(share, abs=0.01), name


def test_abort_ratio_above_the_abortable_share_makes_every_event_abortable():
    events, _ = generate("sl", WorkloadSpec(events=20_000, abort_ratio=0.9))
    transfer = kinds(events) == "transfer"
    assert planted("sl", events).mean() == pytest.approx(0.9, abs=0.01)
    assert transfer.mean() == pytest.approx(0.9, abs=0.01)
    assert (transfer | ~planted("sl", events)).all()


def test_tp_tolls_appear_on_some_segments():
    events, _ = generate("tp", WorkloadSpec(events=20_000, keys=50, abort_ratio=0.0))
    segment, speed = col(events, "segment"), col(events, "speed")
    avg = np.bincount(segment, weights=speed, minlength=50) / np.bincount(segment, minlength=50)
    pairs = np.unique(np.stack([segment, col(events, "vehicle")]), axis=1)
    distinct = np.bincount(pairs[0], minlength=50)
    tolled = (avg < 40) & (distinct > 50)
    assert 0 < tolled.sum() < 50


@pytest.mark.parametrize("keys", [1, 7, 1_000, 100_000])
@pytest.mark.parametrize("theta", [0.0, 0.2, 1.0, 3.0])
def test_zipf_sampler_equals_inverse_cdf(keys, theta):
    # The guide table is only a shortcut: the draws must be exactly searchsorted's.
    sampler = ZipfKeys(keys, theta, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    key_of_rank = rng.permutation(keys)
    cdf = np.cumsum(np.arange(1, keys + 1) ** -theta)
    expected = key_of_rank[np.searchsorted(cdf / cdf[-1], rng.random(50_000), side="right")]
    assert (sampler(50_000) == expected).all()


def test_zipf_skew_grows_with_theta():
    keys, n = 1_000, 200_000
    top = []
    for theta in (0.0, 0.5, 1.0):
        draws = ZipfKeys(keys, theta, np.random.default_rng(0))(n)
        top.append(np.bincount(draws, minlength=keys).max() / n)
    assert top[0] < 2.5 / keys
    assert top[0] < top[1] < top[2]
    harmonic = (1 / np.arange(1, keys + 1)).sum()
    assert top[2] == pytest.approx(1 / harmonic, rel=0.05)


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("events", -1),
        ("keys", 0),
        ("theta", -0.1),
        ("theta", float("nan")),
        ("abort_ratio", 1.5),
        ("abort_ratio", -0.01),
        ("txn_length", 0),
        ("deps", 0),
        ("seed", -1),
    ],
)
def test_invalid_spec_names_the_knob(knob, value):
    with pytest.raises(ValueError, match=knob):
        WorkloadSpec(**{knob: value})


def test_unknown_topology():
    with pytest.raises(ValueError, match="unknown topology 'xx'"):
        generate("xx", SMALL)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_write_workload_round_trips(topology, tmp_path):
    events, init = generate(topology, SMALL)
    write_workload(tmp_path / "out", events, init)
    assert pq.read_table(tmp_path / "out" / "events.parquet").equals(events)
    written = sorted(p.stem for p in (tmp_path / "out" / "init").iterdir())
    assert written == sorted(init)
    for name, table in init.items():
        assert pq.read_table(tmp_path / "out" / "init" / f"{name}.parquet").equals(table)


def test_one_million_events_timing(record_property):
    spec = WorkloadSpec()
    for topology in TOPOLOGIES:
        start = time.perf_counter()
        events, _ = generate(topology, spec)
        # in the JUnit report (--junitxml), not in the output of `pytest -q`
        record_property(f"generate_1M_{topology}_s", round(time.perf_counter() - start, 2))
        assert events.num_rows == spec.events
