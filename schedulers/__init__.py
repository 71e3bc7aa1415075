"""Schedulers: strategies that execute batches of operations serial-equivalently.

Each is imported on first use (`SCHEDULERS`, `get`): their kernels import numba, and the
command line needs only their names before it has parsed its arguments (`txstream run`
launches Spark's driver first, `connectors.spark_driver`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from txstream.errors import UsageError

if TYPE_CHECKING:
    from txstream.schedulers.base import Scheduler

_CLASSES = {
    "serial": ("serial", "SerialScheduler"),
    "tstream": ("tstream", "TStreamScheduler"),
    "morphstream": ("morphstream", "MorphStreamScheduler"),
    "sstore": ("sstore", "SStoreScheduler"),
    "lock": ("lock", "LockScheduler"),
    "mvlk": ("mvlk", "MultiVersionLockScheduler"),
    "nolock": ("nolock", "NoLockScheduler"),
}


class _Schedulers(Mapping[str, "type[Scheduler]"]):
    """The scheduler classes by `--scheduler` name, each imported when first looked up."""

    def __getitem__(self, name: str) -> type[Scheduler]:
        module, cls = _CLASSES[name]
        return getattr(importlib.import_module(f"txstream.schedulers.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(_CLASSES)

    def __len__(self) -> int:
        return len(_CLASSES)


SCHEDULERS: Mapping[str, type[Scheduler]] = _Schedulers()
"""Schedulers this build can run, by `--scheduler` name."""

__all__ = ["SCHEDULERS", "get"]


def get(name: str) -> type[Scheduler]:
    """The scheduler class for ``name``."""
    if name in SCHEDULERS:
        return SCHEDULERS[name]
    raise UsageError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
