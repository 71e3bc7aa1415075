"""A run's report: one self-contained HTML page with plots of its metrics.json.

What a user of a stream processor looks at: events/s and latency over time (the
``timeline``, in bins as fine as the run's length allows), where each executor's time went
(the papers' breakdown), the decisions morphstream took per batch, and the checkpoints and
recoveries. The plots are inline SVG
drawn by matplotlib (no script, no file beside the page), so the page opens anywhere and
can be mailed as it is.
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import Any

from txstream.errors import UsageError

METRICS_FILE = "metrics.json"
REPORT_FILE = "report.html"
_BREAKDOWN = ("useful", "sync", "lock", "construct", "explore", "abort")
_DECISIONS = ("explore", "granularity", "abort")
_WIDTH_IN, _HEIGHT_IN = 8.0, 3.0

_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { padding: 0.2em 1em 0.2em 0; text-align: left; }
figure { margin: 1.5em 0; }
figcaption { font-weight: bold; margin-bottom: 0.3em; }
"""


def read_metrics(output: str | Path) -> dict[str, Any]:
    """The metrics.json of the output folder ``output`` (or that file itself); a
    `UsageError` naming the path when there is none or it is not a run's metrics."""
    path = Path(output)
    if path.is_dir():
        path = path / METRICS_FILE
    try:
        metrics = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"report: no {METRICS_FILE} at {path} (has the run committed?)") from exc
    except (OSError, ValueError) as exc:
        raise UsageError(f"report: cannot read {path}: {exc}") from exc
    if not isinstance(metrics, dict) or "events" not in metrics:
        raise UsageError(f"report: {path} is not the metrics of a txstream run")
    return metrics


