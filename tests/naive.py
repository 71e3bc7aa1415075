"""A plain-Python model of docs/contract.md §1–§4: the oracle the engine is tested against.

Tables of natural keys (§2) are dicts from key to a row of values, holding exactly the keys
that exist; a missing key reads 0. `KV` is the test topology of tests/kv_topology.py, whose
operations create, delete and read keys that may be missing; ``kv-float`` is KV on Python
floats, which are IEEE doubles as float64 columns are. Payments (§3) counts money in
Python's `Decimal`, never in integers of cents as the engine does.

Events run one at a time in `ts` order, on Python lists and ints, with no code shared
with txstream, so that a bug in the engine cannot hide behind the same bug here.
Speed does not matter; being obviously right does.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa

MAX = 2**40
"""Upper bound of amounts, prices, quantities and |delta|."""

I64, F64, STR, LIST = pa.int64(), pa.float64(), pa.string(), pa.list_(pa.int64())

EVENT_SCHEMAS: dict[str, pa.Schema] = {
    "sl": pa.schema(
        [
            ("event_id", I64),
            ("kind", STR),
            ("account", I64),
            ("asset", I64),
            ("dst_account", I64),
            ("dst_asset", I64),
            ("amount", I64),
            ("asset_amount", I64),
        ]
    ),
    "gs": pa.schema(
        [("event_id", I64), ("kind", STR), ("keys", LIST), ("deps", LIST), ("delta", I64)]
    ),
    "ob": pa.schema(
        [
            ("event_id", I64),
            ("kind", STR),
            ("items", LIST),
            ("prices", LIST),
            ("quantities", LIST),
            ("bid_price", I64),
        ]
    ),
    "tp": pa.schema([("event_id", I64), ("vehicle", I64), ("segment", I64), ("speed", I64)]),
}
"""The event columns of contract §3, in order, with their exact Arrow types."""

TABLES: dict[str, dict[str, tuple[str, ...]]] = {
    "sl": {"accounts": ("balance",), "assets": ("balance",)},
    "gs": {"records": ("value",)},
    "ob": {"items": ("price", "quantity")},
    "tp": {"segment_speed": ("speed_sum", "speed_count"), "segment_vehicles": ("vehicle_count",)},
}
"""Every table of a topology and its value columns."""

OUTPUT_COLUMNS: dict[str, tuple[str, ...]] = {
    "sl": (),
    "gs": ("sum",),
    "ob": (),
    "tp": ("toll", "avg_speed", "vehicle_count"),
}
"""Output columns after `ts, event_id, status, reason` (contract §4), all int64."""

# Fields each kind uses (TP has no `kind` column: its one kind is None).
USED: dict[str, dict[str | None, tuple[str, ...]]] = {
    "sl": {
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
    },
    "gs": {
        "read": ("event_id", "kind", "keys"),
        "write": ("event_id", "kind", "keys", "deps", "delta"),
    },
    "ob": {
        "bid": ("event_id", "kind", "items", "quantities", "bid_price"),
        "alter": ("event_id", "kind", "items", "prices"),
        "top": ("event_id", "kind", "items", "quantities"),
    },
    "tp": {None: ("event_id", "vehicle", "segment", "speed")},
}

# The table whose keys a key field names.
KEY_TABLE: dict[str, dict[str, str]] = {
    "sl": {
        "account": "accounts",
        "asset": "assets",
        "dst_account": "accounts",
        "dst_asset": "assets",
    },
    "gs": {"keys": "records", "deps": "records"},
    "ob": {"items": "items"},
    "tp": {"segment": "segment_speed"},
}

# Inclusive value domains (for list fields: of every element).
DOMAIN: dict[str, dict[str, tuple[int, int | None]]] = {
    "sl": {"amount": (1, MAX), "asset_amount": (1, MAX)},
    "gs": {"delta": (-MAX, MAX)},
    "ob": {"prices": (1, MAX), "quantities": (1, MAX), "bid_price": (1, MAX)},
    "tp": {"vehicle": (0, None), "speed": (0, None)},
}

# Pairs of list fields whose lengths must match, and fixed lengths, per kind.
SAME_LENGTH: dict[str, tuple[str, str]] = {
    "alter": ("items", "prices"),
    "top": ("items", "quantities"),
}
LENGTH_ONE: dict[str, tuple[str, ...]] = {"bid": ("items", "quantities")}


class Rejected(Exception):
    """Malformed input; the event leaves the state untouched."""


class Aborted(Exception):
    """A consistency condition failed; the event leaves the state untouched."""


class Txn:
    """One transaction's view of the tables: its own writes first, committed only at the end."""

    def __init__(self, tables: dict[str, dict[str, list]]) -> None:
        self.tables = tables
        self.writes: dict[tuple[str, str, int], object] = {}

    def get(self, table: str, column: str, key: int):
        """The value as of this point of the transaction."""
        return self.writes.get((table, column, key), self.tables[table][column][key])

    def set(self, table: str, column: str, key: int, value) -> None:
        """Buffer a write; later `get`s of this transaction see it."""
        self.writes[(table, column, key)] = value

    def commit(self) -> None:
        """Apply every buffered write."""
        for (table, column, key), value in self.writes.items():
            self.tables[table][column][key] = value


