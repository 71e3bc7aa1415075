"""Placement: which executors share work, and which executor a row of state belongs to.

Executors are grouped in *pools* (contract §4 `--placement`): shared-nothing gives each
executor its own pool, shared-per-socket one pool per socket, shared-everything one
pool for all. A row (one key of one table) belongs to the pool its hash points to;
the executors of a pool share its rows' work as their scheduler decides. Every
scheduler places rows through `pool_of_row`, so hashing lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from txstream.state._kernels import hash64
from txstream.state._numba import inline, jit


@dataclass(frozen=True)
class Seat:
    """An executor's place in the team: picklable, handed to it at start."""

    rank: int
    parties: int
    pool: int
    pools: int
    pool_ranks: tuple[int, ...]
    """Ranks sharing this executor's pool (lowest first)."""
    socket_ranks: tuple[int, ...]
    """Ranks on this executor's socket, this one first, then the next ones in rank order:
    they take each other's work left at the end of a stratum (`_explore.explore_bfs`)."""

    @property
    def alone(self) -> bool:
        """Whether every pool of the team has exactly one executor (nothing is shared)."""
        return self.pools == self.parties


def seats(placement: str | None, sockets: list[int]) -> list[Seat]:
    """Seats for executors on ``sockets`` (one entry per executor, in rank order).
    Without a placement (a scheduler that does not place work) every executor is alone."""
    n = len(sockets)
    if placement == "shared-everything":
        pool_of = [0] * n
    elif placement == "shared-per-socket":
        order = sorted(set(sockets))
        pool_of = [order.index(s) for s in sockets]
    else:
        pool_of = list(range(n))
    pools = max(pool_of) + 1
    return [
        Seat(
            r,
            n,
            pool_of[r],
            pools,
            tuple(i for i in range(n) if pool_of[i] == pool_of[r]),
            tuple(i % n for i in range(r, r + n) if sockets[i % n] == sockets[r]),
        )
        for r in range(n)
    ]


@inline
def pool_of_row(row, pools):
    """The pool of ``row``: spread by hash, so hot keys land on different pools."""
    return hash64(row) % pools


@jit
def _fill_row_pools(pools, out):
    for row in range(len(out)):
        out[row] = pool_of_row(row, pools)


def row_pools(rows: int, pools: int) -> np.ndarray:
    """The pool of every row (`pool_of_row`)."""
    out = np.empty(rows, np.int64)
    _fill_row_pools(pools, out)
    return out
