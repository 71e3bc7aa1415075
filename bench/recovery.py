"""The cost of checkpoints, and the time to recover from a killed executor.

Two cases, tstream on 2 executors, input read with pyarrow: SL at --udf-cost-us 0 and GS
at 10. Per case:

* throughput: one-shot runs (`Job.run` into an output folder) without checkpoints and
  with a checkpoint folder every 1, 10 and 100 punctuation batches, taken in turns
  (--rounds rounds of all four, after one run not counted), so that load on the shared
  machine hits every interval alike; `ratio` divides the median events/s with
  checkpoints by the median without.
* recovery: per interval, a session pushing the events (the Parquet file); a watcher
  thread SIGKILLs one executor's process once the watermark passes --kill-at of the
  events, then samples the watermark and the session's `recoveries`. Figures, from the
  kill: `detected_s` (the session starts recovering), `recovered_s` (its new team is up:
  the recovery's own `seconds` end there), `processing_s` (the watermark moves again,
  above the checkpoint's ts), `caught_up_s` (back to the watermark at the kill);
  `replay_s` = caught up - recovered, the replay of the events between the checkpoint
  and the kill (0 when a checkpoint was copied after the watermark read at the kill),
  and `replay_share` its part of kill to caught up. Each recovery's own phases
  (`stop_s`, `restore_s`, `launch_s`) are in `recoveries`.

Ray's start-up is outside every figure (one Ray for the whole benchmark). The load
average (`uptime`) before and after is in the JSON: the machine is shared.

    python bench/recovery.py [--sl-events 3000000] [--gs-events 300000] [--rounds 2]
        [--intervals 1 10 100] [--kill-at 0.5] [--out bench/results/recovery.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import RESULTS, bench_ray, workload_dirs, write_results
from txstream import Job

TAG = f"TXSTREAM_BENCH_RECOVERY={os.getpid()}"
"""In the environment of this benchmark's Ray workers: which executors are ours to kill."""
SAMPLE_S = 0.001


def _job(topology: str, cost: float, every: int | None, ckpt: Path | None) -> Job:
    checkpoints = {} if ckpt is None else {"checkpoint_dir": str(ckpt), "checkpoint_every": every}
    return Job(
        topology,
        scheduler="tstream",
        executors=2,
        udf_cost_us=cost,
        source="arrow",
        transport="ray",  # an executor's process is killed
        progress=False,
        **checkpoints,
    )


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def throughput(topology: str, cost: float, folder: Path, intervals: list[int], rounds: int) -> dict:
    """Events/s without checkpoints and per interval, in turns; ratios of medians."""
    runs: dict[str, list[dict]] = {"none": [], **{str(i): [] for i in intervals}}
    with tempfile.TemporaryDirectory(prefix="txstream_bench_") as tmp:  # numba caches, page cache
        _job(topology, cost, None, None).run(
            folder / "events.parquet", folder / "init", Path(tmp) / "out"
        )
    for _ in range(rounds):
        for every in [None, *intervals]:
            with tempfile.TemporaryDirectory(prefix="txstream_bench_") as tmp:
                ckpt = None if every is None else Path(tmp) / "ckpt"
                job = _job(topology, cost, every, ckpt)
                m = job.run(folder / "events.parquet", folder / "init", Path(tmp) / "out").metrics
            key = "none" if every is None else str(every)
            runs[key].append(
                {
                    "throughput_eps": m["throughput_eps"],
                    "seconds": m["seconds"],
                    "checkpoints": m["checkpoints"],
                    "load": _load(),
                }
            )
            print(
                f"  {topology} C={cost:g} every={key:>4}: {m['throughput_eps']:>10,.0f} ev/s"
                f"  checkpoints {m['checkpoints']}"
            )
    medians = {k: statistics.median(r["throughput_eps"] for r in v) for k, v in runs.items()}
    return {
        "median_eps": medians,
        "ratio": {k: round(v / medians["none"], 3) for k, v in medians.items() if k != "none"},
        "runs": runs,
    }


def _our_executors() -> list[int]:
    """Pids of this benchmark's live executor processes (Ray titles them ray::Executor)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0]
            ours = TAG.encode() in (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ours and (title == b"ray::Executor" or title.startswith(b"ray::Executor.")):
            pids.append(int(proc.name))
    return pids


class Watcher(threading.Thread):
    """Kills one executor once the watermark passes ``kill_at`` events, then times the
    recovery on the session's watermark and `recoveries` (see module docstring)."""

    def __init__(self, session, kill_at: int):
        super().__init__(name="watcher", daemon=True)
        self.session, self.kill_at = session, kill_at
        self.done = threading.Event()
        self.times: dict[str, float] = {}
        self.killed_at_watermark: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _mark(self, name: str, now: float) -> None:
        self.times.setdefault(name, now - self.times["kill"] if name != "kill" else now)

    def _watch(self) -> None:
        s = self.session
        while s.watermark < self.kill_at and not self.done.is_set():
            time.sleep(SAMPLE_S)
        if self.done.is_set():
            return
        pids = _our_executors()
        self.killed_at_watermark = s.watermark
        self._mark("kill", time.perf_counter())
        os.kill(pids[-1], signal.SIGKILL)
        while not self.done.is_set():
            now = time.perf_counter()
            recovery = s.recoveries[-1] if s.recoveries else None
            if recovery is not None:
                self._mark("detected_s", now)
                if recovery["seconds"] is not None:
                    self._mark("recovered_s", now)
                    if s.watermark > recovery["from_ts"]:
                        self._mark("processing_s", now)
                    if s.watermark >= self.killed_at_watermark:
                        self._mark("caught_up_s", now)
                    if "processing_s" in self.times and "caught_up_s" in self.times:
                        return
            time.sleep(SAMPLE_S)


