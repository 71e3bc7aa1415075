"""The effective configuration of a run, validated once, recorded in metrics.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from txstream.errors import UsageError
from txstream.logs import LEVELS
from txstream.topologies import BUNDLED, is_valid_name

PLACEMENTS = ("shared-nothing", "shared-per-socket", "shared-everything")
SOURCES = ("spark", "arrow")
CHUNK_EVENTS = 131072
"""Events per hand-off to an executor: amortises a Ray call (~1-3 ms) over many events."""


@dataclass(frozen=True)
class RunConfig:
    """Everything `txstream run` can be told (SPEC §4), with its defaults."""

    topology: str = "sl"
    scheduler: str = "serial"
    explore: str = "auto"
    granularity: str = "auto"
    abort: str = "auto"
    executors: int = 1
    placement: str = "shared-nothing"
    sockets: int | None = None
    punctuation_interval: int = 10240
    udf_cost_us: float = 0.0
    source: str = "spark"
    address: str | None = None
    timeout_s: float = 600.0
    progress: bool = True
    log_level: str = "info"
    verbose: bool = False

    def __post_init__(self) -> None:
        checks = [
            (
                is_valid_name(self.topology),
                f"topology must be one of {', '.join(BUNDLED)} or module:function",
            ),
            (self.executors >= 1, "--executors must be >= 1"),
            (self.placement in PLACEMENTS, f"--placement must be one of {', '.join(PLACEMENTS)}"),
            (self.sockets is None or self.sockets >= 1, "--sockets must be >= 1"),
            (self.punctuation_interval >= 1, "--punctuation-interval must be >= 1"),
            (self.udf_cost_us >= 0, "--udf-cost-us must be >= 0"),
            (self.source in SOURCES, f"--source must be one of {', '.join(SOURCES)}"),
            (self.explore in ("auto", "bfs", "dfs", "ns"), "--explore must be auto|bfs|dfs|ns"),
            (self.granularity in ("auto", "fine", "coarse"), "--granularity: auto|fine|coarse"),
            (self.abort in ("auto", "eager", "lazy"), "--abort must be auto|eager|lazy"),
            (self.timeout_s > 0, "timeout must be > 0"),
            (self.log_level in LEVELS, f"--log-level must be one of {', '.join(LEVELS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        from txstream.schedulers import get as get_scheduler

        get_scheduler(self.scheduler)

    @property
    def chunk_events(self) -> int:
        """Events per chunk: a whole number of punctuation batches near CHUNK_EVENTS."""
        p = self.punctuation_interval
        return p * max(1, CHUNK_EVENTS // p)

    def as_dict(self) -> dict:
        """The configuration as JSON-ready values."""
        return asdict(self)
