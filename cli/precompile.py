"""Numba's cache of the kernels a default run calls, filled once per installation
(``./setup`` runs this module).

numba compiles a kernel at its first call and keeps the result in the package's
``__pycache__`` (``cache=True``), so only an installation's first run pays for it, and then
with most of its start-up (in "starting 1 executor"). Here every topology runs once, with
the default options, on a few generated events read with pyarrow and written out, so that
the user's first run, Spark's or not, loads its kernels from the cache (the one made for its
statements too, ~1 s each: `txstream.schedulers._statement_kernels`); then SL once more with
each of the team's schedulers that the README names for several executors (tstream,
morphstream), whose first run would otherwise compile for tens of seconds (their kernels are
the same for every topology). The baselines compile at their first run.

    python -m txstream.cli.precompile
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from txstream.job import Job
from txstream.topologies.generators import GENERATORS, WorkloadSpec, generate, write_workload

EVENTS = 2_000
"""Enough for every kind of event of each topology's generator."""
TEAMS = ("tstream", "morphstream")
"""Schedulers precompiled for a team of two as well."""


def main() -> int:
    """Run each topology once; print how long it took."""
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="txstream_precompile_") as tmp:
        for topology in GENERATORS:
            data = Path(tmp) / topology
            write_workload(data, *generate(topology, WorkloadSpec(events=EVENTS, keys=100)))
            Job(topology, source="arrow", progress=False).run(
                data / "events.parquet", data / "init", Path(tmp) / f"{topology}-out"
            )
        for scheduler in TEAMS:
            Job("sl", scheduler=scheduler, executors=2, source="arrow", progress=False).run(
                Path(tmp) / "sl" / "events.parquet", Path(tmp) / "sl" / "init"
            )
    print(f"txstream's kernels compiled for the default runs ({time.perf_counter() - begin:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