def recovery(topology: str, cost: float, folder: Path, every: int, kill_at: float) -> dict:
    """One session with one executor killed; its timeline (see module docstring)."""
    with tempfile.TemporaryDirectory(prefix="txstream_bench_") as tmp:
        job = _job(topology, cost, every, Path(tmp) / "ckpt")
        session = job.start(folder / "init", Path(tmp) / "out")
        events = folder / "events.parquet"
        with session:
            session.push(events)
            watcher = Watcher(session, int(kill_at * session.pushed))
            watcher.start()
            session.flush()  # the watermark lives until close: stop the watcher before
            watcher.done.set()
            watcher.join()
            result = session.close()
    if watcher.error is not None:
        raise watcher.error
    times = {k: round(v, 3) for k, v in watcher.times.items() if k != "kill"}
    recoveries = result.metrics["recoveries"]
    row = {
        "every": every,
        "events": result.metrics["events"],
        "killed_at_watermark": watcher.killed_at_watermark,
        "from_ts": recoveries[0]["from_ts"] if recoveries else None,
        "recoveries": recoveries,
        **times,
        "load": _load(),
    }
    if "caught_up_s" in times and "recovered_s" in times:
        row["replayed_events"] = max(0, row["killed_at_watermark"] - row["from_ts"])
        row["replay_s"] = round(times["caught_up_s"] - times["recovered_s"], 3)
        row["replay_share"] = round(row["replay_s"] / times["caught_up_s"], 3)
    row["phases_s"] = result.metrics["phases_s"]
    print(
        f"  {topology} C={cost:g} every={every:>4}: "
        + ", ".join(
            f"{k} {row.get(k)}"
            for k in (
                "killed_at_watermark",
                "from_ts",
                "detected_s",
                "recovered_s",
                "processing_s",
                "caught_up_s",
                "replay_s",
            )
        )
    )
    return row


def plot(cases: list[dict], path: Path) -> None:
    """Per case: (a) events/s without checkpoints and per interval, (b) seconds from the
    kill to each mark of the recovery, per interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(cases), 2, figsize=(12, 4.2 * len(cases)), squeeze=False)
    for (bar_ax, rec_ax), case in zip(axes, cases, strict=True):
        title = f"{case['topology']} C = {case['udf_cost_us']:g} us, tstream x2"
        medians = case["throughput"]["median_eps"]
        labels = list(medians)
        bar_ax.bar(range(len(labels)), [medians[k] for k in labels])
        for i, k in enumerate(labels[1:], start=1):
            ratio = case["throughput"]["ratio"][k]
            bar_ax.text(i, medians[k], f"{ratio:.2f}x", ha="center", va="bottom", fontsize=8)
        bar_ax.set_xticks(
            range(len(labels)), ["no checkpoints", *(f"every {k}" for k in labels[1:])]
        )
        bar_ax.set(ylabel="events/s (median)", title=f"(a) throughput, {title}")
        rows = case["recovery"]
        marks = ("detected_s", "recovered_s", "processing_s", "caught_up_s")
        for j, mark in enumerate(marks):
            xs = [i + (j - 1.5) * 0.2 for i in range(len(rows))]
            rec_ax.bar(xs, [r.get(mark) or 0 for r in rows], width=0.2, label=mark[:-2])
        rec_ax.axhline(5, color="grey", linestyle=":", label="5 s")
        rec_ax.set_xticks(range(len(rows)), [f"every {r['every']}" for r in rows])
        rec_ax.set(ylabel="seconds after the kill", title=f"(b) recovery, {title}")
        rec_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sl-events", type=int, default=3_000_000)
    parser.add_argument("--gs-events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2, help="turns of every interval")
    parser.add_argument("--intervals", nargs="+", type=int, default=[1, 10, 100])
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of the events")
    parser.add_argument("--out", type=Path, default=RESULTS / "recovery.json")
    args = parser.parse_args()
    os.environ[TAG.split("=")[0]] = TAG.split("=")[1]  # inherited by Ray's workers
    knobs = {"theta": 0.2, "abort_ratio": 0.01}
    load_before = _load()
    cases = []
    with bench_ray():
        for topology, cost, events in (("sl", 0.0, args.sl_events), ("gs", 10.0, args.gs_events)):
            with workload_dirs([topology], events, **knobs) as dirs:
                folder = dirs[topology]
                print(f"{topology}: throughput")
                case = {
                    "topology": topology,
                    "udf_cost_us": cost,
                    "events": events,
                    "throughput": throughput(topology, cost, folder, args.intervals, args.rounds),
                }
                print(f"{topology}: recovery")
                case["recovery"] = [
                    recovery(topology, cost, folder, every, args.kill_at)
                    for every in args.intervals
                ]
                cases.append(case)
    results = {
        "scheduler": "tstream",
        "executors": 2,
        "source": "arrow",
        "workload": knobs,
        "rounds": args.rounds,
        "kill_at": args.kill_at,
        "load_before": load_before,
        "load_after": _load(),
        "cases": cases,
    }
    path = write_results(args.out.stem, results, args.out.parent)
    plot(cases, path.with_suffix(".png"))
    print("->", path, "and", path.with_suffix(".png"))


if __name__ == "__main__":
    main()
