"""`txstream top`: a running run's figures, live in the terminal, read from its ``/metrics``.

What an operator asks of a stream processor while it runs - is it keeping up, how far
behind is it, is latency growing, did it recover - answered from the same Prometheus
metrics a Prometheus server scrapes (`prometheus_client`'s parser reads them, `rich` draws
them), so the view needs nothing of the run but its metrics address. Rates and the recent
latency come from the change between two scrapes a second apart, as Prometheus' ``rate``
and ``histogram_quantile`` compute them.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from txstream.errors import UsageError

REFRESH_S = 1.0
"""How often the view reads the metrics again."""
SCRAPE_TIMEOUT_S = 5.0
"""How long one read of the metrics may take before the view says it is waiting."""

Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    """One read of a run's metrics: each sample's value by its name and labels."""

    at: float
    """When it was read (`time.monotonic`)."""
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def value(self, name: str, default: float | None = None, **labels: str) -> float | None:
        """The sum of the samples named ``name`` whose labels include ``labels``."""
        found = [v for k, v in self.samples.get(name, {}).items() if set(labels.items()) <= set(k)]
        return math.fsum(found) if found else default

    def by(self, name: str, label: str) -> dict[str, float]:
        """The samples named ``name`` summed by the value of their label ``label``."""
        sums: dict[str, float] = defaultdict(float)
        for key, v in self.samples.get(name, {}).items():
            sums[dict(key).get(label, "")] += v
        return dict(sums)

    def label(self, name: str) -> str | None:
        """The value of label ``name`` on the run's samples (the run, its topology)."""
        for series in self.samples.values():
            for key in series:
                if name in dict(key):
                    return dict(key)[name]
        return None


def parse(text: str, at: float) -> Scrape:
    """The samples of a Prometheus text exposition; `UsageError` if it holds none of a
    txstream run (another program's metrics, a page that is not metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    scrape = Scrape(at)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted(sample.labels.items()))
                scrape.samples.setdefault(sample.name, {})[labels] = sample.value
    except ValueError as exc:
        raise UsageError(f"top: not Prometheus metrics: {exc}") from exc
    # any of a run's samples, not a given one: a starting run serves only up and ready
    if not any(name.startswith("txstream_") for name in scrape.samples):
        raise UsageError("top: these are not the metrics of a txstream run")
    return scrape


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a histogram given as (upper bound, cumulative count) pairs,
    interpolated linearly within its bucket as Prometheus' ``histogram_quantile`` does;
    None without observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _buckets(scrape: Scrape, name: str) -> dict[float, float]:
    return {float(le): v for le, v in scrape.by(f"{name}_bucket", "le").items()}


@dataclass
class Figures:
    """What the view shows of a run, from one scrape and the one before it."""

    run: str
    topology: str
    pushed: float
    decided: dict[str, float]
    watermark: float | None
    backlog: float | None
    recoveries: float
    checkpoints: float
    checkpoint_age_s: float | None
    ready: bool | None
    rate_eps: float | None = None
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    recent_latency_ms: dict[str, float | None] = field(default_factory=dict)
    executors: dict[str, dict[str, float]] = field(default_factory=dict)


LATENCY = "txstream_latency_seconds"
EXECUTOR_SECONDS = "txstream_executor_seconds_total"
QUANTILES = {"p50": 0.5, "p99": 0.99}
WAITING = "sync"
"""The activity in which an executor waits for the others: not part of its busy share."""


def figures(now: Scrape, before: Scrape | None) -> Figures:
    """The view's figures: totals from ``now``; rates, the recent latency and the
    executors' utilisation from the change since ``before``."""
    latency = _buckets(now, LATENCY)
    shown = Figures(
        run=now.label("run") or "?",
        topology=now.label("topology") or "?",
        pushed=now.value("txstream_events_pushed_total", 0.0),
        decided=now.by("txstream_events_total", "status"),
        watermark=now.value("txstream_watermark_events"),
        backlog=now.value("txstream_backlog_events"),
        recoveries=now.value("txstream_recoveries_total", 0.0),
        checkpoints=now.value("txstream_checkpoints_total", 0.0),
        checkpoint_age_s=now.value("txstream_checkpoint_age_seconds"),
        ready=_ready(now),
        latency_ms=_quantiles_ms(latency.items()),
    )
    if before is None or now.at <= before.at or "txstream_events_total" not in before.samples:
        return shown
    dt = now.at - before.at
    decided = now.value("txstream_events_total", 0.0) - before.value("txstream_events_total", 0.0)
    shown.rate_eps = max(decided, 0.0) / dt
    earlier = _buckets(before, LATENCY)
    shown.recent_latency_ms = _quantiles_ms(
        (le, count - earlier.get(le, 0.0)) for le, count in latency.items()
    )
    busy_now, busy_before = _executor_seconds(now), _executor_seconds(before)
    for executor, activities in busy_now.items():
        previous = busy_before.get(executor, {})
        shown.executors[executor] = {
            activity: max(seconds - previous.get(activity, 0.0), 0.0) / dt
            for activity, seconds in activities.items()
        }
    return shown


