"""The state's shared memory mapped twice in one process, as the driver and its executor
threads map it (no Ray needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from txstream.state.layout import Layout
from txstream.state.shared import new_run_id
from txstream.state.tables import SharedState

CELLS = 1 << 20
"""8 MiB of values."""


class _Table:
    name, columns, state_columns, key, init_min = "t", ("balance",), ("balance",), "dense", None


def _shared_mib() -> float:
    """The shared memory this process has mapped, as its resident set counts it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssShmem in /proc/self/status")


def test_a_mapping_that_lets_go_of_its_pages_counts_none_and_reads_what_the_other_wrote():
    layout = Layout.of([_Table()], {"t": CELLS})
    with SharedState.create(new_run_id(), layout, 16) as owner:
        owner.values[:] = np.arange(CELLS)
        team = SharedState.attach(owner.handle)
        try:
            team.values += 1  # every page mapped twice
            both = _shared_mib()
            owner.unmap_pages()
            assert both - _shared_mib() >= 6  # the owner's 8 MiB no longer counted
            team.values[::512] = -1
            want = np.arange(1, CELLS + 1)
            want[::512] = -1
            assert np.array_equal(owner.values, want)
        finally:
            team.close()
