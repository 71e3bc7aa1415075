"""The effective configuration of a run, validated once, recorded in metrics.json.

Plain options and the values each may take: this module imports nothing of txstream but
its errors, so that every layer can read a run's configuration. Which scheduler honours
which option is declared here, with the option; the schedulers read the effective values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from txstream.errors import UsageError

BUNDLED = ("sl", "gs", "ob", "tp")
"""The bundled benchmark topologies (`txstream.topologies` builds each by name)."""
NAMED = (*BUNDLED, "payments")
"""Every topology known by name: the benchmarks and payments, an example of natural keys
and decimals."""
SCHEDULERS = ("serial", "tstream", "morphstream", "sstore", "lock", "mvlk", "nolock")
"""Values of `--scheduler` (`txstream.schedulers` maps each to its class)."""
SCHEDULER_OPTIONS = ("explore", "granularity", "abort", "placement")
"""Options only some schedulers honour; the others apply to every scheduler."""
HONOURED = {
    "tstream": {"placement": "shared-nothing"},
    "morphstream": {
        "explore": "auto",
        "granularity": "auto",
        "abort": "auto",
        "placement": "shared-nothing",
    },
    "sstore": {"placement": "shared-nothing"},
}
"""The `SCHEDULER_OPTIONS` each scheduler honours, with their defaults (a scheduler not
named honours none); giving one to a scheduler that does not honour it is a UsageError."""
ONE_NODE = ("nolock",)
"""Schedulers that do not run on several nodes (`--nodes`, contract §8): the nodes of a
transaction across them must each reach serial's decision for it."""
LEVELS = ("debug", "info", "warning", "error")
"""Values of `--log-level`, for txstream's own records, Ray's and Spark's."""
PLACEMENTS = ("shared-nothing", "shared-per-socket", "shared-everything")
EXPLORE = ("auto", "bfs", "dfs", "ns")
GRANULARITY = ("auto", "fine", "coarse")
ABORT = ("auto", "eager", "lazy")
SOURCES = ("spark", "arrow")
TRANSPORTS = ("auto", "ray", "threads")
KEY_TYPES = ("dense", "int64", "string")
"""Key types of a table (contract §2): rows 0..K-1, any int64, UTF-8 strings."""
LATENCY_TARGET_MS = 500.0
"""Default push-to-output latency target (bench/latency.py; docs/performance.md)."""
CHECKPOINT_EVERY = 100
"""Default punctuation batches between checkpoints (bench/recovery.py; docs/performance.md)."""
MAX_NODES = 62
"""Nodes a run can spread over (a transaction's participants are a bit each of an int64)."""
PUNCTUATION_MS = 50.0
"""Default time after which a punctuation batch is cut however few events it has."""
METRICS_HOST = "127.0.0.1"
"""Where `--metrics-port` listens unless told: metrics are for this host until a person
opens them wider."""
CHUNK_EVENTS = 131072
"""Default largest chunk (`--max-chunk-events`): large enough to amortise a Ray call per
executor and the chunk's barriers, small enough to bound the latency."""


