"""Hypothesis strategies for small, hot, abort-heavy workloads of the four topologies.

Schedulers go wrong where transactions collide, so tables are tiny (1 to `max_keys`
keys), amounts are close to balances (many aborts, and whether an event commits often
depends on events just before it), and every malformation docs/contract.md lists appears with a
small probability. Tables always carry the contract's exact Arrow schema, even all-null columns.
"""

from __future__ import annotations

import random

import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy
from naive import EVENT_SCHEMAS

MAX = 2**40
I64 = pa.int64()

DEFAULT_MAX_EVENTS = {"sl": 60, "gs": 60, "ob": 60, "tp": 300}
"""TP needs more than 50 events on one segment before a toll can be non-zero."""

# Written apart from naive.py on purpose: a field naive.py forgets to check is still mangled here.
_USED: dict[str | None, tuple[str, ...]] = {
    "deposit": ("event_id", "kind", "account", "asset", "amount", "asset_amount"),
    "transfer": (
        "event_id",
        "kind",
        "account",
        "asset",
        "dst_account",
        "dst_asset",
        "amount",
        "asset_amount",
    ),
    "read": ("event_id", "kind", "keys"),
    "write": ("event_id", "kind", "keys", "deps", "delta"),
    "bid": ("event_id", "kind", "items", "quantities", "bid_price"),
    "alter": ("event_id", "kind", "items", "prices"),
    "top": ("event_id", "kind", "items", "quantities"),
    None: ("event_id", "vehicle", "segment", "speed"),  # TP has no kind
}
_KEY_TABLE = {
    "account": "accounts",
    "dst_account": "accounts",
    "asset": "assets",
    "dst_asset": "assets",
    "keys": "records",
    "deps": "records",
    "items": "items",
    "segment": "segment_speed",
}
_BAD_VALUES = {
    "amount": [0, -1, MAX + 1],
    "asset_amount": [0, -5, MAX + 1],
    "delta": [MAX + 1, -MAX - 1],
    "prices": [0, -1, MAX + 1],
    "quantities": [0, -1, MAX + 1],
    "bid_price": [0, -1, MAX + 1],
    "vehicle": [-1, -MAX],
    "speed": [-1, -300],
}
_PAIRED = {
    "bid": ("items", "quantities"),
    "alter": ("items", "prices"),
    "top": ("items", "quantities"),
}


def workloads(
    topology: str,
    *,
    max_events: int | None = None,
    max_keys: int = 8,
    malformed_pct: int | None = None,
) -> SearchStrategy[tuple[pa.Table, dict[str, pa.Table]]]:
    """(events, init tables) for `topology`; at most `max_events` events (default per topology).

    `malformed_pct` is the chance (0..100) that an event is malformed (rejected);
    by default each example picks 0, 2 or 10.
    """
    if max_events is None:
        max_events = DEFAULT_MAX_EVENTS[topology]
    return _workload(topology, max_events, max_keys, malformed_pct)


def _rarely(draw: DrawFn, pct: int) -> bool:
    """True with about `pct`% chance; shrinks to False."""
    return draw(st.integers(0, 99)) >= 100 - pct


def _positive(draw: DrawFn, hi: int) -> int:
    """A small positive value, sometimes the top of the domain."""
    return MAX if _rarely(draw, 3) else draw(st.integers(1, hi))


def _maybe(draw: DrawFn, value):
    """An unused field: null or a harmless value."""
    return value if draw(st.booleans()) else None


def _column(values: list[int]) -> pa.Array:
    return pa.array(values, I64)


def _init_table(draw: DrawFn, max_keys: int, **columns: SearchStrategy[int]) -> pa.Table:
    k = draw(st.integers(1, max_keys))
    return pa.table(
        {"key": _column(list(range(k)))}
        | {c: _column(draw(st.lists(s, min_size=k, max_size=k))) for c, s in columns.items()}
    )


