"""Synthetic workloads for the bundled topologies, behind `txstream generate`.

Knob defaults follow MorphStream (SIGMOD'23, Table 5): Zipf skew 0.2, 1% aborting
transactions, and per topology the transaction length `l` and the state accesses per
operation `r`. OB, absent from MorphStream, follows TStream (ICDE'20 §VI).

`abort_ratio` is, as in the papers, the share of *all* events planted to abort. A planted
event always takes its topology's abortable kind (SL transfer, GS write, OB bid); the
other events are drawn so that the overall kind mix stays the documented one as long as
`abort_ratio` does not exceed that kind's share (beyond it, every event is of that kind).
Every other event commits, by construction: initial balances and quantities exceed what
all the events together could take away, and honest bids outbid every price. Planted
events abort for certain while events < 5 * 10^9 (2^40 stays above any reachable value).

Everything is vectorised numpy: one seeded Generator per call, no per-event Python, so
1M events take a fraction of a second and a spec always yields the same tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from txstream.config import KEY_TYPES
from txstream.state.keys import key_hash
from txstream.state.values import decimal_array, value_type
from txstream.topologies.functions import MAX_VALUE

AMOUNTS = (1, 100)
"""SL amounts and GS deltas."""
QUANTITIES = (1, 10)
"""OB quantities, bid and top."""
INIT_BASE = (1, 1_000)
"""Initial values before headroom; GS records start here."""

ACCOUNT_IDS, ASSET_IDS = "acct-%07d", "asset-%07d"
"""SL's string ids of account and asset number k."""
SL_MIX = {"deposit": 0.5, "transfer": 0.5}
"""TStream's balanced ratio; deposits touch 2 states (l = 2), transfers 4 (l = 4)."""

PAYMENTS_MIX = {"deposit": 0.3, "transfer": 0.65, "close": 0.05}
"""Payments: deposits open accounts, closes remove them, so that transfers meet both."""
PAYMENTS_CENTS = (1, 100_000)
"""Payment amounts in cents: 0.01 to 1,000.00."""
PAYMENTS_MONEY = "decimal(18,2)"

GS_MIX = {"read": 0.5, "write": 0.5}
GS_TXN_LENGTH = 1
"""MorphStream Table 5: l = 1 key per GS transaction."""
GS_DEPS = 2
"""MorphStream Table 5: r = 2 states read by each GS write."""

OB_MIX = {"bid": 6 / 8, "alter": 1 / 8, "top": 1 / 8}
"""TStream (ICDE'20): bid : alter : top = 6 : 1 : 1."""
OB_TXN_LENGTH = 20
"""TStream (ICDE'20): alter and top requests touch 20 items; a bid touches one."""
OB_PRICES = (2, 100)
"""Item prices, initial and altered; >= 2 so a planted bid of 1 always loses."""
OB_BID_PRICES = (OB_PRICES[1], 2 * OB_PRICES[1])
"""Honest bids are at least the highest price, so only the planted ones lose on price."""

TP_CONGESTED_SHARE = 0.3
"""Share of segments whose reports are congested, so that tolls appear there."""
TP_CONGESTED_SPEEDS = (0, 39)
TP_FREE_SPEEDS = (40, 120)
TP_PLANTED_SPEEDS = (200, 299)
"""Implausible readings, which contract §3 aborts."""
TP_REPORTS_PER_VEHICLE = 10
"""Vehicle ids are uniform over events / 10 vehicles."""