def validate(topology: str, row: dict, sizes: dict[str, int] | None) -> None:
    """Raise `Rejected` if the event is malformed (contract §1, §3); reads no state.
    ``sizes`` None: natural keys, where only an empty string is not a key."""
    kind = None
    if topology != "tp":
        kind = row["kind"]
        if kind is None:
            raise Rejected("null kind")
        if kind not in USED[topology]:
            raise Rejected("unknown kind")
    used = USED[topology][kind]
    for field in used:
        if row[field] is None:
            raise Rejected(f"null {field}")
        if isinstance(row[field], list) and any(x is None for x in row[field]):
            raise Rejected(f"null element in {field}")
    if kind in SAME_LENGTH:
        a, b = SAME_LENGTH[kind]
        if len(row[a]) != len(row[b]):
            raise Rejected(f"{b} length mismatch")
    for field in LENGTH_ONE.get(kind, ()):
        if len(row[field]) != 1:
            raise Rejected(f"{field} length mismatch")
    if topology == "gs" and not row["keys"]:
        raise Rejected("keys out of domain")
    for field in used:
        values = row[field] if isinstance(row[field], list) else [row[field]]
        if field in KEY_TABLE[topology]:
            if sizes is None:
                if any(k == "" for k in values):
                    raise Rejected(f"{field} malformed")
            elif any(not 0 <= k < sizes[KEY_TABLE[topology][field]] for k in values):
                raise Rejected(f"{field} out of range")
        if field in DOMAIN[topology]:
            lo, hi = DOMAIN[topology][field]
            if any(v < lo or (hi is not None and v > hi) for v in values):
                raise Rejected(f"{field} out of domain")


def _sl(row: dict, txn: Txn) -> dict:
    a, s, amount, asset_amount = row["account"], row["asset"], row["amount"], row["asset_amount"]
    if row["kind"] == "deposit":
        txn.set("accounts", "balance", a, txn.get("accounts", "balance", a) + amount)
        txn.set("assets", "balance", s, txn.get("assets", "balance", s) + asset_amount)
        return {}
    if txn.get("accounts", "balance", a) < amount or txn.get("assets", "balance", s) < asset_amount:
        raise Aborted("insufficient balance")
    da, ds = row["dst_account"], row["dst_asset"]
    txn.set("accounts", "balance", a, txn.get("accounts", "balance", a) - amount)
    txn.set("accounts", "balance", da, txn.get("accounts", "balance", da) + amount)
    txn.set("assets", "balance", s, txn.get("assets", "balance", s) - asset_amount)
    txn.set("assets", "balance", ds, txn.get("assets", "balance", ds) + asset_amount)
    return {}


def _gs(row: dict, txn: Txn) -> dict:
    if row["kind"] == "read":
        return {"sum": sum(txn.get("records", "value", k) for k in row["keys"])}
    deps = row["deps"]
    for key in row["keys"]:
        base = sum(txn.get("records", "value", d) for d in deps) // len(deps) if deps else 0
        v = base + row["delta"]
        if v < 0:
            raise Aborted("negative value")
        txn.set("records", "value", key, v)
    return {}