def option(
    default: Any,
    help: str,
    *,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    flag: str | None = None,
) -> Any:
    """A `RunConfig` field that is also an option of `txstream run`, declared once: the
    command line builds its option (``--field-name``, or ``flag``) from the field's type,
    default and this metadata; a bool field is a flag (``--no-...``: it sets False)."""
    metadata = {"help": help, "metavar": metavar, "choices": choices, "flag": flag}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class RunConfig:
    """Everything `txstream run` can be told (contract §4), with its defaults; each field
    declared with `option` is an option of the command line, with its help.

    ``explore``, ``granularity``, ``abort`` and ``placement`` apply to some schedulers
    only (`HONOURED`): None means "not given";
    giving one to a scheduler that does not honour it is a UsageError. Once
    validated, they hold the effective values (the scheduler's defaults where not
    given, None where they do not apply), which metrics.json records.
    """

    topology: str = "sl"
    scheduler: str = option(
        "serial",
        "how transactions run in parallel; all but nolock (a bound without consistency) "
        "give serial's results",
        choices=SCHEDULERS,
    )
    explore: str | None = option(
        None,
        "morphstream only: how the task graph is explored (default: auto)",
        choices=EXPLORE,
    )
    granularity: str | None = option(
        None,
        "morphstream only: operations or operation chains as scheduling units (default: auto)",
        choices=GRANULARITY,
    )
    abort: str | None = option(
        None, "morphstream only: when aborts are handled (default: auto)", choices=ABORT
    )
    executors: int = option(
        1,
        "executor actors, each pinned to a core (more than the usable cores: a warning; "
        "over 4 times as many: refused)",
        metavar="N",
    )
    placement: str | None = option(
        None,
        "tstream, morphstream, sstore: which executors share which keys' work "
        "(default: shared-nothing)",
        choices=PLACEMENTS,
    )
    sockets: int | None = option(
        None,
        "split the usable cores into S emulated sockets (default: the host's own)",
        metavar="S",
    )
    punctuation_interval: int = option(10240, "events per punctuation batch", metavar="N")
    udf_cost_us: float = option(
        0.0,
        "busy microseconds added to every state access (never changes results)",
        metavar="C",
    )
    source: str = option(
        "spark", "read the input with Spark (through RayDP) or with pyarrow", choices=SOURCES
    )
    spark_exchange_dir: str | None = option(
        None,
        "a folder that Spark's executors and this host share: a Spark DataFrame of a "
        "cluster not on Ray is staged there (default: Spark on Ray, or a local one, "
        "needs none)",
        metavar="PATH",
    )
    address: str | None = option(
        None,
        "Ray cluster to run on, HOST:PORT or auto (default: $RAY_ADDRESS, else a local Ray "
        "for this run)",
        metavar="RAY_ADDRESS",
    )
    nodes: int = option(
        1,
        "spread the state by key over N nodes of the Ray cluster given by --address, a team "
        "of --executors on each (1: this host's engine)",
        metavar="N",
    )
    transport: str = option(
        "auto",
        "how the team runs: ray (Ray actors, a process each), threads (of "
        "this process: no Ray to start, no outside readers), auto (ray with --address, "
        "$RAY_ADDRESS, a session --name or --checkpoint-dir, threads otherwise)",
        choices=TRANSPORTS,
    )
    dashboard: bool = option(
        False,
        "start Ray's dashboard with the local Ray of the run (needs ray[default]; with "
        "--transport auto, the team then runs on Ray)",
    )
    log_level: str = option(
        "info",
        "detail of the run's log (txstream, Ray and Spark), OUTPUT/_logs/txstream.log",
        choices=LEVELS,
    )
    verbose: bool = option(
        False, "also show the log on stderr (Ray's, Spark's and the JVMs' output included)"
    )
    progress: bool = option(True, "no phases or progress bar on stderr", flag="--no-progress")
    metrics_port: int | None = option(
        None,
        "serve the run's live metrics (Prometheus' format) at http://HOST:PORT/metrics, "
        "with /healthz and /readyz for a supervisor (default: none)",
        metavar="PORT",
    )
    metrics_host: str = option(
        METRICS_HOST,
        "the address --metrics-port listens on (0.0.0.0: every interface)",
        metavar="HOST",
    )
    overwrite: bool = option(False, "replace a non-empty output (when the run commits)")
    punctuation_ms: float | None = option(
        PUNCTUATION_MS,
        "cut a punctuation batch once its oldest event has waited MS ms",
        metavar="MS",
    )
    latency_target_ms: float = option(
        LATENCY_TARGET_MS,
        "size the work in flight so that outputs follow inputs within MS ms",
        metavar="MS",
    )
    max_chunk_events: int = option(
        CHUNK_EVENTS,
        "hand the team at most N events at once (whole punctuation batches; larger "
        "amortises per-chunk costs, smaller bounds the latency)",
        metavar="N",
    )
    key_type: str | None = option(
        None,
        "sl: the key type of its tables (default: its init state's key column: string, or "
        "int64 unless the keys are 0..K-1 in order, which is dense)",
        choices=KEY_TYPES,
    )
    max_keys: int | None = option(
        None,
        "most keys a table of natural keys holds (default: twice its init keys plus 2^16); "
        "reaching it fails the run",
        metavar="N",
    )
    checkpoint_dir: str | None = option(
        None,
        "write checkpoints to D: the run survives failures, and the same command run again "
        "after a crash resumes from the last checkpoint (default: none)",
        metavar="D",
    )
    checkpoint_every: int | None = option(
        None,
        "punctuation batches between checkpoints, each taken at the next chunk boundary once "
        "the previous one is written (default: 100; needs --checkpoint-dir)",
        metavar="B",
    )
    """Punctuation batches between checkpoints; needs a folder (with one, None means
    CHECKPOINT_EVERY, the effective value once validated)."""
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        checks = [
            (
                is_valid_name(self.topology),
                f"topology must be one of {', '.join(NAMED)} or module:function",
            ),
            (self.executors >= 1, "--executors must be >= 1"),
            (1 <= self.nodes <= MAX_NODES, f"--nodes must be between 1 and {MAX_NODES}"),
            (
                self.nodes == 1 or self.transport != "ray",
                "--nodes N > 1 runs each node's team as threads of a process on that node: "
                "it takes no --transport ray",
            ),
            (
                _among(self.placement, PLACEMENTS),
                f"--placement must be one of {', '.join(PLACEMENTS)}",
            ),
            (self.sockets is None or self.sockets >= 1, "--sockets must be >= 1"),
            (self.punctuation_interval >= 1, "--punctuation-interval must be >= 1"),
            (self.udf_cost_us >= 0, "--udf-cost-us must be >= 0"),
            (self.source in SOURCES, f"--source must be one of {', '.join(SOURCES)}"),
            (
                self.transport in TRANSPORTS,
                f"--transport must be one of {', '.join(TRANSPORTS)}",
            ),
            (
                self.transport != "threads" or not self.address,
                "--transport threads runs the team in this process: it takes no --address",
            ),
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
            (_among(self.key_type, KEY_TYPES), f"--key-type must be one of {', '.join(KEY_TYPES)}"),
            (self.max_keys is None or self.max_keys >= 1, "--max-keys must be >= 1"),
            (
                self.checkpoint_every is None or self.checkpoint_every >= 1,
                "--checkpoint-every must be >= 1",
            ),
            (
                self.checkpoint_every is None or self.checkpoint_dir is not None,
                "--checkpoint-every needs --checkpoint-dir",
            ),
            (self.log_level in LEVELS, f"--log-level must be one of {', '.join(LEVELS)}"),
            (
                self.metrics_port is None or 1 <= self.metrics_port <= 65535,
                "--metrics-port must be between 1 and 65535",
            ),
            (bool(self.metrics_host.strip()), "--metrics-host must not be empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        if self.scheduler not in SCHEDULERS:
            raise UsageError(
                f"unknown scheduler {self.scheduler!r}; choose one of {', '.join(SCHEDULERS)}"
            )
        if self.nodes > 1 and self.scheduler in ONE_NODE:
            raise UsageError(f"--scheduler {self.scheduler} does not run on several nodes")
        effective = self._scheduler_options()
        if self.checkpoint_dir is not None and self.checkpoint_every is None:
            effective["checkpoint_every"] = CHECKPOINT_EVERY
        for option, value in effective.items():
            object.__setattr__(self, option, value)

    def _scheduler_options(self) -> dict[str, str | None]:
        """The effective value of every option of `SCHEDULER_OPTIONS` (None where the
        scheduler does not honour it); a UsageError if one it does not honour is given."""
        honoured = HONOURED.get(self.scheduler, {})
        for option in SCHEDULER_OPTIONS:
            if option not in honoured and getattr(self, option) is not None:
                raise UsageError(f"--{option} does not apply to scheduler {self.scheduler!r}")
        return {o: getattr(self, o) or honoured.get(o) for o in SCHEDULER_OPTIONS}

    def as_dict(self) -> dict:
        """The configuration as JSON-ready values."""
        return asdict(self)

    @property
    def metrics_url(self) -> str | None:
        """Where the run serves its live metrics (None: it does not)."""
        if self.metrics_port is None:
            return None
        return metrics_url(self.metrics_host, self.metrics_port)


def metrics_url(host: str, port: int) -> str:
    """The URL of the live metrics served on ``host:port``."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def _among(value: str | None, choices: tuple[str, ...]) -> bool:
    return value is None or value in choices


def is_valid_name(name: str) -> bool:
    """A bundled topology name, or ``module:function`` naming a factory of one."""
    return name in NAMED or (":" in name and all(name.split(":", 1)))
