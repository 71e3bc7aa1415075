"""Schedulers: strategies that execute batches of operations serial-equivalently."""

from __future__ import annotations

from txstream.errors import UsageError
from txstream.schedulers.base import Scheduler
from txstream.schedulers.lock import LockScheduler
from txstream.schedulers.morphstream import MorphStreamScheduler
from txstream.schedulers.mvlk import MultiVersionLockScheduler
from txstream.schedulers.nolock import NoLockScheduler
from txstream.schedulers.serial import SerialScheduler
from txstream.schedulers.sstore import SStoreScheduler
from txstream.schedulers.tstream import TStreamScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    "serial": SerialScheduler,
    "tstream": TStreamScheduler,
    "morphstream": MorphStreamScheduler,
    "sstore": SStoreScheduler,
    "lock": LockScheduler,
    "mvlk": MultiVersionLockScheduler,
    "nolock": NoLockScheduler,
}
"""Schedulers this build can run, by `--scheduler` name."""

__all__ = ["SCHEDULERS", "Scheduler", "get"]


def get(name: str) -> type[Scheduler]:
    """The scheduler class for ``name``."""
    if name in SCHEDULERS:
        return SCHEDULERS[name]
    raise UsageError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
