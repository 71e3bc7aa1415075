"""A soak you can watch: a session fed at a steady rate for minutes while its actors are
killed, its metrics scraped and its state queried; everything checked against a serial run.

One session (tstream on 2 executors, Ray actors, checkpoints every --checkpoint-every
punctuation batches, metrics served at --metrics-port) gets --rate events per second in
tenth-of-a-second slices for --minutes. Every second it is queried (a table's rows at its
watermark) and its ``/metrics`` scraped (read as `txstream top` reads them: events/s,
latency p50/p99 over that second, backlog, watermark, recoveries); the memory of its
processes (resident set of this driver and of the Ray workers it started) is sampled with
them. Every 10-60 s (--kill-every) one of its actors, picked at random among the team's
(executors, Sink, Coordinator, ProgressController), is SIGKILLed once the last recovery is
over.

Afterwards a serial session replays the same events, pushed in the same cuts as the
watermarks the queries were answered at: every answer must equal the serial state at its
watermark, and the outputs and final state the serial run's.

Written: bench/results/soak.json (the series, the kills, the recoveries, the checks) and
bench/results/soak.png (rate, latency, backlog and memory over time, the kills and
recoveries marked).

    python bench/soak.py [--minutes 2] [--rate 2000] [--topology sl] [--keys 1000]
        [--kill-every 10 60] [--seed 0] [--out bench/results/soak]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from common import RESULTS, bench_ray, write_results
from txstream import Job
from txstream.errors import UsageError
from txstream.monitor.top import Scrape, figures, parse, read
from txstream.topologies.generators import WorkloadSpec, generate

TAG = f"TXSTREAM_BENCH_SOAK={os.getpid()}"
"""In the environment of this benchmark's Ray workers: which processes are ours."""
TEAM = ("Executor", "Sink", "Coordinator", "ProgressController")
"""The team's actors, by the class Ray titles their process with (``ray::Sink``)."""
SLICE_S = 0.1
QUERY_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ours() -> dict[int, str]:
    """This benchmark's live Ray worker processes: pid -> title (``ray::Executor``...)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            ours = TAG.encode() in (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ours and title.startswith("ray::"):
            found[int(proc.name)] = title
    return found


def _team(processes: dict[int, str]) -> dict[int, str]:
    return {
        pid: title
        for pid, title in processes.items()
        if title.removeprefix("ray::").split(".")[0] in TEAM
    }


def _rss_mb(pids: list[int]) -> float:
    """Resident memory of ``pids`` (MB); shared pages (the object store, the state's
    shared memory) are counted in every process that maps them."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return round(total / 1e6, 1)


