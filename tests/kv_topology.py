"""A test topology of natural keys that are created, deleted, created again and read while
missing: one table ``kv(value)``; its model is `naive.run_natural_model`.

- ``put``: ``kv[key] = value`` (created if missing); ``add``: ``kv[key] += value``;
- ``delete``: ``kv[key]`` no longer exists (missing: no effect);
- ``get``: output ``value`` of ``key``, aborted (``no such key``) if missing;
- ``peek``: output ``value`` of ``key``, 0 if missing;
- ``move``: ``value`` from ``key`` (aborted if missing or short) to ``other`` (created).

`floats` is KV on float64 values, events and output, through the same functions.
"""

from __future__ import annotations

from txstream.topologies.api import FLOAT, INT, STRING, EventShare, Table, Topology, Transactions
from txstream.topologies.functions import MAX_VALUE, add, assign, covers, subtract

KINDS = ("put", "add", "delete", "get", "peek", "move")


def pre_process(events: EventShare) -> None:
    """Reject unknown kinds, null fields, malformed keys and values out of range."""
    (kv,) = events.topology.tables
    events.require_kind()
    events.require_present(["event_id"])
    valued = events.kind("put") | events.kind("add") | events.kind("move")
    move = events.kind("move")
    events.require_present(["key"], where=events.kind_codes() >= 0)
    events.require_present(["value"], where=valued)
    events.require_present(["other"], where=move)
    events.require_key("key", kv, where=events.kind_codes() >= 0)
    events.require_key("other", kv, where=move)
    events.require_between("value", 0, MAX_VALUE, where=valued)


def state_access(events: EventShare, txn: Transactions) -> None:
    """Each kind as the module docstring says."""
    (kv,) = events.topology.tables
    value = events.float("value") if kv.types else events.int("value")
    key, other = events.int("key"), events.int("other")
    column = kv["value"]
    put, add_, move = events.kind("put"), events.kind("add"), events.kind("move")
    reading = events.kind("get") | move
    txn.create(kv, key, where=put | add_)
    txn.write(column, key, assign, args=[value], where=put)
    txn.read_modify(column, key, add, args=[value], where=add_)
    txn.delete(kv, key, where=events.kind("delete"))
    txn.exists(kv, key, reason="no such key", where=reading)
    txn.read(column, key, out="value", where=events.kind("get") | events.kind("peek"))
    txn.read_modify(
        column, key, subtract, args=[value], cond=covers, reason="insufficient value", where=move
    )
    txn.create(kv, other, where=move)
    txn.read_modify(column, other, add, args=[value], where=move)


def _build(key: str, values: str = INT) -> Topology:
    column = STRING if key == "string" else INT
    types = {} if values == INT else {"value": values}
    return Topology(
        name=f"kv-{key}" + ("" if values == INT else f"-{values}"),
        tables=(Table("kv", ("value",), key=key, deletes=True, types=types),),
        event_columns={
            "event_id": INT,
            "kind": STRING,
            "key": column,
            "value": values,
            "other": column,
        },
        kinds=KINDS,
        functions=(add, subtract),
        conditions=(covers,),
        outputs=("value",),
        output_types=types,
        key_columns={"key": "kv", "other": "kv"},
        pre_process=pre_process,
        state_access=state_access,
    )


def string_keys() -> Topology:
    """KV on string keys."""
    return _build("string")


def int64_keys() -> Topology:
    """KV on int64 keys."""
    return _build("int64")


def floats() -> Topology:
    """KV on string keys and float64 values."""
    return _build("string", FLOAT)
