"""A run's live metrics through Ray's own metrics (`ray.util.metrics`), where Ray's metrics
agent runs (Ray installed with ``ray[default]``, e.g. with its dashboard): Ray's endpoint
then serves them beside its own, found by Prometheus through Ray's service discovery file,
and Ray's dashboard shows them.

Every sample of the run's metric families (`RunCollector`) is mirrored as a Ray gauge of
the same name and labels, every `PERIOD_S`: values exactly as ``/metrics`` gives them
(Ray prefixes the names with ``ray_``), read from the run's own counts as a scrape is.
"""

from __future__ import annotations

import socket
import threading

from prometheus_client.registry import Collector

PERIOD_S = 1.0
"""How often the figures are handed to Ray's metrics."""


def metrics_agent_running() -> bool:
    """Whether Ray's metrics agent listens on this host's Ray node (a Ray installed
    without ``ray[default]`` runs its agent without it)."""
    import ray

    here = ray.util.get_node_ip_address()
    for node in ray.nodes():
        port = node.get("MetricsExportPort")
        if not node.get("Alive") or node.get("NodeManagerAddress") != here or not port:
            continue
        try:
            socket.create_connection((here, port), timeout=1.0).close()
        except OSError:
            return False
        return True
    return False


class RayMetricsExport:
    """Mirrors ``collector``'s samples into Ray's metrics from a daemon thread until
    `close` (module docstring)."""

    def __init__(self, collector: Collector):
        self._collector = collector
        self._gauges: dict[str, object] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="Ray metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self.export()

    def export(self) -> None:
        """Hand every sample's value to Ray now."""
        from ray.util.metrics import Gauge

        for family in self._collector.collect():
            for sample in family.samples:
                gauge = self._gauges.get(sample.name)
                if gauge is None:
                    gauge = Gauge(sample.name, family.documentation, tuple(sample.labels))
                    self._gauges[sample.name] = gauge
                gauge.set(sample.value, tags=dict(sample.labels))

    def close(self) -> None:
        """Stop handing figures to Ray (idempotent)."""
        self._stop.set()
        self._thread.join()
