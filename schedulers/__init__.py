"""Schedulers: strategies that execute batches of operations serial-equivalently."""

from __future__ import annotations

from txstream.errors import UsageError
from txstream.schedulers.base import Scheduler
from txstream.schedulers.morphstream import MorphStreamScheduler
from txstream.schedulers.serial import SerialScheduler
from txstream.schedulers.tstream import TStreamScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    "serial": SerialScheduler,
    "tstream": TStreamScheduler,
    "morphstream": MorphStreamScheduler,
}
"""Schedulers this build can run, by `--scheduler` name."""

PLANNED = ("sstore", "lock", "mvlk", "nolock")
"""Names SPEC.md reserves for schedulers not built yet (a clear error, not a fallback)."""

__all__ = ["PLANNED", "SCHEDULERS", "Scheduler", "get"]


def get(name: str) -> type[Scheduler]:
    """The scheduler class for ``name``."""
    if name in SCHEDULERS:
        return SCHEDULERS[name]
    if name in PLANNED:
        raise UsageError(f"scheduler {name!r} is not available in this build yet")
    raise UsageError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
