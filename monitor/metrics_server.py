"""The HTTP endpoint of a run's metrics and health (``--metrics-port``): ``/metrics`` in
Prometheus' format, ``/healthz`` (200 while the run is alive) and ``/readyz`` (200 while
its team, or its nodes, run; 503 while it starts or recovers), for Prometheus and for a
supervisor that restarts a dead run. It serves metrics and health only, never the state."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector
from txstream.config import RunConfig, metrics_url
from txstream.errors import UsageError
from txstream.monitor.console import Console

SHUTDOWN_POLL_S = 0.05
"""How often the serving thread looks whether to stop: a session's close waits for it (a
wake-up costs microseconds; the library's half a second would lengthen every run)."""


class MetricsServer:
    """Serves ``collector`` and the health of a run on ``host:port`` from a daemon thread
    until `close`; ``alive()`` says whether the run goes on, ``ready()`` whether its team
    runs. A port in use or an address
    this host cannot listen on is a UsageError, raised at once."""

    def __init__(
        self,
        host: str,
        port: int,
        collector: Collector,
        alive: Callable[[], bool],
        ready: Callable[[], bool],
    ):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        probes = {"registry": registry, "alive": staticmethod(alive), "ready": staticmethod(ready)}
        handler = type("Handler", (_Handler,), probes)
        try:
            self._server = _server_class(host)((host, port), handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"--metrics-port {port}: the port is in use on {host}") from exc
            reason = exc.strerror or str(exc)
            raise UsageError(f"--metrics-host {host}: cannot listen there ({reason})") from exc
        self.host, self.port = host, port
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(SHUTDOWN_POLL_S,),
            name="metrics server",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        return metrics_url(self.host, self.port)

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def serve_metrics(
    config: RunConfig,
    collector: Collector,
    alive: Callable[[], bool],
    ready: Callable[[], bool],
    console: Console,
) -> MetricsServer | None:
    """A run's live metrics and health at ``--metrics-port``, if asked for: what a session
    on one host and the driver of a run over several nodes serve alike, each giving its
    ``collector`` (a `RunCollector` of its figures) and its ``alive`` and ``ready``."""
    if config.metrics_port is None:
        return None
    server = MetricsServer(config.metrics_host, config.metrics_port, collector, alive, ready)
    console.note(f"metrics at {server.url}")
    return server


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    if ":" not in host:
        return _Server
    return type("Server6", (_Server,), {"address_family": socket.AF_INET6})


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # `close` waits for a scrape under way: it reads shared memory
    allow_reuse_address = True  # a run started again at once gets its port back


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    alive: Callable[[], bool]
    ready: Callable[[], bool]

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        """``/metrics``, ``/healthz`` or ``/readyz``; 404 for anything else."""
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            alive = self.alive()
            self._answer(200 if alive else 503, b"alive\n" if alive else b"failed\n")
        elif path == "/readyz":
            ready = self.ready()
            self._answer(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
        else:
            self._answer(404, b"metrics at /metrics, health at /healthz and /readyz\n")

    def _answer(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the scraper gave up waiting
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Not on stderr: a scrape every few seconds is no news."""
