"""What a run or a session produced: per-event outputs, final state, metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa


class Result:
    """Per-event outputs (ts order), every table's final state, and the metrics.

    A run with an output folder does not hold its events in memory: ``events`` reads
    them from the committed files when first asked for (4M SL events are 134 MB as a
    table, and a run's memory stays bounded whatever its input)."""

    def __init__(
        self,
        events: pa.Table | Callable[[], pa.Table],
        state: dict[str, pa.Table],
        metrics: dict[str, Any],
    ):
        self._events = events
        self.state = state
        self.metrics = metrics

    @property
    def events(self) -> pa.Table:
        """The per-event outputs in ts order (read on first access, see above)."""
        if callable(self._events):
            self._events = self._events()
        return self._events

    def to_spark(self, spark: Any) -> tuple[Any, dict[str, Any]]:
        """Events and every table's state as Spark DataFrames of ``spark`` (same columns,
        types and nulls as the Arrow tables)."""
        from txstream.connectors.extras import require_spark

        require_spark("to_spark", on_ray=False)
        from txstream.connectors.spark import arrow_to_spark

        state = {name: arrow_to_spark(table, spark) for name, table in self.state.items()}
        return arrow_to_spark(self.events, spark), state

    def report(self, path: str | Path) -> Path:
        """Write the run's HTML report (plots of its metrics, see `txstream report`) to
        ``path``; the path."""
        from txstream.monitor.report import write_report

        return write_report(self.metrics, path)
