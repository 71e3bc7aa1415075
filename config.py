"""The effective configuration of a run, validated once, recorded in metrics.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from txstream.actors.punctuation import CHUNK_EVENTS
from txstream.errors import UsageError
from txstream.monitor.logs import LEVELS
from txstream.topologies import BUNDLED, is_valid_name

PLACEMENTS = ("shared-nothing", "shared-per-socket", "shared-everything")
EXPLORE = ("auto", "bfs", "dfs", "ns")
GRANULARITY = ("auto", "fine", "coarse")
ABORT = ("auto", "eager", "lazy")
SOURCES = ("spark", "arrow")
LATENCY_TARGET_MS = 500.0
"""Default push-to-output latency target (bench/latency: see README, Sessions)."""
CHECKPOINT_EVERY = 100
"""Default punctuation batches between checkpoints (bench/recovery: see README)."""
PUNCTUATION_MS = 50.0
"""Default time after which a punctuation batch is cut however few events it has."""


@dataclass(frozen=True)
class RunConfig:
    """Everything `txstream run` can be told (contract §4), with its defaults.

    ``explore``, ``granularity``, ``abort`` and ``placement`` apply to some schedulers
    only (see `txstream.schedulers.base.Scheduler.defaults`): None means "not given";
    giving one to a scheduler that does not honour it is a UsageError. Once
    validated, they hold the effective values (the scheduler's defaults where not
    given, None where they do not apply), which metrics.json records.
    """

    topology: str = "sl"
    scheduler: str = "serial"
    explore: str | None = None
    granularity: str | None = None
    abort: str | None = None
    executors: int = 1
    placement: str | None = None
    sockets: int | None = None
    punctuation_interval: int = 10240
    udf_cost_us: float = 0.0
    source: str = "spark"
    address: str | None = None
    punctuation_ms: float | None = PUNCTUATION_MS
    latency_target_ms: float = LATENCY_TARGET_MS
    max_chunk_events: int = CHUNK_EVENTS
    """Largest chunk handed to the team at once (the chunk sizer stays below it)."""
    overwrite: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    """Punctuation batches between checkpoints; needs a folder (with one, None means
    CHECKPOINT_EVERY, the effective value once validated)."""
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
            (
                _among(self.placement, PLACEMENTS),
                f"--placement must be one of {', '.join(PLACEMENTS)}",
            ),
            (self.sockets is None or self.sockets >= 1, "--sockets must be >= 1"),
            (self.punctuation_interval >= 1, "--punctuation-interval must be >= 1"),
            (self.udf_cost_us >= 0, "--udf-cost-us must be >= 0"),
            (self.source in SOURCES, f"--source must be one of {', '.join(SOURCES)}"),
            (_among(self.explore, EXPLORE), f"--explore must be one of {', '.join(EXPLORE)}"),
            (
                _among(self.granularity, GRANULARITY),
                f"--granularity must be one of {', '.join(GRANULARITY)}",
            ),
            (_among(self.abort, ABORT), f"--abort must be one of {', '.join(ABORT)}"),
            (self.timeout_s > 0, "timeout must be > 0"),
            (
                self.punctuation_ms is None or self.punctuation_ms > 0,
                "--punctuation-ms must be > 0",
            ),
            (self.latency_target_ms > 0, "--latency-target-ms must be > 0"),
            (self.max_chunk_events >= 1, "--max-chunk-events must be >= 1"),
            (
                self.checkpoint_every is None or self.checkpoint_every >= 1,
                "--checkpoint-every must be >= 1",
            ),
            (
                self.checkpoint_every is None or self.checkpoint_dir is not None,
                "--checkpoint-every needs --checkpoint-dir",
            ),
            (self.log_level in LEVELS, f"--log-level must be one of {', '.join(LEVELS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        from txstream.schedulers import get as get_scheduler

        effective = get_scheduler(self.scheduler).check_options(self)
        if self.checkpoint_dir is not None and self.checkpoint_every is None:
            effective["checkpoint_every"] = CHECKPOINT_EVERY
        for option, value in effective.items():
            object.__setattr__(self, option, value)

    def as_dict(self) -> dict:
        """The configuration as JSON-ready values."""
        return asdict(self)


def _among(value: str | None, choices: tuple[str, ...]) -> bool:
    return value is None or value in choices
