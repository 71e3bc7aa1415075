"""GS - Grep and Sum: multi-key reads and writes whose values depend on other keys (contract §3)."""

from __future__ import annotations

import numba
from txstream.topologies.api import (
    INT,
    INT_LIST,
    STRING,
    EventShare,
    Table,
    Topology,
    Transactions,
    condition,
    function,
)
from txstream.topologies.functions import MAX_VALUE

RECORDS = Table("records", ("value",), init_min=0)


@numba.njit(cache=True, nogil=True)
def _new_value(reads, n_reads, delta):
    if n_reads == 0:
        return delta
    total = 0
    for i in range(n_reads):
        total += reads[i]
    return total // n_reads + delta


@function
def average_plus_delta(value, args, reads, n_reads):
    """``(sum of the deps) // len(deps) + delta``, or ``delta`` without deps."""
    return _new_value(reads, n_reads, args[0])


@condition
def stays_non_negative(value, args, reads, n_reads):
    """The written value must not be negative."""
    return _new_value(reads, n_reads, args[0]) >= 0


def pre_process(events: EventShare) -> None:
    """Reject malformed reads and writes."""
    events.require_kind()
    events.require_present(["event_id"])
    read, write = events.kind("read"), events.kind("write")
    events.require_present(["keys"], where=read | write)
    events.require_present(["deps", "delta"], where=write)
    events.reject((read | write) & (events.list("keys").lengths == 0), "keys empty")
    events.require_key("keys", RECORDS, where=read | write)
    events.require_key("deps", RECORDS, where=write)
    events.require_between("delta", -MAX_VALUE, MAX_VALUE, where=write)


def state_access(events: EventShare, txn: Transactions) -> None:
    """A read sums its keys into ``sum``; a write sets each key from its deps."""
    value = RECORDS["value"]
    keys = events.list("keys")
    txn.read(value, keys, out="sum", where=events.kind("read"))
    txn.write(
        value,
        keys,
        average_plus_delta,
        args=[events.int("delta")],
        reads=[(value, events.list("deps"))],
        cond=stays_non_negative,
        reason="negative value",
        where=events.kind("write"),
    )


def topology() -> Topology:
    """Build the GS topology."""
    return Topology(
        name="gs",
        tables=(RECORDS,),
        event_columns={
            "event_id": INT,
            "kind": STRING,
            "keys": INT_LIST,
            "deps": INT_LIST,
            "delta": INT,
        },
        kinds=("read", "write"),
        functions=(average_plus_delta,),
        conditions=(stays_non_negative,),
        outputs=("sum",),
        pre_process=pre_process,
        state_access=state_access,
    )
