"""Which groups of cells of the state were written since they were last taken.

Snapshots for queries and checkpoints copy what changed, not the whole state: every write
of a kernel marks its cell's *group* (`GROUP` consecutive cells) with one byte, and
executor 0 takes the marked groups at a chunk boundary (`take`). A whole byte per group,
not a bit per cell: executors mark concurrently, and a byte store never loses a peer's
mark, where setting a bit (a read-modify-write) could. A group of cells, not one cell:
the map stays small enough (a byte per `GROUP` cells) to be scanned at every chunk boundary.
"""

from __future__ import annotations

import numpy as np
from txstream.state._numba import inline, jit

GROUP_SHIFT = 3
GROUP = 1 << GROUP_SHIFT
"""Cells per group: one 64-byte cache line of int64 values."""
WORD = 8
"""Groups the scan of `take` tests at once (one uint64 of the map)."""


def groups_of(cells: int) -> int:
    """Groups covering ``cells`` cells, rounded up to whole words of the map."""
    groups = -(-max(1, cells) // GROUP)
    return -(-groups // WORD) * WORD


@inline
def mark(dirty, cell):
    """A kernel wrote ``cell``."""
    dirty[cell >> GROUP_SHIFT] = 1


@jit
def set_changed(values, dirty, cells, value):
    """``values[cells] = value``, marking the cells it changes only: a snapshot then
    copies none of those that held ``value`` already."""
    for c in cells:
        if values[c] != value:
            values[c] = value
            mark(dirty, c)


def mark_cells(dirty: np.ndarray, cells: np.ndarray) -> None:
    """``cells`` were written outside a kernel (a node installing other nodes' values)."""
    dirty[np.asarray(cells, np.int64) >> GROUP_SHIFT] = 1


@jit
def _take(words, dirty, out):
    n = 0
    for w in range(len(words)):
        if words[w] != 0:
            for g in range(w * WORD, w * WORD + WORD):
                if dirty[g] != 0:
                    out[n] = g
                    n += 1
            words[w] = 0
    return n


def take(dirty: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """The groups marked since the last call, ascending (a view of ``scratch``, an int64
    array as long as ``dirty``: only what is taken is ever written, so its untouched
    pages cost nothing); their marks are cleared. Only while no kernel runs (a chunk
    boundary, the whole team past its barrier)."""
    return scratch[: _take(dirty.view(np.uint64), dirty, scratch)]


@jit
def gather(values, groups, out):
    """``out[i]`` = the cells of group ``groups[i]`` of ``values`` (a last group past the
    end of ``values`` is padded with zeros)."""
    end = len(values)
    for i in range(len(groups)):
        first = groups[i] * GROUP
        for j in range(GROUP):
            out[i, j] = values[first + j] if first + j < end else 0


@jit
def scatter(values, groups, rows):
    """The cells of group ``groups[i]`` of ``values`` = ``rows[i]`` (the inverse of
    `gather`)."""
    end = len(values)
    for i in range(len(groups)):
        first = groups[i] * GROUP
        for j in range(GROUP):
            if first + j < end:
                values[first + j] = rows[i, j]


@jit
def copy_groups(source, target, groups):
    """The cells of ``groups`` of ``target`` = those of ``source`` (same length)."""
    end = len(source)
    for g in groups:
        for c in range(g * GROUP, min(g * GROUP + GROUP, end)):
            target[c] = source[c]


def clear(dirty: np.ndarray) -> None:
    """Forget every mark (the state was replaced whole: a start or a recovery)."""
    dirty[:] = 0


def warm_up() -> None:
    """Load these kernels (numba's cache) before a run is timed: on tiny arrays."""
    values, marks, groups = (
        np.zeros(GROUP, np.int64),
        np.zeros(WORD, np.uint8),
        np.zeros(1, np.int64),
    )
    rows = np.zeros((1, GROUP), np.int64)
    take(marks, np.empty(WORD, np.int64))
    gather(values, groups, rows)
    scatter(values, groups, rows)
    copy_groups(values, values.copy(), groups)