def render(metrics: dict[str, Any]) -> str:
    """The report of a run with these metrics, as one HTML page."""
    config = metrics.get("config", {})
    title = f"txstream: {config.get('topology', '?')} {config.get('scheduler', '?')}"
    figures = [
        ("throughput", "Events per second", _throughput),
        ("latency", "Latency from arrival to output", _latency),
        ("breakdown", "Time breakdown per executor", _breakdown),
    ]
    if metrics.get("decision_batches"):
        figures.append(("decisions", "morphstream's decisions per batch", _decisions))
    figures.append(("recovery", "Checkpoints and recoveries", _recovery))
    body = [f"<h1>{html.escape(title)}</h1>", _summary(metrics)]
    for key, caption, draw in figures:
        body.append(
            f'<figure class="plot" id="{key}"><figcaption>{html.escape(caption)}'
            f"</figcaption>{_svg(draw, metrics)}</figure>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_report(metrics: dict[str, Any], path: str | Path) -> Path:
    """Write the report of ``metrics`` to ``path``; the path."""
    path = Path(path)
    try:
        path.write_text(render(metrics), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"report: cannot write {path}: {exc.strerror or exc}") from exc
    return path


def _summary(m: dict[str, Any]) -> str:
    latency = m.get("latency_ms") or {}
    rows = [
        (
            "events",
            f"{m['events']:,} ({m.get('committed', 0):,} committed, "
            f"{m.get('aborted', 0):,} aborted, {m.get('rejected', 0):,} rejected)",
        ),
        ("seconds", f"{m.get('seconds', 0):.2f} s after {m.get('startup_s', 0):.1f} s of start-up"),
        ("throughput", f"{m.get('throughput_eps') or 0:,.0f} events/s"),
        ("latency", f"p50 {latency.get('p50')} ms, p99 {latency.get('p99')} ms"),
        ("resumed at event", f"{(m.get('config') or {}).get('resumed_from') or 0:,}"),
    ]
    if m.get("table_rows"):  # of a table of natural keys, the keys that exist at the end
        tables = ", ".join(f"{name} {rows:,}" for name, rows in m["table_rows"].items())
        rows.append(("rows per table", tables))
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _svg(draw, metrics: dict[str, Any]) -> str:
    """One plot as inline SVG (matplotlib's Figure, no global pyplot state)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN), layout="constrained")
    draw(figure, metrics)
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _timeline(m: dict[str, Any]) -> dict[str, Any]:
    """The run's timeline; a metrics.json written before its bins followed the run's
    length has bins of one second."""
    series = m.get("timeline") or {
        "second": [],
        "events": [],
        "latency_p50_ms": [],
        "latency_p99_ms": [],
    }
    return {"bin_s": 1.0, **series}


def _throughput(figure, m: dict[str, Any]) -> None:
    axes = figure.add_subplot()
    series = _timeline(m)
    width = series["bin_s"]
    rates = [events / width for events in series["events"]]
    axes.bar(series["second"], rates, width=width, align="edge", color="#4477aa")
    axes.axhline(
        m.get("throughput_eps") or 0, color="#cc6677", linestyle="--", label="the run's mean"
    )
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel(f"events out per second (bins of {_duration(width)})")
    axes.legend(loc="lower right")


def _latency(figure, m: dict[str, Any]) -> None:
    axes = figure.add_subplot()
    series = _timeline(m)
    middles = [second + series["bin_s"] / 2 for second in series["second"]]
    axes.plot(middles, series["latency_p50_ms"], marker=".", label="p50")
    axes.plot(middles, series["latency_p99_ms"], marker=".", label="p99")
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("latency (ms)")
    axes.legend(loc="upper right")


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:g} s"


def _breakdown(figure, m: dict[str, Any]) -> None:
    axes = figure.add_subplot()
    executors = m.get("breakdown_per_executor_s") or [m.get("breakdown_s") or {}]
    names = [f"executor {i}" for i in range(len(executors))]
    left = [0.0] * len(executors)
    for activity in _BREAKDOWN:
        widths = [e.get(activity, 0.0) for e in executors]
        axes.barh(names, widths, left=left, label=activity)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.invert_yaxis()
    axes.set_xlabel("seconds")
    axes.legend(loc="lower right", ncols=3, fontsize="small")


def _decisions(figure, m: dict[str, Any]) -> None:
    batches = m["decision_batches"]
    axes = figure.subplots(len(_DECISIONS), 1, sharex=True)
    for ax, dimension in zip(axes, _DECISIONS, strict=True):
        chosen = batches.get(dimension) or []
        values = sorted(set(chosen))
        ax.scatter(range(len(chosen)), [values.index(v) for v in chosen], marker="|", s=80)
        ax.set_yticks(range(len(values)), values)
        ax.set_ylabel(dimension, rotation=0, ha="right", va="center")
        ax.set_ylim(-0.5, max(len(values) - 0.5, 0.5))
    axes[-1].set_xlabel("punctuation batch")


def _recovery(figure, m: dict[str, Any]) -> None:
    axes = figure.add_subplot()
    recoveries = m.get("recoveries") or []
    checkpoints = m.get("checkpoints") or {}
    config = m.get("config") or {}
    axes.bar(
        [r.get("watermark", 0) for r in recoveries],
        [r.get("seconds", 0) for r in recoveries],
        width=max(1, m["events"] / 100),
        color="#cc6677",
        label="recovery (its seconds)",
    )
    if config.get("resumed_from"):
        axes.axvline(
            config["resumed_from"],
            color="#4477aa",
            linestyle="--",
            label="resumed from a checkpoint",
        )
    axes.set_xlim(0, max(1, m["events"]))
    axes.set_xlabel("events (watermark when the failure was met)")
    axes.set_ylabel("seconds to recover")
    written = checkpoints.get("written", 0)
    axes.set_title(
        f"{written} checkpoint(s) written in {checkpoints.get('seconds', 0)} s; "
        f"{len(recoveries)} recovery(ies)",
        fontsize="medium",
    )
    if recoveries or config.get("resumed_from"):
        axes.legend(loc="upper right")