def _sl_event(draw: DrawFn, sizes: dict[str, int]) -> dict:
    def account() -> int:
        return draw(st.integers(0, sizes["accounts"] - 1))

    def asset() -> int:
        return draw(st.integers(0, sizes["assets"] - 1))

    kind = draw(st.sampled_from(["deposit", "transfer", "transfer"]))
    src, src_asset = account(), asset()
    same = kind == "transfer" and _rarely(draw, 20)
    dst, dst_asset = (src, src_asset) if same else (account(), asset())
    if kind == "deposit":
        dst, dst_asset = _maybe(draw, dst), _maybe(draw, dst_asset)
    return {
        "kind": kind,
        "account": src,
        "asset": src_asset,
        "dst_account": dst,
        "dst_asset": dst_asset,
        "amount": _positive(draw, 30),
        "asset_amount": _positive(draw, 30),
    }


def _gs_event(draw: DrawFn, sizes: dict[str, int]) -> dict:
    key = st.integers(0, sizes["records"] - 1)
    delta = draw(st.sampled_from([MAX, -MAX])) if _rarely(draw, 3) else draw(st.integers(-15, 10))
    if draw(st.booleans()):
        keys = draw(st.lists(key, min_size=1, max_size=4))
        return {
            "kind": "read",
            "keys": keys,
            "deps": _maybe(draw, draw(st.lists(key, max_size=2))),
            "delta": _maybe(draw, delta),
        }
    keys = draw(st.lists(key, min_size=1, max_size=3))
    # Deps often include this event's own keys, so a later j reads an earlier j's write.
    deps = draw(st.lists(st.sampled_from(keys), max_size=2)) + draw(st.lists(key, max_size=2))
    return {"kind": "write", "keys": keys, "deps": draw(st.permutations(deps)), "delta": delta}


def _ob_event(draw: DrawFn, sizes: dict[str, int]) -> dict:
    item = st.integers(0, sizes["items"] - 1)
    kind = draw(st.sampled_from(["bid", "bid", "alter", "top"]))
    if kind == "bid":
        return {
            "kind": kind,
            "items": [draw(item)],
            "quantities": [_positive(draw, 8)],
            "bid_price": _positive(draw, 25),
            "prices": _maybe(draw, [_positive(draw, 25)]),
        }
    items = draw(st.lists(item, min_size=1, max_size=3))
    values = [_positive(draw, 25 if kind == "alter" else 8) for _ in items]
    if kind == "alter":
        return {
            "kind": kind,
            "items": items,
            "prices": values,
            "quantities": _maybe(draw, values),
            "bid_price": _maybe(draw, 1),
        }
    return {
        "kind": kind,
        "items": items,
        "quantities": values,
        "prices": _maybe(draw, values),
        "bid_price": _maybe(draw, 1),
    }


def _tp_event(draw: DrawFn, sizes: dict[str, int]) -> dict:
    return {
        "vehicle": draw(st.integers(0, 60)),
        "segment": draw(st.integers(0, sizes["segment_speed"] - 1)),
        "speed": draw(st.sampled_from([0, 39, 40, 199, 200, 250]) | st.integers(0, 80)),
    }


def _tp_burst(draw: DrawFn, sizes: dict[str, int], room: int) -> list[dict]:
    """Many reports on one segment: up to ~80 distinct vehicles, often slow, a few >= 200."""
    n = draw(st.integers(1, room))
    segment = draw(st.integers(0, sizes["segment_speed"] - 1))
    vehicles = draw(st.sampled_from([50, 51, 52, 60, 80]) | st.integers(1, 80))
    base = draw(st.sampled_from([0, 1000]))
    low = draw(st.integers(0, 60))
    high = min(199, low + draw(st.integers(0, 150)))
    spike_pct = draw(st.sampled_from([0, 0, 5]))
    rng = random.Random(draw(st.integers(0, 2**32)))

    def speed() -> int:
        return 200 + rng.randrange(3) if rng.randrange(100) < spike_pct else rng.randint(low, high)

    return [
        {"vehicle": base + i % vehicles, "segment": segment, "speed": speed()} for i in range(n)
    ]


