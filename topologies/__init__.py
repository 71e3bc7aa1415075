"""The topology API and the bundled topologies SL, GS, OB and TP."""

from __future__ import annotations

import importlib
from functools import cache

from txstream.errors import UsageError
from txstream.topologies.api import (
    EventBatch, Outputs, Table, Topology, Transactions, condition, function,
)  # fmt: skip

BUNDLED = ("sl", "gs", "ob", "tp")

__all__ = [
    "BUNDLED", "EventBatch", "Outputs", "Table", "Topology", "Transactions",
    "condition", "function", "get",
]  # fmt: skip


@cache
def get(name: str) -> Topology:
    """The bundled topology ``name``, built (and its functions compiled) once per process."""
    if name not in BUNDLED:
        raise UsageError(f"unknown topology {name!r}; choose one of {', '.join(BUNDLED)}")
    return importlib.import_module(f"txstream.topologies.{name}").topology()