def soak(args: argparse.Namespace, events: pa.Table, init: dict, tmp: Path) -> dict:
    """The watched session: its series, kills, query answers and result."""
    rng = random.Random(args.seed)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    job = Job(
        args.topology,
        scheduler="tstream",
        executors=2,
        source="arrow",
        transport="ray",  # actors are processes, killed one by one
        progress=False,
        checkpoint_dir=str(tmp / "checkpoints"),
        checkpoint_every=args.checkpoint_every,
        metrics_port=port,
    )
    series: dict[str, list] = {
        k: []
        for k in (
            "t_s",
            "rate_eps",
            "latency_p50_ms",
            "latency_p99_ms",
            "backlog_events",
            "watermark_events",
            "recoveries",
            "memory_mb",
        )
    }
    kills, answers, recoveries = [], [], []
    per_slice = max(1, round(args.rate * SLICE_S))
    session = job.start(init, tmp / "out")
    with session:
        begin = time.monotonic()
        end = begin + args.minutes * 60
        next_kill = begin + rng.uniform(*args.kill_every)
        next_query = begin + QUERY_S
        pushed, previous = 0, None
        while (now := time.monotonic()) < end:
            due = min(len(events), (int((now - begin) / SLICE_S) + 1) * per_slice)
            if due > pushed:
                session.push(events.slice(pushed, due - pushed))
                pushed = due
            if now >= next_query:
                while next_query <= now:  # seconds a recovery held the loop up are skipped
                    next_query += QUERY_S
                answers.append(session.query(args.table))
                previous = _sample(series, url, previous, now - begin)
            for recovery in session.recoveries[len(recoveries) :]:
                if recovery["seconds"] is not None:  # recovered within the call just made
                    at = time.monotonic() - begin - recovery["seconds"]
                    recoveries.append({"t_s": round(at, 2), **recovery})
            if now >= next_kill and len(recoveries) == len(session.recoveries):
                kills.append(_kill(rng, now - begin, session.watermark))
                next_kill = now + rng.uniform(*args.kill_every)
            next_slice = begin + (pushed // per_slice) * SLICE_S
            time.sleep(max(0.0, min(next_slice, next_query) - time.monotonic()))
        result = session.close()
    return {
        "series": series,
        "kills": kills,
        "recoveries": recoveries,
        "answers": answers,
        "result": result,
        "pushed": pushed,
    }


def _sample(series: dict[str, list], url: str, previous: Scrape | None, t: float) -> Scrape:
    """One second's figures, read from the session's metrics as `txstream top` reads
    them, and the memory of its processes; the scrape (the next one's ``previous``). A
    scrape that fails (a recovery can hold one up) is skipped."""
    try:
        scrape = parse(read(url), time.monotonic())
    except (OSError, UsageError) as exc:
        print(f"  {t:6.1f} s: no scrape ({exc})")
        return previous
    shown = figures(scrape, previous)
    series["t_s"].append(round(t, 2))
    series["rate_eps"].append(shown.rate_eps)
    series["latency_p50_ms"].append(shown.recent_latency_ms.get("p50"))
    series["latency_p99_ms"].append(shown.recent_latency_ms.get("p99"))
    series["backlog_events"].append(shown.backlog)
    series["watermark_events"].append(shown.watermark)
    series["recoveries"].append(shown.recoveries)
    series["memory_mb"].append(_rss_mb([os.getpid(), *_ours()]))
    return scrape


def _kill(rng: random.Random, t: float, watermark: int) -> dict:
    """SIGKILL one of the team's actors, picked at random."""
    team = _team(_ours())
    pid = rng.choice(sorted(team))
    os.kill(pid, signal.SIGKILL)
    print(f"  {t:6.1f} s: killed {team[pid]} at watermark {watermark:,}")
    return {"t_s": round(t, 2), "actor": team[pid], "watermark": watermark}


def serial_check(args: argparse.Namespace, events: pa.Table, init: dict, watched: dict) -> dict:
    """A serial session over the same events, pushed in cuts at the watermarks the
    queries were answered at: how many answers, outputs and tables differ."""
    answers = watched["answers"]
    wrong_answers = 0
    job = Job(args.topology, scheduler="serial", source="arrow", progress=False)
    with job.start(init) as serial:
        done = 0
        for watermark, rows in sorted(answers, key=lambda a: a[0]):
            if watermark > done:
                serial.push(events.slice(done, watermark - done))
                done = watermark
            serial.flush()
            _, expected = serial.query(args.table)
            wrong_answers += not _same(rows, expected)
        serial.push(events.slice(done, watched["pushed"] - done))
        result = serial.close()
    got = watched["result"]
    return {
        "answers_checked": len(answers),
        "answers_wrong": wrong_answers,
        "outputs_equal": _same(got.events.sort_by("ts"), result.events.sort_by("ts")),
        "state_equal": all(
            _same(got.state[name].sort_by("key"), table.sort_by("key"))
            for name, table in result.state.items()
        ),
    }


def _same(got: pa.Table, expected: pa.Table) -> bool:
    """The same columns with the same values (whatever the chunks or the encoding)."""
    return got.column_names == expected.column_names and all(
        got.column(c).to_pylist() == expected.column(c).to_pylist() for c in got.column_names
    )


def plot(series: dict, kills: list[dict], recoveries: list[dict], path: Path) -> None:
    """Rate, latency, backlog and memory over time; kills and recoveries marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = series["t_s"]
    panels = (
        ("events/s", [("rate_eps", "decided")]),
        ("latency (ms)", [("latency_p50_ms", "p50"), ("latency_p99_ms", "p99")]),
        ("backlog (events)", [("backlog_events", "backlog")]),
        ("memory (MB, RSS)", [("memory_mb", "driver + Ray workers")]),
    )
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 9), sharex=True)
    for ax, (label, lines) in zip(axes, panels, strict=True):
        for key, name in lines:
            values = [float("nan") if v is None else v for v in series[key]]
            ax.plot(t, values, label=name)
        for i, kill in enumerate(kills):
            ax.axvline(
                kill["t_s"], color="#cc6677", linestyle="--", label="kill" if i == 0 else None
            )
        for i, recovery in enumerate(recoveries):
            ax.axvspan(
                recovery["t_s"],
                recovery["t_s"] + (recovery.get("seconds") or 0),
                color="#cc6677",
                alpha=0.2,
                label="recovery" if i == 0 else None,
            )
        ax.set_ylabel(label)
        ax.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("seconds since the session started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--rate", type=int, default=2000, help="events pushed per second")
    parser.add_argument("--topology", default="sl")
    parser.add_argument("--table", default="accounts", help="the table queried every second")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--kill-every", nargs=2, type=float, default=[10.0, 60.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "soak")
    args = parser.parse_args()
    os.environ[TAG.split("=")[0]] = TAG.split("=")[1]  # inherited by Ray's workers
    total = int(args.rate * args.minutes * 60) + args.rate
    events, init = generate(
        args.topology, WorkloadSpec(events=total, keys=args.keys, seed=args.seed)
    )
    load = [round(x, 2) for x in os.getloadavg()]
    with bench_ray(), tempfile.TemporaryDirectory(prefix="txstream_bench_") as tmp:
        print(f"soak: {args.topology} at {args.rate:,} events/s for {args.minutes:g} min")
        watched = soak(args, events, init, Path(tmp))
        print("soak: the serial run")
        check = serial_check(args, events, init, watched)
    results = {
        "topology": args.topology,
        "scheduler": "tstream",
        "executors": 2,
        "rate_eps": args.rate,
        "minutes": args.minutes,
        "keys": args.keys,
        "checkpoint_every": args.checkpoint_every,
        "kill_every_s": args.kill_every,
        "seed": args.seed,
        "events": watched["pushed"],
        "load_before": load,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "kills": watched["kills"],
        "recoveries": watched["recoveries"],
        "check": check,
        "series": watched["series"],
        "startup_s": watched["result"].metrics["startup_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    path = write_results(args.out.name, results, args.out.parent)
    plot(watched["series"], watched["kills"], watched["recoveries"], args.out.with_suffix(".png"))
    print(f"soak: {check} -> {path}")
    if check["answers_wrong"] or not check["outputs_equal"] or not check["state_equal"]:
        raise SystemExit("soak: the session's answers or outputs differ from the serial run's")


if __name__ == "__main__":
    main()
