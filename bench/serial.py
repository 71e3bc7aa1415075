"""Events/s of the serial scheduler per topology, at --udf-cost-us 0 and 10.

Ray start-up and executor warm-up are excluded (metrics.json `seconds` starts when
the first event is read and ends when the last output is written). At C > 0 the
figure is compared with the UDF-bound limit 1 / (operations per event * C).

    python bench/serial.py [--events 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse

from common import bench_ray, workload_dirs, write_results
from txstream import Job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--topologies", nargs="+", default=["sl", "gs", "ob", "tp"])
    args = parser.parse_args()
    rows = []
    with bench_ray(), workload_dirs(args.topologies, args.events) as dirs:
        for name, folder in dirs.items():
            for cost in (0.0, 10.0):
                runs = [
                    Job(name, udf_cost_us=cost, source="arrow", progress=False)
                    .run(folder / "events.parquet", folder / "init")
                    .metrics
                    for _ in range(args.repeat if cost == 0 else 1)
                ]
                m = sorted(runs, key=lambda r: r["throughput_eps"])[len(runs) // 2]
                ops_per_event = m["operations"] / m["events"]
                row = {
                    "topology": name,
                    "udf_cost_us": cost,
                    "events": m["events"],
                    "throughput_eps": m["throughput_eps"],
                    "throughput_runs": [r["throughput_eps"] for r in runs],
                    "operations_per_event": round(ops_per_event, 3),
                    "latency_ms": m["latency_ms"],
                    "breakdown_s": m["breakdown_s"],
                }
                if cost:
                    limit = 1e6 / (ops_per_event * cost)
                    row["udf_bound_eps"] = round(limit, 1)
                    row["fraction_of_bound"] = round(m["throughput_eps"] / limit, 4)
                rows.append(row)
                extra = f", {row['fraction_of_bound']:.1%} of UDF bound" if cost else ""
                print(
                    f"{name} C={cost:g}us: {m['throughput_eps']:,.0f} ev/s "
                    f"(median of {len(runs)}){extra}"
                )
    print("->", write_results("serial", {"events": args.events, "rows": rows}))


if __name__ == "__main__":
    main()
