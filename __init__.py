"""txstream: transactional stream processing on Ray.

The public names are imported on first use: every actor process imports this package,
and most need neither the `Job` (Ray, Spark, every scheduler) nor the topology API.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from txstream.errors import RuntimeFailure, SchemaError, TopologyError, TxstreamError, UsageError

if TYPE_CHECKING:
    from txstream.cluster.transport import ThreadTransport
    from txstream.config import RunConfig
    from txstream.job import Job
    from txstream.result import Result
    from txstream.session import Session
    from txstream.topologies import Table, Topology, condition, function

_LAZY = {
    "Job": "txstream.job",
    "Session": "txstream.session",
    "Result": "txstream.result",
    "RunConfig": "txstream.config",
    "ThreadTransport": "txstream.cluster.transport",
    "Table": "txstream.topologies",
    "Topology": "txstream.topologies",
    "condition": "txstream.topologies",
    "function": "txstream.topologies",
}

__all__ = [
    "Job",
    "Session",
    "Result",
    "RunConfig",
    "ThreadTransport",
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
