"""A test topology: SL whose deposits cost `SPIN_NS` of busy work from event
`COSTLY_FROM` on, so that a run's operations become costlier halfway."""

from __future__ import annotations

import numpy as np
from failing_topology import sl_with_state_access
from txstream.state._kernels import busy_wait
from txstream.topologies import sl
from txstream.topologies.api import Topology, function

COSTLY_FROM = 10_000
SPIN_NS = 20_000


@function
def add_after_spinning(value, args, reads, n_reads):
    """``value + args[0]``, after ``args[1]`` ns of busy work."""
    busy_wait(args[1])
    return value + args[0]


def _state_access(events, txn):
    spin = np.where(events.int("event_id") >= COSTLY_FROM, SPIN_NS, 0)
    deposit = events.kind("deposit")
    txn.read_modify(
        sl.ACCOUNTS["balance"],
        events.int("account"),
        add_after_spinning,
        args=[events.int("amount"), spin],
        where=deposit,
    )
    sl.state_access(events, txn)


def build() -> Topology:
    """SL with one more statement per deposit, cheap and then costly."""
    return sl_with_state_access("costlier-sl", _state_access, (add_after_spinning,))
