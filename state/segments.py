"""Named arrays laid out one after the other in one shared-memory segment.

Schedulers *declare* the arrays they share (`ArraySpec`: name, dtype, shape, initial
value); this module lays them out, so that no new array means editing a fixed list.
A segment is created once with room to spare (its *capacity*) and reused while what
is asked for fits each array's region (fresh pages would cost a page fault each).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALIGN = 64
"""Every array starts on its own cache line."""
GROWTH = 1.5
"""A new segment has room for at least this many times the arrays that did not fit."""
RESERVED_BYTES = 1 << 30
"""The most room a segment reserves ahead of need: address space and a file size, no
memory until touched."""


@functools.cache
def _itemsize(dtype: str) -> int:
    """Bytes per element (``np.dtype`` costs ~1 us, and layouts ask per array per chunk)."""
    return np.dtype(dtype).itemsize


@dataclass(frozen=True)
class ArraySpec:
    """One array of a segment: name, dtype, shape, and the value a fresh one holds."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    fill: int = 0

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes, rounded up to whole cache lines."""
        raw = self.size * _itemsize(self.dtype)
        return -(-raw // ALIGN) * ALIGN


class SegmentLayout:
    """Where each declared array lives in a segment."""

    def __init__(self, specs: Sequence[ArraySpec]):
        self.specs = tuple(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(
                f"arrays declared twice: {sorted(n for n in names if names.count(n) > 1)}"
            )
        self.offsets = np.concatenate([[0], np.cumsum([s.nbytes for s in self.specs])]).astype(int)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole segment."""
        return int(self.offsets[-1])

    def fits(self, capacity: SegmentLayout) -> bool:
        """Whether every array fits its region in a segment laid out as ``capacity``."""
        return len(self.specs) == len(capacity.specs) and all(
            mine.name == room.name and mine.dtype == room.dtype and mine.size <= room.size
            for mine, room in zip(self.specs, capacity.specs, strict=True)
        )

    def grown(self, factor: float = GROWTH) -> SegmentLayout:
        """A capacity with room for ``factor`` times these arrays (flat regions)."""
        return SegmentLayout(
            [ArraySpec(s.name, s.dtype, (int(s.size * factor) + 1,), s.fill) for s in self.specs]
        )

    def views(self, buffer: memoryview, capacity: SegmentLayout) -> dict[str, np.ndarray]:
        """These arrays in a segment laid out as ``capacity`` (each a C-contiguous prefix
        of its region)."""
        return {
            spec.name: np.ndarray(spec.shape, spec.dtype, buffer=buffer, offset=int(offset))
            for spec, offset in zip(self.specs, capacity.offsets, strict=False)
        }

    def fill(self, arrays: dict[str, np.ndarray]) -> None:
        """Give every array its declared initial value (a new segment is all zeros)."""
        for spec in self.specs:
            if spec.fill:
                arrays[spec.name].fill(spec.fill)
