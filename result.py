"""What a run or a session produced: per-event outputs, final state, metrics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa


@dataclass
class Result:
    """Per-event outputs (ts order), every table's final state, and the metrics."""

    events: pa.Table
    state: dict[str, pa.Table]
    metrics: dict[str, Any]

    def to_spark(self, spark: Any) -> tuple[Any, dict[str, Any]]:
        """Events and every table's state as Spark DataFrames of ``spark`` (same columns,
        types and nulls as the Arrow tables)."""
        from txstream.connectors.spark import arrow_to_spark

        state = {name: arrow_to_spark(table, spark) for name, table in self.state.items()}
        return arrow_to_spark(self.events, spark), state

    def report(self, path: str | Path) -> Path:
        """Write the run's HTML report (plots of its metrics, see `txstream report`) to
        ``path``; the path."""
        from txstream.monitor.report import write_report

        return write_report(self.metrics, path)
