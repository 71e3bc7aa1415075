"""Test topologies: SL whose state_access fails on a chosen event, and one that cannot compile."""

from __future__ import annotations

from txstream.topologies import sl
from txstream.topologies.api import Topology, function

FAIL_ON_EVENT_ID = 13


def _failing_state_access(events, txn):
    if (events.int("event_id") == FAIL_ON_EVENT_ID).any():
        raise RuntimeError("user code failed on purpose")
    sl.state_access(events, txn)


def sl_with_state_access(name: str, state_access, functions=()) -> Topology:
    """SL under another name, with another state_access and, if given, more
    ``functions`` (test topologies)."""
    base = sl.topology()
    return Topology(
        name=name,
        tables=base.tables,
        event_columns=base.event_columns,
        kinds=base.kinds,
        functions=(*base.functions, *functions),
        conditions=base.conditions,
        pre_process=base.pre_process,
        state_access=state_access,
    )


def build() -> Topology:
    """SL with a state_access that raises on event 13."""
    return sl_with_state_access("failing-sl", _failing_state_access)


@function
def not_numba(value, args, reads, n_reads):
    """Uses a Python object numba cannot type."""
    return len({"a": object()}) + value


def build_uncompilable() -> Topology:
    """A topology whose user function numba cannot compile."""
    base = sl.topology()
    return Topology(
        name="bad",
        tables=base.tables,
        event_columns=base.event_columns,
        kinds=base.kinds,
        functions=(not_numba,),
        pre_process=base.pre_process,
        state_access=base.state_access,
    )