def _put(draw: DrawFn, values: list, value) -> list:
    """`values` with one element (or, if empty, an appended one) replaced by `value`."""
    values = list(values)
    if not values:
        return [value]
    values[draw(st.integers(0, len(values) - 1))] = value
    return values


def _malform(draw: DrawFn, row: dict, sizes: dict[str, int]) -> dict:
    """`row` (well-formed) with exactly one of the contract's malformations."""
    row = dict(row)
    kind = row.get("kind")
    used = _USED[kind]
    lists = [f for f in used if isinstance(row[f], list)]
    choices = ["null", "key", "domain"] + (["element"] if lists else [])
    choices += ["kind"] if kind else []
    choices += ["length"] if kind in _PAIRED else []
    match draw(st.sampled_from(choices)):
        case "null":
            row[draw(st.sampled_from(used))] = None
        case "element":
            field = draw(st.sampled_from(lists))
            row[field] = _put(draw, row[field], None)
        case "kind":
            row["kind"] = draw(st.sampled_from(["bogus", "", kind.upper()]))
        case "key":
            field = draw(st.sampled_from([f for f in used if f in _KEY_TABLE]))
            size = sizes[_KEY_TABLE[field]]
            bad = draw(st.sampled_from([-1, size, size + 7, -(2**62)]))
            row[field] = _put(draw, row[field], bad) if field in lists else bad
        case "domain":
            fields = [f for f in used if f in _BAD_VALUES] + (["keys"] if "keys" in used else [])
            field = draw(st.sampled_from(fields))
            if field == "keys":
                row["keys"] = []
            else:
                bad = draw(st.sampled_from(_BAD_VALUES[field]))
                row[field] = _put(draw, row[field], bad) if field in lists else bad
        case "length":
            field = draw(st.sampled_from(_PAIRED[kind]))
            grow = draw(st.booleans()) or not row[field]
            row[field] = row[field] + [0 if field == "items" else 1] if grow else row[field][:-1]
    return row


_EVENT = {"sl": _sl_event, "gs": _gs_event, "ob": _ob_event, "tp": _tp_event}


@st.composite
def _workload(
    draw: DrawFn, topology: str, max_events: int, max_keys: int, malformed_pct: int | None
) -> tuple[pa.Table, dict[str, pa.Table]]:
    small = st.integers(0, 40)
    if topology == "sl":
        init = {
            "accounts": _init_table(draw, max_keys, balance=small),
            "assets": _init_table(draw, max_keys, balance=small),
        }
    elif topology == "gs":
        init = {"records": _init_table(draw, max_keys, value=st.integers(0, 20))}
    elif topology == "ob":
        init = {
            "items": _init_table(
                draw, max_keys, price=st.integers(1, 20), quantity=st.integers(1, 10)
            )
        }
    else:
        count = draw(st.integers(0, 5))
        init = {
            "segment_speed": _init_table(
                draw, max_keys, speed_sum=st.integers(0, 100 * count), speed_count=st.just(count)
            )
        }
    sizes = {name: table.num_rows for name, table in init.items()}
    if malformed_pct is None:
        malformed_pct = draw(st.sampled_from([0, 2, 10]))

    target = draw(st.integers(0, max_events))
    rows: list[dict] = []
    while len(rows) < target:
        if topology == "tp" and draw(st.booleans()):
            rows += _tp_burst(draw, sizes, target - len(rows))
        else:
            rows.append(_EVENT[topology](draw, sizes))
    rows = [{"event_id": 1000 + ts} | row for ts, row in enumerate(rows)]
    rows = [_malform(draw, row, sizes) if _rarely(draw, malformed_pct) else row for row in rows]
    return pa.Table.from_pylist(rows, schema=EVENT_SCHEMAS[topology]), init