def _quantiles_ms(buckets: Iterable[tuple[float, float]]) -> dict[str, float | None]:
    buckets = list(buckets)
    out: dict[str, float | None] = {}
    for name, q in QUANTILES.items():
        seconds = quantile(q, buckets)
        out[name] = None if seconds is None else seconds * 1e3
    return out


def _ready(scrape: Scrape) -> bool | None:
    value = scrape.value("txstream_ready")
    return None if value is None else value > 0


def _executor_seconds(scrape: Scrape) -> dict[str, dict[str, float]]:
    """Each executor's seconds by activity (useful, sync, lock, construct, ...)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for key, v in scrape.samples.get(EXECUTOR_SECONDS, {}).items():
        labels = dict(key)
        out[labels.get("executor", "?")][labels.get("activity", "?")] = v
    return dict(sorted(out.items(), key=lambda item: _number_first(item[0])))


def _number_first(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def render(shown: Figures, url: str, waiting_s: float = 0.0):
    """The view of ``shown`` as a `rich` renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    state = {True: "ready", False: "starting or recovering", None: "-"}[shown.ready]
    title = f"txstream top: run {shown.run} ({shown.topology}) at {url}"
    if waiting_s:
        title += f"  [no answer for {waiting_s:.0f} s]"
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rate = "-" if shown.rate_eps is None else f"{shown.rate_eps:,.0f} events/s"
    recent, whole = shown.recent_latency_ms, shown.latency_ms
    decided = ", ".join(f"{k} {_count(v)}" for k, v in sorted(shown.decided.items()))
    rows = [
        ("rate", rate),
        ("latency p50 / p99 (last s)", f"{_ms(recent.get('p50'))} / {_ms(recent.get('p99'))}"),
        ("latency p50 / p99 (run)", f"{_ms(whole.get('p50'))} / {_ms(whole.get('p99'))}"),
        ("watermark", f"{_count(shown.watermark)} events"),
        ("backlog", f"{_count(shown.backlog)} events"),
        ("pushed", f"{_count(shown.pushed)} events"),
        ("decided", decided or "-"),
        ("checkpoints", f"{_count(shown.checkpoints)}, newest {_age(shown.checkpoint_age_s)}"),
        ("recoveries", _count(shown.recoveries)),
        ("state", state),
    ]
    for name, value in rows:
        table.add_row(name, value)
    parts = [Text(title, style="bold"), table]
    if shown.executors:
        activities = list(dict.fromkeys(a for e in shown.executors.values() for a in e))
        executors = Table()
        executors.add_column("executor (share of the last second)")
        for activity in ["busy", *activities]:
            executors.add_column(activity, justify="right")
        for executor, shares in shown.executors.items():
            busy = math.fsum(v for a, v in shares.items() if a != WAITING)
            cells = [f"{busy:.0%}", *(f"{shares.get(a, 0.0):.0%}" for a in activities)]
            executors.add_row(executor, *cells)
        parts.append(executors)
    return Group(*parts)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None or seconds < 0 else f"{seconds:,.0f} s ago"


class Gone(Exception):
    """The run's metrics stopped answering after they had answered: the run ended."""

    def __init__(self, reason: str, last: Figures):
        super().__init__(reason)
        self.last = last


def read(url: str) -> str:
    """The text at ``url``: `TimeoutError` if it takes too long; another `OSError` if
    nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
            return answer.read().decode("utf-8", errors="replace")
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise exc.reason from exc
        raise


def first_scrape(url: str) -> Scrape:
    """The run's metrics at ``url``, read once: `UsageError` if ``url`` is not one."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"top: {url} is not an http:// address of a run's metrics")
    try:
        return parse(read(url), time.monotonic())
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise UsageError(f"top: no run's metrics at {url}: {reason}") from exc


def watch(
    url: str,
    console=None,
    refresh_s: float = REFRESH_S,
    until: Callable[[], bool] = lambda: False,
) -> Figures:
    """Show the run's figures at ``url`` in place, read again every ``refresh_s``, until
    Ctrl-C or ``until()``; the last figures. `Gone` when the run stops answering."""
    from rich.live import Live

    before, now = None, first_scrape(url)
    shown = figures(now, before)
    waiting_since: float | None = None
    with Live(render(shown, url), console=console, auto_refresh=False) as live:
        try:
            while not until():
                time.sleep(max(0.0, now.at + refresh_s - time.monotonic()))
                try:
                    scrape = parse(read(url), time.monotonic())
                except TimeoutError:
                    waiting_since = waiting_since or time.monotonic()
                    live.update(render(shown, url, time.monotonic() - waiting_since), refresh=True)
                    continue
                except (OSError, UsageError) as exc:
                    raise Gone(str(getattr(exc, "reason", None) or exc), shown) from exc
                waiting_since = None
                before, now = now, scrape
                shown = figures(now, before)
                live.update(render(shown, url), refresh=True)
        except KeyboardInterrupt:
            pass
    return shown