def _ob(row: dict, txn: Txn) -> dict:
    items = row["items"]
    if row["kind"] == "bid":
        item, q = items[0], row["quantities"][0]
        if row["bid_price"] < txn.get("items", "price", item):
            raise Aborted("bid below price")
        if txn.get("items", "quantity", item) < q:
            raise Aborted("insufficient quantity")
        txn.set("items", "quantity", item, txn.get("items", "quantity", item) - q)
    elif row["kind"] == "alter":
        for item, price in zip(items, row["prices"], strict=True):
            txn.set("items", "price", item, price)
    else:
        for item, q in zip(items, row["quantities"], strict=True):
            txn.set("items", "quantity", item, txn.get("items", "quantity", item) + q)
    return {}


def _tp(row: dict, txn: Txn) -> dict:
    seg, speed = row["segment"], row["speed"]
    if speed >= 200:
        raise Aborted("implausible speed")
    speed_sum = txn.get("segment_speed", "speed_sum", seg) + speed
    speed_count = txn.get("segment_speed", "speed_count", seg) + 1
    vehicles = txn.get("segment_vehicles", "vehicles", seg) | {row["vehicle"]}
    txn.set("segment_speed", "speed_sum", seg, speed_sum)
    txn.set("segment_speed", "speed_count", seg, speed_count)
    txn.set("segment_vehicles", "vehicles", seg, vehicles)
    avg, cnt = speed_sum // speed_count, len(vehicles)
    toll = 2 * (cnt - 50) ** 2 if avg < 40 and cnt > 50 else 0
    return {"toll": toll, "avg_speed": avg, "vehicle_count": cnt}


APPLY: dict[str, Callable[[dict, Txn], dict]] = {"sl": _sl, "gs": _gs, "ob": _ob, "tp": _tp}


def _load(topology: str, init: dict[str, pa.Table]) -> dict[str, dict[str, list]]:
    """Init tables as column lists; TP's vehicle sets start empty, sized like segment_speed."""
    tables = {}
    for name, columns in TABLES[topology].items():
        if name == "segment_vehicles":
            continue
        table = init[name]
        if table.column("key").to_pylist() != list(range(table.num_rows)):
            raise ValueError(f"init {name}: key is not 0..K-1")
        tables[name] = {c: table.column(c).to_pylist() for c in columns}
    if topology == "tp":
        segments = init["segment_speed"].num_rows
        tables["segment_vehicles"] = {"vehicles": [frozenset() for _ in range(segments)]}
    return tables


def _state(topology: str, tables: dict[str, dict[str, list]]) -> dict[str, pa.Table]:
    state = {}
    for name, columns in TABLES[topology].items():
        if name == "segment_vehicles":
            values = {"vehicle_count": [len(v) for v in tables[name]["vehicles"]]}
        else:
            values = tables[name]
        size = len(next(iter(values.values())))
        state[name] = pa.table(
            {"key": pa.array(range(size), I64)} | {c: pa.array(values[c], I64) for c in columns}
        )
    return state


def output_schema(topology: str) -> pa.Schema:
    """The schema of events.parquet for a topology (contract §4)."""
    return pa.schema(
        [("ts", I64), ("event_id", I64), ("status", STR), ("reason", STR)]
        + [(c, I64) for c in OUTPUT_COLUMNS[topology]]
    )


class NaturalTxn(Txn):
    """A transaction over tables of natural keys: `get` of a missing key reads 0, `set`
    creates it; `delete` removes it and `exists` says whether it is there."""

    def get(self, table: str, column: str, key):
        if (table, "", key) in self.writes:  # deleted or created by this transaction
            if not self.writes[(table, "", key)]:
                return 0
            return self.writes.get((table, column, key), 0)
        return self.writes.get((table, column, key), self.tables[table].get(key, {}).get(column, 0))

    def set(self, table: str, column: str, key, value) -> None:
        if not self.exists(table, key):
            self.writes[(table, "", key)] = True
        self.writes[(table, column, key)] = value

    def exists(self, table: str, key) -> bool:
        return self.writes.get((table, "", key), key in self.tables[table])

    def delete(self, table: str, key) -> None:
        for where in [w for w in self.writes if w[0] == table and w[2] == key]:
            del self.writes[where]
        self.writes[(table, "", key)] = False

    def commit(self) -> None:
        for (table, column, key), value in self.writes.items():
            if column == "":
                if value:
                    self.tables[table][key] = dict.fromkeys(NATURAL_TABLES[table], 0)
                else:
                    self.tables[table].pop(key, None)
        for (table, column, key), value in self.writes.items():
            if column != "":
                self.tables[table][key][column] = value


