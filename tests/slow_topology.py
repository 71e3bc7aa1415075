"""A test topology: SL whose every chunk takes at least `CHUNK_S` (the team stays busy)."""

from __future__ import annotations

import time

from failing_topology import sl_with_state_access
from txstream.topologies import sl
from txstream.topologies.api import Topology

CHUNK_S = 0.02


def _slow_state_access(events, txn):
    time.sleep(CHUNK_S)
    sl.state_access(events, txn)


def build() -> Topology:
    """SL with a state_access that sleeps `CHUNK_S` first."""
    return sl_with_state_access("slow-sl", _slow_state_access)
