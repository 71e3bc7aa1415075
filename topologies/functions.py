"""User functions shared by the bundled topologies (numba-compiled when a topology is built)."""

from __future__ import annotations

from txstream.topologies.api import condition, function

MAX_VALUE = 2**40
"""Upper bound of amounts, prices and quantities in the bundled topologies (contract §3)."""


@function
def add(value, args, reads, n_reads):
    """``value + args[0]``."""
    return value + args[0]


@function
def subtract(value, args, reads, n_reads):
    """``value - args[0]``."""
    return value - args[0]


@function
def assign(value, args, reads, n_reads):
    """``args[0]``: a blind write."""
    return args[0]


@condition
def covers(value, args, reads, n_reads):
    """``value >= args[0]``: enough balance or quantity for the request."""
    return value >= args[0]
