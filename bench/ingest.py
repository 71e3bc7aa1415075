"""Events/s from Parquet through Spark/RayDP into txstream (SL, every scheduler built).

Spark start-up is measured and reported apart; ingestion = `spark.staging_s` (planning the
input in Spark) + the engine run (Spark's Arrow conversion, fetching partitions in order,
executing, writing outputs; conversion and execution overlap when the input has several
Spark partitions). Two inputs hold the same events: the generator's single file (one row
group, so one Spark partition) and the same rows as 8 files. The first run warms Spark's
JIT up and is reported apart. Peak RSS is sampled over the process tree (driver, Ray,
Spark JVMs; the shared object store is counted once per process that maps it, so the sum
overstates).

    python bench/ingest.py [--events 1000000] [--repeat 5] [--schedulers serial ...] [--name ingest]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psutil
import pyarrow.parquet as pq
from common import bench_ray, workload_dirs, write_results
from txstream import Job
from txstream.connectors.spark import ray_job_config, spark_session
from txstream.schedulers import SCHEDULERS

SPLIT_FILES = 8


class TreeRss:
    """Peak RSS summed over this process and all its descendants, sampled in a thread."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.peak_mib = self.peak_java_mib = 0.0
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        root = psutil.Process()
        while not self._stop.wait(self._every_s):
            total = java = 0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    rss = proc.memory_info().rss
                    total += rss
                    java += rss if proc.name() == "java" else 0
                except psutil.NoSuchProcess:
                    continue
            self.peak_mib = max(self.peak_mib, total / 2**20)
            self.peak_java_mib = max(self.peak_java_mib, java / 2**20)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()


def _run(events, init, scheduler: str, label: str, attempt: int) -> dict:
    job = Job("sl", scheduler=scheduler, source="spark", progress=False)
    m = job.run(events, init).metrics
    ingest_s = m["spark"]["staging_s"] + m["seconds"]
    row = {
        "scheduler": scheduler,
        "input": label,
        "attempt": attempt,
        "events": m["events"],
        "staging_s": m["spark"]["staging_s"],
        "engine_s": m["seconds"],
        "ingest_eps": round(m["events"] / ingest_s, 1),
        "engine_eps": m["throughput_eps"],
    }
    print(
        f"{scheduler}, {label} #{attempt}: staging {row['staging_s']:.2f} s"
        f" + engine {row['engine_s']:.2f} s"
        f" = {row['ingest_eps']:,.0f} events/s ingested"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs per input after warm-up")
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    parser.add_argument("--name", default="ingest", help="results file bench/results/NAME.json")
    args = parser.parse_args()
    rss = TreeRss()
    with workload_dirs(["sl"], args.events) as dirs, bench_ray(job_config=ray_job_config()):
        folder = dirs["sl"]
        table = pq.read_table(folder / "events.parquet")
        split = folder / "split"
        split.mkdir()
        step = -(-table.num_rows // SPLIT_FILES)
        for index in range(SPLIT_FILES):
            pq.write_table(table.slice(index * step, step), split / f"part-{index}.parquet")
        inputs = {"one file": folder / "events.parquet", f"{SPLIT_FILES} files": split}
        begin = time.perf_counter()
        with spark_session():
            spark_startup = time.perf_counter() - begin
            print(f"Spark/RayDP start-up: {spark_startup:.1f} s")
            warmup = _run(split, folder / "init", args.schedulers[0], "warm-up", 0)
            rows = [
                _run(path, folder / "init", scheduler, label, attempt)
                for attempt in range(args.repeat)
                for scheduler in args.schedulers
                for label, path in inputs.items()
            ]
    rss.stop()
    summary = {}
    for scheduler in args.schedulers:
        for label in inputs:
            eps = [
                r["ingest_eps"] for r in rows if (r["scheduler"], r["input"]) == (scheduler, label)
            ]
            best, median = max(eps), statistics.median(eps)
            summary[f"{scheduler}, {label}"] = {"best_eps": best, "median_eps": median}
            print(f"{scheduler}, {label}: best {best:,.0f}, median {median:,.0f} events/s")
    print(f"peak RSS: {rss.peak_mib:,.0f} MiB (JVMs {rss.peak_java_mib:,.0f} MiB)")
    path = write_results(
        args.name,
        {
            "events": args.events,
            "spark_startup_s": round(spark_startup, 2),
            "summary": summary,
            "warmup": warmup,
            "rows": rows,
            "peak_rss_mib": round(rss.peak_mib),
            "peak_java_rss_mib": round(rss.peak_java_mib),
        },
    )
    print("->", path)


if __name__ == "__main__":
    main()
