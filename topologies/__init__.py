"""The topology API and the bundled topologies SL, GS, OB and TP.

The API's names are imported from `txstream.topologies.api` on first use: it imports
numba, and the command line needs only the bundled names before it has parsed its
arguments (`txstream run` launches Spark's driver first, `connectors.spark_driver`).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING, Any

from txstream.config import BUNDLED, NAMED, is_valid_name
from txstream.errors import UsageError

if TYPE_CHECKING:
    from txstream.topologies.api import (
        EventShare,
        Outputs,
        Table,
        Topology,
        Transactions,
        condition,
        function,
    )

_API = ("EventShare", "Outputs", "Table", "Topology", "Transactions", "condition", "function")

__all__ = [
    "BUNDLED",
    "EventShare",
    "Outputs",
    "Table",
    "Topology",
    "Transactions",
    "condition",
    "function",
    "get",
    "is_valid_name",
]


def __getattr__(name: str) -> Any:
    if name in _API:
        from txstream.topologies import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NATURAL_KEYS = ("sl",)
"""Bundled topologies that run on natural keys (`--key-type`)."""


def get(name: str, key_type: str | None = None) -> Topology:
    """The topology ``name`` - bundled (``sl``, ``payments``) or a factory
    (``mypkg.flows:ledger``) - built, and its functions compiled, once per process (every
    actor builds its own).
    ``key_type`` (`--key-type`): the key type of a bundled topology's tables (None or
    ``dense``: dense); a factory's tables declare their own."""
    return _built(name, None if key_type == "dense" else key_type)


@cache
def _built(name: str, key_type: str | None) -> Topology:
    natural = key_type is not None
    if natural and name not in NATURAL_KEYS:
        raise UsageError(
            f"--key-type {key_type} applies to {', '.join(NATURAL_KEYS)}; a topology of "
            "its own declares its tables' key types"
        )
    if name in NAMED:
        module = importlib.import_module(f"txstream.topologies.{name}")
        return module.topology(key_type) if natural else module.topology()
    if not is_valid_name(name):
        raise UsageError(
            f"unknown topology {name!r}; choose one of {', '.join(NAMED)} or module:function"
        )
    module, factory = name.split(":", 1)
    try:
        topology = getattr(importlib.import_module(module), factory)()
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load topology factory {name!r}: {exc}") from exc
    from txstream.topologies.api import Topology

    if not isinstance(topology, Topology):
        raise UsageError(f"{name!r} returned {type(topology).__name__}, not a Topology")
    return topology