@dataclass(frozen=True)
class WorkloadSpec:
    """The knobs of `txstream generate`; a None length means the topology's paper default.

    `txn_length` sets the list lengths of GS `keys` and of OB alter/top requests; `deps`
    sets the length of GS `deps`. SL (l = 2/4 is inherent to deposit/transfer) and TP
    (one segment per report) have no lists and ignore both.
    """

    events: int = 1_000_000
    keys: int = 10_000
    theta: float = 0.2
    abort_ratio: float = 0.01
    txn_length: int | None = None
    deps: int | None = None
    seed: int = 0
    key_type: str = "dense"
    """SL: ``dense`` keys 0..K-1, ``string`` ids (`ACCOUNT_IDS`, `ASSET_IDS`) or sparse
    random ``int64`` ids; the events are otherwise the same."""
    new_keys: float = 0.0
    """SL on natural keys: the share of events that open an account or asset that is not
    in the init state (a deposit's account and asset, a transfer's destinations)."""

    def __post_init__(self) -> None:
        _require(self.events >= 0, "events", "must be >= 0", self.events)
        _require(self.keys >= 1, "keys", "must be >= 1", self.keys)
        _require(
            math.isfinite(self.theta) and self.theta >= 0,
            "theta",
            "must be finite and >= 0",
            self.theta,
        )
        _require(0 <= self.abort_ratio <= 1, "abort_ratio", "must be in [0, 1]", self.abort_ratio)
        for knob in ("txn_length", "deps"):
            value = getattr(self, knob)
            _require(value is None or value >= 1, knob, "must be >= 1", value)
        _require(self.seed >= 0, "seed", "must be >= 0", self.seed)
        _require(
            self.key_type in KEY_TYPES, "key_type", f"must be one of {KEY_TYPES}", self.key_type
        )
        _require(0 <= self.new_keys <= 1, "new_keys", "must be in [0, 1]", self.new_keys)
        _require(
            self.new_keys == 0 or self.key_type != "dense",
            "new_keys",
            "needs natural keys (key_type int64 or string)",
            self.new_keys,
        )


