"""Natural keys: engine rate of SL on string and sparse int64 ids against the same events on
dense keys, and the cost of a stream that opens new keys.

Rates: the same generated SL events (`txstream generate sl --key-type dense|string|int64`,
one seed), read with pyarrow, on serial at C = 0 and on morphstream with 2 executors at
C = 10 us, each after an untimed run of its own; the ratio of each natural-key rate to the
dense one, measured in one run.
Growth: a stream whose every event opens new accounts and assets, turned into rows chunk
by chunk as the ProgressController does (`StreamKeys.rows`): the longest chunk boundary
and the index's bytes per key beyond the key bytes.

    python bench/keys.py [--events 4000000] [--udf-events 400000] [--new-keys 5000000]
                         [--only growth|rates]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from common import RESULTS, write_results
from txstream import Job, topologies
from txstream.config import CHUNK_EVENTS
from txstream.state.init import key_indexes
from txstream.state.keys import StreamKeys
from txstream.topologies.api import conform_events
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

KEY_TYPES = ("dense", "string", "int64")
CASES = (("serial", 1, 0.0), ("morphstream", 2, 10.0))
"""(scheduler, executors, --udf-cost-us)."""


def rates(events: int, udf_events: int) -> list[dict]:
    """Engine rate of every case on every key type, and the ratio to dense."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="txstream_bench_keys_") as tmp:
        for scheduler, executors, cost in CASES:
            n = events if cost == 0 else udf_events
            got = {}
            for key_type in KEY_TYPES:
                folder = Path(tmp) / f"{key_type}-{n}"
                if not folder.exists():
                    table, init = generate("sl", WorkloadSpec(events=n, key_type=key_type))
                    write_workload(folder, table, init)
                job = Job(
                    "sl",
                    scheduler=scheduler,
                    executors=executors,
                    udf_cost_us=cost,
                    source="arrow",
                    progress=False,
                )
                job.run(folder / "events.parquet", folder / "init")  # untimed: kernels loaded
                m = job.run(folder / "events.parquet", folder / "init").metrics
                got[key_type] = m["throughput_eps"]
                label = f"{scheduler} x{executors} C={cost:g}us {key_type}"
                print(f"{label}: {got[key_type]:,.0f} ev/s")
            rows.append(
                {
                    "scheduler": scheduler,
                    "executors": executors,
                    "udf_cost_us": cost,
                    "events": n,
                    "throughput_eps": got,
                    "ratio_to_dense": {
                        k: round(got[k] / got["dense"], 3) for k in KEY_TYPES if k != "dense"
                    },
                }
            )
    return rows


def growth(new_keys: int, key_type: str) -> dict:
    """Chunk boundaries of a stream that opens ``new_keys`` keys per table."""
    topology = topologies.get("sl", key_type)
    table, init = generate(
        "sl", WorkloadSpec(events=new_keys, keys=1, key_type=key_type, new_keys=1.0)
    )
    events = conform_events(table, topology.event_schema)
    limits = {t: 2 * new_keys for t in init}
    warm = StreamKeys(key_indexes(topology, init, limits), topology.key_columns)
    warm.rows(events.slice(0, CHUNK_EVENTS))  # every kernel loaded before timing
    indexes = key_indexes(topology, init, limits)
    keys = StreamKeys(indexes, topology.key_columns)
    seconds = []
    for first in range(0, events.num_rows, CHUNK_EVENTS):
        begin = time.perf_counter()
        keys.rows(events.slice(first, CHUNK_EVENTS))
        seconds.append(time.perf_counter() - begin)
    index = indexes["accounts"]
    key_bytes = (
        sum(len(k) for k in index.keys().to_pylist()) if key_type == "string" else 8 * len(index)
    )
    return {
        "key_type": key_type,
        "keys_per_table": len(index),
        "chunk_events": CHUNK_EVENTS,
        "chunk_ms_max": round(1e3 * max(seconds), 1),
        "chunk_ms_p50": round(1e3 * float(np.median(seconds)), 1),
        "index_bytes_per_key_beyond_key_bytes": round((index.nbytes - key_bytes) / len(index), 1),
    }


def kept(part: str) -> dict:
    """The figures of ``part`` in the last results, with the commit, time and load they were
    taken at (``<part>_taken``)."""
    last = json.loads((RESULTS / "keys.json").read_text())
    taken = {k: last[k] for k in ("when", "commit", "load_at_start")}
    return {part: last[part], f"{part}_taken": last.get(f"{part}_taken", taken)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--udf-events", type=int, default=400_000)
    parser.add_argument("--new-keys", type=int, default=5_000_000)
    parser.add_argument(
        "--only", choices=("growth", "rates"), help="one part; the other's figures are kept"
    )
    args = parser.parse_args()
    results = {}
    if args.only != "rates":
        results["growth"] = []
        for key_type in ("string", "int64"):  # before any engine run: no Ray process beside it
            results["growth"].append(growth(args.new_keys, key_type))
            print(results["growth"][-1])
    else:
        results.update(kept("growth"))
    if args.only != "growth":
        results["rates"] = rates(args.events, args.udf_events)
    else:
        results.update(kept("rates"))
    print("->", write_results("keys", results))


if __name__ == "__main__":
    main()