NATURAL_TABLES = {"accounts": ("balance",), "assets": ("balance",), "kv": ("value",)}
"""The value columns of every table the natural-key model knows."""


def _kv(row: dict, txn: NaturalTxn) -> dict:
    kind, key, value = row["kind"], row["key"], row["value"]
    if kind == "put":
        txn.set("kv", "value", key, value)
    elif kind == "add":
        txn.set("kv", "value", key, txn.get("kv", "value", key) + value)
    elif kind == "delete":
        txn.delete("kv", key)
    elif kind == "get":
        if not txn.exists("kv", key):
            raise Aborted("no such key")
        return {"value": txn.get("kv", "value", key)}
    elif kind == "peek":
        return {"value": txn.get("kv", "value", key)}
    else:  # move
        if not txn.exists("kv", key):
            raise Aborted("no such key")
        if txn.get("kv", "value", key) < value:
            raise Aborted("insufficient value")
        txn.set("kv", "value", key, txn.get("kv", "value", key) - value)
        other = row["other"]
        txn.set("kv", "value", other, txn.get("kv", "value", other) + value)
    return {}


KV_KINDS = ("put", "add", "delete", "get", "peek", "move")


def _validate_kv(row: dict) -> None:
    kind = row["kind"]
    if row["event_id"] is None or kind is None or kind not in KV_KINDS:
        raise Rejected("kind")
    fields = ("key",) if kind in ("delete", "get", "peek") else ("key", "value")
    fields += ("other",) if kind == "move" else ()
    for field in fields:
        if row[field] is None:
            raise Rejected(f"null {field}")
        if field in ("key", "other") and row[field] == "":
            raise Rejected(f"{field} malformed")
    if "value" in fields and not 0 <= row["value"] <= MAX:
        raise Rejected("value out of domain")


def _natural_outcomes(
    events: pa.Table,
    tables: dict[str, dict],
    outputs: tuple[str, ...],
    check: Callable[[dict], None],
    apply: Callable[[dict, NaturalTxn], dict | None],
) -> list[dict]:
    """Each event in ts order, ``check``ed (Rejected) then ``apply``d as one transaction on
    ``tables`` (Aborted undoes it): its outcome and ``outputs``."""
    out = []
    for ts, row in enumerate(events.to_pylist()):
        result = {"ts": ts, "event_id": row["event_id"], "status": "committed", "reason": None}
        result |= dict.fromkeys(outputs)
        try:
            check(row)
            txn = NaturalTxn(tables)
            result |= apply(row, txn) or {}
            txn.commit()
        except Rejected as e:
            result |= {"status": "rejected", "reason": str(e)}
        except Aborted as e:
            result |= {"status": "aborted", "reason": str(e)}
        out.append(result)
    return out


def run_natural_model(
    topology: str, events: pa.Table, init: dict[str, pa.Table]
) -> tuple[pa.Table, dict[str, pa.Table]]:
    """`run_model` on tables of natural keys (``sl``, ``kv`` or ``kv-float``, whose values
    and output are float64): the final state holds the keys that exist, sorted by key."""
    kv = topology in ("kv", "kv-float")
    column_type = F64 if topology == "kv-float" else I64
    tables = {}
    for name in NATURAL_TABLES:
        if name in init:
            rows = init[name].to_pylist()
            tables[name] = {r["key"]: {c: r[c] for c in NATURAL_TABLES[name]} for r in rows}
    outputs = ("value",) if kv else OUTPUT_COLUMNS[topology]
    out = _natural_outcomes(
        events,
        tables,
        outputs,
        _validate_kv if kv else lambda row: validate(topology, row, None),
        _kv if kv else APPLY[topology],
    )
    key_type = next(iter(init.values())).schema.field("key").type
    state = {}
    for name, rows in tables.items():
        keys = sorted(rows)
        state[name] = pa.table(
            {"key": pa.array(keys, key_type)}
            | {c: pa.array([rows[k][c] for k in keys], column_type) for c in NATURAL_TABLES[name]}
        )
    schema = pa.schema(
        [("ts", I64), ("event_id", I64), ("status", STR), ("reason", STR)]
        + [(c, column_type) for c in outputs]
    )
    return pa.Table.from_pylist(out, schema=schema), state


