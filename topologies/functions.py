"""User functions shared by the bundled topologies (numba-compiled when a topology is built;
the kernels compute these inline, see `txstream.topologies.api.well_known`)."""

from __future__ import annotations

from txstream.state._kernels import VALUE_MINUS_ARG, VALUE_PLUS_ARG
from txstream.topologies.api import assign, covers, well_known

__all__ = ["MAX_VALUE", "add", "assign", "covers", "subtract"]

MAX_VALUE = 2**40
"""Upper bound of amounts, prices and quantities in the bundled topologies (contract §3)."""


@well_known(VALUE_PLUS_ARG)
def add(value, args, reads, n_reads):
    """``value + args[0]``."""
    return value + args[0]


@well_known(VALUE_MINUS_ARG)
def subtract(value, args, reads, n_reads):
    """``value - args[0]``."""
    return value - args[0]
