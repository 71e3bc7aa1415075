"""txstream: transactional stream processing on Ray."""

from txstream.errors import RuntimeFailure, SchemaError, TopologyError, TxstreamError, UsageError
from txstream.job import Job, Result
from txstream.topologies import Table, Topology, condition, function

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