def run_model(
    topology: str, events: pa.Table, init: dict[str, pa.Table]
) -> tuple[pa.Table, dict[str, pa.Table]]:
    """Run `events` one by one in ts order; return (events output, final state of every table)."""
    tables = _load(topology, init)
    sizes = {name: len(next(iter(cols.values()))) for name, cols in tables.items()}
    out = []
    for ts, row in enumerate(events.to_pylist()):
        result = {"ts": ts, "event_id": row["event_id"], "status": "committed", "reason": None}
        result |= dict.fromkeys(OUTPUT_COLUMNS[topology])
        try:
            validate(topology, row, sizes)
            txn = Txn(tables)
            outputs = APPLY[topology](row, txn)
            txn.commit()
            result |= outputs
        except Rejected as e:
            result |= {"status": "rejected", "reason": str(e)}
        except Aborted as e:
            result |= {"status": "aborted", "reason": str(e)}
        out.append(result)
    return pa.Table.from_pylist(out, schema=output_schema(topology)), _state(topology, tables)


PAYMENTS_KINDS = ("deposit", "transfer", "close")
CENT = Decimal("0.01")
MONEY_LIMIT = Decimal(10) ** 16
"""decimal(18, 2) holds values strictly between -10^16 and 10^16."""
MONEY = pa.decimal128(18, 2)


def _validate_payment(row: dict) -> None:
    kind = row["kind"]
    if row["event_id"] is None or kind not in PAYMENTS_KINDS:
        raise Rejected("kind")
    fields = ("account",) + (("amount",) if kind != "close" else ())
    fields += ("dst_account",) if kind == "transfer" else ()
    for field in fields:
        if row[field] is None:
            raise Rejected(f"null {field}")
        if field != "amount" and row[field] == "":
            raise Rejected(f"{field} malformed")
    if "amount" in fields:
        amount = Decimal(row["amount"])
        if amount % CENT != 0 or abs(amount) >= MONEY_LIMIT:
            raise Rejected("amount is not a decimal(18, 2)")
        if amount <= 0:
            raise Rejected("amount out of domain")


def _payment(row: dict, txn: NaturalTxn) -> None:
    kind, account = row["kind"], row["account"]
    amount = Decimal(row["amount"]) if row["amount"] is not None else None

    def add(key, value) -> None:
        balance = txn.get("accounts", "balance", key) + value
        if abs(balance) >= MONEY_LIMIT:
            raise Aborted("decimal overflow")
        txn.set("accounts", "balance", key, balance)

    if kind == "deposit":
        add(account, amount)
        return
    if not txn.exists("accounts", account):
        raise Aborted("no such account")
    if kind == "close":
        txn.delete("accounts", account)
        return
    if txn.get("accounts", "balance", account) < amount:
        raise Aborted("insufficient balance")
    add(account, -amount)
    if not txn.exists("accounts", row["dst_account"]):
        raise Aborted("no such destination")
    add(row["dst_account"], amount)


def run_payments_model(
    events: pa.Table, init: dict[str, pa.Table]
) -> tuple[pa.Table, dict[str, pa.Table]]:
    """The payments topology (contract §3) one event at a time: the events' outcomes, with
    their reasons, and the accounts that exist at the end, sorted by id."""
    rows = init["accounts"].to_pylist() if "accounts" in init else []
    tables = {"accounts": {r["key"]: {"balance": Decimal(r["balance"])} for r in rows}}
    out = _natural_outcomes(events, tables, (), _validate_payment, _payment)
    accounts = tables["accounts"]
    keys = sorted(accounts)
    state = pa.table(
        {
            "key": pa.array(keys, STR),
            "balance": pa.array([Decimal(accounts[k]["balance"]) for k in keys], MONEY),
        }
    )
    schema = pa.schema([("ts", I64), ("event_id", I64), ("status", STR), ("reason", STR)])
    return pa.Table.from_pylist(out, schema=schema), {"accounts": state}
