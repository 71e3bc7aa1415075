"""One Ray for the whole test session (starting Ray per test costs ~5 s each)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.fixture(scope="session")
def ray_cluster():
    """A lean local Ray; actors see tests/ on their path (for test topologies)."""
    import ray
    from txstream.cluster.ray_runtime import OBJECT_STORE_BYTES

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        logging_level=logging.WARNING,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}},
    )
    yield
    ray.shutdown()


def txstream_segments(pid: int | None = None) -> list[str]:
    """Shared-memory segments that runs driven by process ``pid`` (default: this
    one) left behind. Other processes' runs may be going on at the same time."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"txstream_{pid or os.getpid()}_*"))
