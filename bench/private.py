"""What each private interface and each JVM flag of Spark's way buys: `txstream run`
through Spark with each taken away in turn (its public fallback taken, or the flag left
out), against the run with all of them.

Each variant is a `txstream` command that changes one thing in txstream before running it;
the runs of a round take the variants in turn, so that they share the machine's load
(compare within one results file). Results: bench/results/private.json.

    python bench/private.py [--events 4000000] [--repeat 3] [--variants NAME ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import workload_dirs, write_results
from startup import HERE, medians, run_once

VARIANTS = {
    "all": "",
    "pyspark's public ways": "from txstream.connectors import spark_private\n"
    "spark_private.TESTED = ((0, 0), (0, 1))",
    "partitions through files": "from txstream.connectors import spark\n"
    "spark.on_ray = lambda session: False",
    "app master started by RayDP": "from txstream.connectors import spark\n"
    "spark._AppMaster.possible = staticmethod(lambda: False)",
    "no driver launched early": "from txstream.connectors import spark_driver\n"
    "spark_driver.launch_early = lambda level: None",
    "C2 as well as C1": "from txstream.connectors import spark_driver\n"
    "spark_driver._QUICK_JIT = '-XX:TieredStopAtLevel=4'",
    "no class archive": "from txstream.connectors import spark_driver\n"
    "spark_driver._archive_flags = lambda: []",
}
"""Each variant's change, made in the `txstream` process before it runs the command."""

_COMMAND = """#!{python}
import sys
{change}
from txstream.cli import command
sys.exit(command())
"""


def variant_venv(root: Path, name: str, change: str) -> Path:
    """A folder laid out as a virtualenv whose `bin/txstream` makes ``change`` first."""
    venv = root / name.replace(" ", "-").replace("'", "")
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "txstream"
    python = HERE / ".venv" / "bin" / "python"
    script.write_text(_COMMAND.format(python=python, change=change))
    script.chmod(0o755)
    return venv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in args.variants}
    with workload_dirs(["sl"], args.events) as dirs, tempfile.TemporaryDirectory() as tmp:
        venvs = {name: variant_venv(Path(tmp), name, VARIANTS[name]) for name in args.variants}
        for round_ in range(args.repeat):
            for name, venv in venvs.items():
                run = run_once(venv, dirs["sl"], "spark", Path(tmp) / "out")
                runs[name].append(run)
                print(f"round {round_ + 1} {name}: {run}", flush=True)
    results = {name: {"median": medians(rs), "runs": rs} for name, rs in runs.items()}
    for name, figures in results.items():
        print(f"{name}: wall {figures['median']['wall_s']} s")
    print(
        "->",
        write_results("private", {"events": args.events, "results": results}),
    )


if __name__ == "__main__":
    main()
