"""Warm-up loads every kernel a run may call: none is compiled or loaded from numba's
cache in the middle of a run, with the team waiting for it (a repair's kernels and
the Coordinator's, other explorations than the empty chunk's). Threads engine: every
member shares this process, so the kernels' compiled signatures are visible here."""

from __future__ import annotations

import subprocess
import sys

import pytest
from numba.core.registry import CPUDispatcher
from txstream import Job
from txstream.actors import executor
from txstream.topologies.generators import WorkloadSpec, generate


def _signatures() -> dict[str, int]:
    """Every engine kernel of the loaded modules and how many signatures it has."""
    return {
        f"{kernel.py_func.__module__}.{kernel.__name__}": len(kernel.signatures)
        for module in list(sys.modules.values())
        if getattr(module, "__name__", "").startswith("txstream.")
        for kernel in vars(module).values()
        if isinstance(kernel, CPUDispatcher)
    }


@pytest.mark.parametrize(
    ("scheduler", "options"),
    [
        ("tstream", {}),
        ("morphstream", {"explore": "bfs", "granularity": "coarse", "abort": "lazy"}),
        ("morphstream", {"explore": "dfs", "granularity": "fine", "abort": "eager"}),
        ("morphstream", {"explore": "ns", "granularity": "coarse", "abort": "eager"}),
        ("morphstream", {}),  # auto: cheap operations, chunks walked in order after the first
    ],
)
def test_no_kernel_is_loaded_after_warm_up(monkeypatch, scheduler, options):
    warmed: dict[str, int] = {}
    warm_up = executor.Executor.warm_up

    def warm_up_and_record(self, schema, thread_cpu=None):
        pid = warm_up(self, schema, thread_cpu)
        warmed.update(_signatures())
        return pid

    monkeypatch.setattr(executor.Executor, "warm_up", warm_up_and_record)
    # SL with many aborts: repairs roll back and redo (the Coordinator marks)
    events, init = generate("sl", WorkloadSpec(events=20_000, keys=200, theta=0.9, seed=5))
    job = Job(
        "sl",
        transport="threads",
        scheduler=scheduler,
        executors=2,
        punctuation_interval=2048,
        source="arrow",
        progress=False,
        **options,
    )
    metrics = job.run(events, init).metrics
    if scheduler == "tstream" or options:  # graphs: the repair path ran
        assert metrics["redone_operations"] > 0
    else:  # auto on cheap operations: chunks walked in order, nothing to repair
        assert metrics["decisions"]["explore"]["ordered"] > 0
    late = {k: n for k, n in _signatures().items() if n > warmed.get(k, 0)}
    assert late == {}


_COMPILED_IN_A_FIRST_RUN = """
import subprocess
import sys
from pathlib import Path
from numba.core.registry import CPUDispatcher
from txstream import Job
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

data = Path(sys.argv[1])
write_workload(data, *generate("sl", WorkloadSpec(events=50_000, keys=1_000, seed=3)))
Job("sl", source="arrow", progress=False).run(data / "events.parquet", data / "init", data / "out")
compiled = sorted({
    f"{kernel.py_func.__module__}.{kernel.__name__}"
    for module in list(sys.modules.values())
    if getattr(module, "__name__", "").startswith("txstream.")
    for kernel in vars(module).values()
    if isinstance(kernel, CPUDispatcher) and kernel.stats.cache_misses
})
print(",".join(compiled))
"""


def test_after_precompile_a_first_default_run_compiles_nothing(tmp_path):
    """`./setup` runs `txstream.cli.precompile`: the user's first run (another process, more
    events, other keys) then loads every kernel it calls from numba's cache."""
    subprocess.run([sys.executable, "-m", "txstream.cli.precompile"], check=True, timeout=600)
    run = subprocess.run(
        [sys.executable, "-c", _COMPILED_IN_A_FIRST_RUN, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert run.stdout.strip() == ""
