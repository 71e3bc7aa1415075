"""txstream: transactional stream processing on Ray.

The public names are imported on first use: every actor process imports this package,
and most need neither the `Job` (Ray, Spark, every scheduler) nor the topology API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txstream.errors import RuntimeFailure, SchemaError, TopologyError, TxstreamError, UsageError

if TYPE_CHECKING:
    from txstream.cluster.transport import ThreadTransport
    from txstream.config import RunConfig
    from txstream.job import Job
    from txstream.result import Result
    from txstream.session import Session
    from txstream.topologies import Table, Topology, condition, function

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
    """A public name, its module imported on first use (plain imports, which the import
    contracts see)."""
    if name == "Job":
        from txstream.job import Job as value
    elif name == "Session":
        from txstream.session import Session as value
    elif name == "Result":
        from txstream.result import Result as value
    elif name == "RunConfig":
        from txstream.config import RunConfig as value
    elif name == "ThreadTransport":
        from txstream.cluster.transport import ThreadTransport as value
    elif name in ("Table", "Topology", "condition", "function"):
        from txstream.topologies import api

        value = getattr(api, name)
    else:
        raise AttributeError(f"module 'txstream' has no attribute {name!r}")
    return value
