"""Events/s from a Parquet file through Spark/RayDP into txstream (SL).

Spark start-up is measured and reported apart; ingestion = staging the input in Spark
(input positions, range partitioning, Arrow on the executor's disk) + the engine run
(fetching partitions in order, executing, writing outputs). Peak RSS is sampled over
the process tree (driver, Ray, Spark JVMs; the shared object store is counted once per
process that maps it, so the sum overstates).

    python bench/ingest.py [--events 1000000] [--schedulers serial]
"""

from __future__ import annotations

import argparse
import threading

import psutil
from common import bench_ray, workload_dirs, write_results
from txstream import Job
from txstream.cluster.spark import ray_job_config, spark_session
from txstream.schedulers import SCHEDULERS


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="runs per scheduler (best kept)")
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    args = parser.parse_args()
    rss = TreeRss()
    rows = []
    with workload_dirs(["sl"], args.events) as dirs, bench_ray(job_config=ray_job_config()):
        import time

        begin = time.perf_counter()
        with spark_session():
            spark_startup = time.perf_counter() - begin
            print(f"Spark/RayDP start-up: {spark_startup:.1f} s")
            folder = dirs["sl"]
            for scheduler in args.schedulers:
                for attempt in range(args.repeat):
                    m = (
                        Job("sl", scheduler=scheduler, source="spark", progress=False)
                        .run(folder / "events.parquet", folder / "init")
                        .metrics
                    )
                    ingest_s = m["spark"]["staging_s"] + m["seconds"]
                    row = {
                        "scheduler": scheduler, "attempt": attempt, "events": m["events"],
                        "staging_s": m["spark"]["staging_s"], "engine_s": m["seconds"],
                        "ingest_eps": round(m["events"] / ingest_s, 1),
                        "engine_eps": m["throughput_eps"],
                    }  # fmt: skip
                    rows.append(row)
                    print(
                        f"{scheduler} #{attempt}: staging {row['staging_s']:.2f} s + engine "
                        f"{row['engine_s']:.2f} s = {row['ingest_eps']:,.0f} events/s ingested "
                        f"(engine alone {row['engine_eps']:,.0f} events/s)"
                    )
    rss.stop()
    print(f"peak RSS: {rss.peak_mib:,.0f} MiB (JVMs {rss.peak_java_mib:,.0f} MiB)")
    path = write_results("ingest", {
        "events": args.events, "spark_startup_s": round(spark_startup, 2), "rows": rows,
        "peak_rss_mib": round(rss.peak_mib), "peak_java_rss_mib": round(rss.peak_java_mib),
    })  # fmt: skip
    print("->", path)


if __name__ == "__main__":
    main()
