"""txstream: transactional stream processing on Ray.

The public names are imported on first use: every actor process imports this package,
and most need neither the `Job` (Ray, Spark, every scheduler) nor the topology API.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from txstream.errors import RuntimeFailure, SchemaError, TopologyError, TxstreamError, UsageError

if TYPE_CHECKING:
    from txstream.job import Job, Result
    from txstream.topologies import Table, Topology, condition, function

_LAZY = {
    "Job": "txstream.job",
    "Result": "txstream.job",
    "Table": "txstream.topologies",
    "Topology": "txstream.topologies",
    "condition": "txstream.topologies",
    "function": "txstream.topologies",
}

__all__ = [
    "Job",
    "Result",
    "Table",
    "Topology",
    "condition",
    "function",
    "RuntimeFailure",
    "SchemaError",
    "TopologyError",
    "TxstreamError",
    "UsageError",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'txstream' has no attribute {name!r}")