def _require(ok: bool, knob: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{knob} {rule}, got {value!r}")


class ZipfKeys:
    """Draws keys 0..K-1 with P(rank r) ∝ 1/r^θ.

    Ranks map to keys through a seeded permutation, so the hot keys are spread over the
    table (and over the executors that own key ranges) instead of being keys 0, 1, 2...
    """

    def __init__(self, keys: int, theta: float, rng: np.random.Generator) -> None:
        cdf = np.cumsum(np.arange(1, keys + 1, dtype=np.float64) ** -theta)
        self._cdf = cdf / cdf[-1]
        # Guide table: a draw u in bucket floor(u * B) has its rank between first[b] and
        # first[b + 1], so most draws skip the binary search (several times faster). B is a power
        # of two, which makes the bucket bounds b / B exact.
        self._buckets = 1 << min(int(keys).bit_length() + 4, 20)
        bounds = np.arange(self._buckets + 1) / self._buckets
        self._first = np.searchsorted(self._cdf, bounds, side="right")
        self._key_of_rank = rng.permutation(keys)
        self._rng = rng

    def __call__(self, size: int) -> np.ndarray:
        """Return `size` independent keys (int64): rank = searchsorted(cdf, u)."""
        u = self._rng.random(size)
        bucket = (u * self._buckets).astype(np.intp)
        ranks = self._first[bucket]
        unsure = np.flatnonzero(ranks != self._first[bucket + 1])
        ranks[unsure] = np.searchsorted(self._cdf, u[unsure], side="right")
        return self._key_of_rank[ranks]


def generate(topology: str, spec: WorkloadSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Return the events table and the init tables (by table name) of `topology`."""
    try:
        generator = GENERATORS[topology]
    except KeyError:
        raise ValueError(
            f"unknown topology {topology!r}; expected one of {', '.join(GENERATORS)}"
        ) from None
    if spec.key_type != "dense" and topology != "sl":
        raise ValueError(f"key_type {spec.key_type!r} applies to sl only")
    return generator(spec)


ROW_GROUP_ROWS = 1 << 17
"""Rows per Parquet row group of the events written: Spark splits a file only between row
groups, so that its partitions are converted in parallel and the team starts on the first."""


def write_workload(out_dir: str | Path, events: pa.Table, init: dict[str, pa.Table]) -> None:
    """Write `DIR/events.parquet` and `DIR/init/<table>.parquet` (contract §4)."""
    out = Path(out_dir)
    (out / "init").mkdir(parents=True, exist_ok=True)
    pq.write_table(events, out / "events.parquet", row_group_size=ROW_GROUP_ROWS)
    for name, table in init.items():
        pq.write_table(table, out / "init" / f"{name}.parquet")


def generate_sl(spec: WorkloadSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Streaming Ledger: deposits and transfers of 1..100 over Zipf accounts and assets.

    A planted transfer asks for 2^40 from its account or (coin flip) its asset.
    """
    rng = np.random.default_rng(spec.seed)
    accounts = ZipfKeys(spec.keys, spec.theta, rng)
    assets = ZipfKeys(spec.keys, spec.theta, rng)
    n = spec.events
    kind, planted = _kinds(rng, n, SL_MIX, "transfer", spec.abort_ratio)
    transfer = _is(SL_MIX, kind, "transfer")
    amount = _uniform(rng, AMOUNTS, n)
    asset_amount = _uniform(rng, AMOUNTS, n)
    on_asset = rng.random(n) < 0.5
    amount[planted & ~on_asset] = MAX_VALUE
    asset_amount[planted & on_asset] = MAX_VALUE
    account, asset = accounts(n), assets(n)
    dst_account, dst_asset = accounts(n), assets(n)
    headroom = AMOUNTS[1] * n
    balances = [_uniform(rng, INIT_BASE, spec.keys) + headroom for _ in range(2)]
    keys = spec.keys
    if spec.new_keys:  # drawn last: the other events are those of new_keys = 0
        opening = np.flatnonzero(rng.random(n) < spec.new_keys)
        new = np.arange(keys, keys + len(opening))
        deposit = opening[~transfer[opening]]
        account[deposit], asset[deposit] = new[: len(deposit)], new[: len(deposit)]
        moved = opening[transfer[opening]]
        dst_account[moved] = dst_asset[moved] = new[len(deposit) :]
        keys += len(opening)
    ids = [_ids(spec.key_type, form, keys) for form in (ACCOUNT_IDS, ASSET_IDS)]
    events = pa.table(
        {
            "event_id": _ints(np.arange(n)),
            "kind": _strings(SL_MIX, kind),
            "account": _keys(ids[0], account),
            "asset": _keys(ids[1], asset),
            "dst_account": _keys(ids[0], dst_account, transfer),
            "dst_asset": _keys(ids[1], dst_asset, transfer),
            "amount": _ints(amount),
            "asset_amount": _ints(asset_amount),
        }
    )
    init = {
        table: _init(spec.keys, balance=balance, ids=table_ids)
        for table, balance, table_ids in zip(("accounts", "assets"), balances, ids, strict=True)
    }
    return events, init


def generate_payments(spec: WorkloadSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Payments between Zipf accounts of string ids (`ACCOUNT_IDS`), which start closed:
    deposits open them, transfers move cents between them, closes remove them. A planted
    transfer asks for more money than there is."""
    rng = np.random.default_rng(spec.seed)
    accounts = ZipfKeys(spec.keys, spec.theta, rng)
    n = spec.events
    kind, planted = _kinds(rng, n, PAYMENTS_MIX, "transfer", spec.abort_ratio)
    transfer = _is(PAYMENTS_MIX, kind, "transfer")
    money = value_type(PAYMENTS_MONEY)
    cents = _uniform(rng, PAYMENTS_CENTS, n)
    cents[planted] = money.limit - 1
    account, dst_account = accounts(n), accounts(n)
    ids = _ids("string", ACCOUNT_IDS, spec.keys)
    events = pa.table(
        {
            "event_id": _ints(np.arange(n)),
            "kind": _strings(PAYMENTS_MIX, kind),
            "account": _keys(ids, account),
            "dst_account": _keys(ids, dst_account, transfer),
            "amount": decimal_array(cents, money, ~_is(PAYMENTS_MIX, kind, "close")),
        }
    )
    empty = pa.table({"key": pa.array([], pa.string()), "balance": pa.array([], money.arrow)})
    return events, {"accounts": empty}


def _ids(key_type: str, form: str, keys: int) -> pa.Array | None:
    """The natural id of every key number 0..keys-1 (None: dense, the number itself)."""
    if key_type == "string":
        return pa.array([form % k for k in range(keys)], pa.string())
    if key_type == "int64":  # distinct: the hash is a bijection of 64-bit values
        salt = 1 if form == ACCOUNT_IDS else 2
        return pa.array(key_hash(np.arange(keys, dtype=np.int64) * 4 + salt).view(np.int64))
    return None


def _keys(ids: pa.Array | None, numbers: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A key column: the key numbers, or their natural ids (strings dictionary-encoded, as
    Parquet then keeps them), null where not ``valid``."""
    if ids is None:
        return _ints(numbers, valid)
    indices = _ints(numbers, valid)
    if pa.types.is_string(ids.type):
        return pa.DictionaryArray.from_arrays(indices.cast(pa.int32()), ids)
    return ids.take(indices)


def generate_gs(spec: WorkloadSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Grep and Sum: reads and writes of `txn_length` Zipf keys; writes read `deps` keys.

    Writes add a delta of 1..100 to the mean of their deps; a planted write has delta
    -2^40, which makes `v < 0` on its first key.
    """
    rng = np.random.default_rng(spec.seed)
    records = ZipfKeys(spec.keys, spec.theta, rng)
    length = GS_TXN_LENGTH if spec.txn_length is None else spec.txn_length
    deps = GS_DEPS if spec.deps is None else spec.deps
    n = spec.events
    kind, planted = _kinds(rng, n, GS_MIX, "write", spec.abort_ratio)
    write = _is(GS_MIX, kind, "write")
    n_writes = int(write.sum())
    delta = _uniform(rng, AMOUNTS, n)
    delta[planted] = -MAX_VALUE
    events = pa.table(
        {
            "event_id": _ints(np.arange(n)),
            "kind": _strings(GS_MIX, kind),
            "keys": _lists(records(n * length), np.full(n, length)),
            "deps": _lists(records(n_writes * deps), np.where(write, deps, 0), write),
            "delta": _ints(delta, write),
        }
    )
    return events, {"records": _init(spec.keys, value=_uniform(rng, INIT_BASE, spec.keys))}


def generate_ob(spec: WorkloadSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Online Bidding: bids for one Zipf item, alters and tops of `txn_length` items.

    Bids and tops move 1..10 units; honest bids offer at least the highest price, a
    planted bid offers 1, below every price (>= 2).
    """
    rng = np.random.default_rng(spec.seed)
    items = ZipfKeys(spec.keys, spec.theta, rng)
    length = OB_TXN_LENGTH if spec.txn_length is None else spec.txn_length
    n = spec.events
    kind, planted = _kinds(rng, n, OB_MIX, "bid", spec.abort_ratio)
    bid, alter, top = (_is(OB_MIX, kind, name) for name in ("bid", "alter", "top"))
    lengths = np.where(bid, 1, length)
    alter_lengths = np.where(alter, length, 0)
    quantity_lengths = np.where(top, length, bid.astype(np.int64))
    bid_price = _uniform(rng, OB_BID_PRICES, n)
    bid_price[planted] = 1
    events = pa.table(
        {
            "event_id": _ints(np.arange(n)),
            "kind": _strings(OB_MIX, kind),
            "items": _lists(items(int(lengths.sum())), lengths),
            "prices": _lists(_uniform(rng, OB_PRICES, alter_lengths.sum()), alter_lengths, alter),
            "quantities": _lists(
                _uniform(rng, QUANTITIES, quantity_lengths.sum()), quantity_lengths, bid | top
            ),
            "bid_price": _ints(bid_price, bid),
        }
    )
    init = _init(
        spec.keys,
        price=_uniform(rng, OB_PRICES, spec.keys),
        quantity=_uniform(rng, INIT_BASE, spec.keys) + QUANTITIES[1] * n,
    )
    return events, {"items": init}


def generate_tp(spec: WorkloadSpec) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Toll Processing: position reports of uniform vehicles on Zipf segments.

    A congested segment (TP_CONGESTED_SHARE of them) reports 0..39 mph and tolls once
    more than 50 distinct vehicles were seen there; the others report 40..120. Planted
    reports read 200..299. Only `segment_speed` gets an init file: contract §3 says that of
    `segment_vehicles` is not read.
    """
    rng = np.random.default_rng(spec.seed)
    segments = ZipfKeys(spec.keys, spec.theta, rng)
    congested = rng.random(spec.keys) < TP_CONGESTED_SHARE
    n = spec.events
    segment = segments(n)
    speed = np.where(
        congested[segment],
        _uniform(rng, TP_CONGESTED_SPEEDS, n),
        _uniform(rng, TP_FREE_SPEEDS, n),
    )
    planted = rng.random(n) < spec.abort_ratio
    speed[planted] = _uniform(rng, TP_PLANTED_SPEEDS, planted.sum())
    vehicles = max(1, n // TP_REPORTS_PER_VEHICLE)
    events = pa.table(
        {
            "event_id": _ints(np.arange(n)),
            "vehicle": _ints(rng.integers(0, vehicles, n)),
            "segment": _ints(segment),
            "speed": _ints(speed),
        }
    )
    zeros = np.zeros(spec.keys, dtype=np.int64)
    return events, {"segment_speed": _init(spec.keys, speed_sum=zeros, speed_count=zeros)}


GENERATORS: dict[str, Callable[[WorkloadSpec], tuple[pa.Table, dict[str, pa.Table]]]] = {
    "sl": generate_sl,
    "gs": generate_gs,
    "ob": generate_ob,
    "tp": generate_tp,
    "payments": generate_payments,
}


def _kinds(
    rng: np.random.Generator, n: int, mix: dict[str, float], abortable: str, abort_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """Draw each event's kind code (index into `mix`) and whether it is planted to abort.

    The non-planted events see the abortable kind's share reduced by `abort_ratio`, which
    keeps the overall mix equal to `mix` (see the module docstring).
    """
    planted = rng.random(n) < abort_ratio
    code = list(mix).index(abortable)
    shares = np.array(list(mix.values()))
    shares[code] = max(shares[code] - abort_ratio, 0.0)
    cdf = np.cumsum(shares)
    kind = np.searchsorted(cdf / cdf[-1], rng.random(n), side="right")
    kind[planted] = code
    return kind, planted


def _is(mix: dict[str, float], kind: np.ndarray, name: str) -> np.ndarray:
    return kind == list(mix).index(name)


def _uniform(rng: np.random.Generator, bounds: tuple[int, int], size: int) -> np.ndarray:
    """`size` int64 values uniform over `bounds`, both ends included."""
    return rng.integers(bounds[0], bounds[1], size, endpoint=True)


def _ints(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """An int64 column, null where not `valid` (a field the event's kind does not use)."""
    return pa.array(values, type=pa.int64(), mask=None if valid is None else ~valid)


def _strings(mix: dict[str, float], kind: np.ndarray) -> pa.Array:
    return pa.array(list(mix), type=pa.string()).take(pa.array(kind))


def _lists(values: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A list<int64> column from row lengths and the rows' values laid end to end."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(
        pa.array(offsets, type=pa.int32()),
        pa.array(values, type=pa.int64()),
        type=pa.list_(pa.int64()),
        mask=None if valid is None else pa.array(~valid),
    )


def _init(keys: int, ids: pa.Array | None = None, **columns: np.ndarray) -> pa.Table:
    """An init table: `key` = 0..K-1 (or the first K natural ``ids``) then the value
    columns, all int64 (contract §2)."""
    key = _ints(np.arange(keys)) if ids is None else ids.slice(0, keys)
    return pa.table({"key": key} | {name: _ints(v) for name, v in columns.items()})
