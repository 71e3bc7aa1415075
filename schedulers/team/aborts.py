"""Abort handling through the Coordinator: its requests, its policies, and the team's side.

The protocol is exact under cascades (see `txstream.schedulers.team._versions`). With the
team paused, the Coordinator marks what fresh failures make wrong (`find_affected`)
and the team rolls back and redoes it. The *policy* says when the team pauses:

- ``lazy``: once the whole batch is explored (TStream; MorphStream's l-abort);
- ``eager``: as soon as an operation failed, while the batch is still being explored
  (MorphStream's e-abort): less speculative work built on the failed writes, more
  pauses.

A scheduler declares the policies it needs (`Scheduler.coordinator_policies`); the
Coordinator serves those and refuses any other request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from txstream.errors import RuntimeFailure
from txstream.monitor.metrics import Breakdown
from txstream.schedulers.team._links import LINK_ARRAYS, Links
from txstream.schedulers.team._versions import (
    VERSION_ARRAYS,
    Fates,
    Scratch,
    Versions,
    clear_marks,
    find_affected,
    redo,
    roll_back_marked,
    settle_unchanged,
)
from txstream.schedulers.team.member import Member
from txstream.state._kernels import SET_FULL, SET_FULL_MESSAGE, Udf, compile_for
from txstream.state.chunk import ChunkArrays, ChunkDims
from txstream.state.operations import Ops
from txstream.state.segments import ArraySpec
from txstream.state.sync import STRIDE
from txstream.state.tables import StateArrays

LAZY, EAGER = "lazy", "eager"
POLICIES = (LAZY, EAGER)
MAP_SEGMENT, RESOLVE = 1, 2
"""Requests to the Coordinator: map a new chunk segment ``[seq, *dims]``; resolve the
fresh failures of transactions begin..end-1 ``[policy, *dims, begin, end]`` (dims as
`ChunkDims.words`)."""


class Speculation(NamedTuple):
    """The arrays of a chunk that speculative execution and its repairs work on."""

    dims: ChunkDims
    ops: Ops
    links: Links
    versions: Versions
    fates: Fates

    @staticmethod
    def of(chunk: ChunkArrays) -> Speculation:
        """The chunk segment's arrays (its scheduler declared `chunk_versions`)."""
        a = chunk.arrays
        return Speculation(
            chunk.dims,
            chunk.ops,
            Links(*(a[name] for name in Links._fields)),
            Versions(*(a[name] for name in Versions._fields)),
            Fates(*(a[name] for name in Fates._fields)),
        )


def chunk_versions(dims: ChunkDims) -> list[ArraySpec]:
    """The arrays `Speculation` needs besides the operations (`_links`, `_versions`)."""
    size = {"operations": dims.operations, "reads": dims.reads, "transactions": dims.transactions}
    return [
        *[ArraySpec(name, "int64", (size[dim],)) for name, dim in LINK_ARRAYS.items()],
        *[ArraySpec(name, dtype, (size[dim],)) for name, (dtype, dim) in VERSION_ARRAYS.items()],
    ]


def warm_resolve(layout_arrays: dict[str, np.ndarray]) -> None:
    """The Coordinator's kernel compiled (or loaded from numba's cache) before the run,
    for chunk arrays as ``layout_arrays`` gives them (their types, not their sizes,
    matter): the first repair of a run would otherwise wait for it."""
    a = layout_arrays
    ops = Ops(*(a[name] for name in Ops._fields))
    links = Links(*(a[name] for name in Links._fields))
    versions = Versions(*(a[name] for name in Versions._fields))
    fates = Fates(*(a[name] for name in Fates._fields))
    compile_for(find_affected, 0, 0, ops, links, versions, fates, np.zeros(1, np.int64))


def resolve(chunk: ChunkArrays, begin: int, end: int, stack: np.ndarray) -> int:
    """The Coordinator's part: mark what the fresh failures among transactions
    begin..end-1 make wrong; how many operations to redo. ``stack`` is scratch (room
    for twice the chunk's operations plus its reads)."""
    spec = Speculation.of(chunk)
    return int(find_affected(begin, end, spec.ops, spec.links, spec.versions, spec.fates, stack))


class Repairs:
    """The team's part, for one executor: pause, settle the failures that changed
    nothing, have the Coordinator mark what the others made wrong, roll back and redo
    the marked operations of a batch, resume.

    ``redo_position`` is a word per executor (stride `STRIDE`) where the redo publishes
    how far it is, ``settled`` two words per executor where it publishes what its share
    of the failures needs (`settle_unchanged`), both declared by the scheduler
    (`repair_arrays`)."""

    def __init__(
        self,
        team: Member,
        state: StateArrays,
        udf: Udf,
        redo_position: np.ndarray,
        settled: np.ndarray,
    ):
        self.team = team
        self.state = state
        self.udf = udf
        self.redo_position = redo_position
        self.settled = settled
        self.redone = 0
        self.settled_failures = 0
        """Fresh failures the team settled without the Coordinator (they changed nothing)."""

    def warm_up(self, spec: Speculation, s: Scratch) -> None:
        """Compile (or load) the kernels of a repair for a chunk's arrays
        (`Scheduler.warm_up`): the same calls as `run`'s."""
        team, ops, links, v, fates = self.team, spec.ops, spec.links, spec.versions, spec.fates
        compile_for(roll_back_marked, team.rank, 0, 0, ops, links, v, self.state)
        compile_for(
            redo,
            *(team.rank, 0, 0, 0, ops, links, v, fates, self.state, self.udf),
            *(self.redo_position, team.sync, team.timeout_ns, s),
        )
        compile_for(clear_marks, team.rank, 0, ops, links, v, fates)
        compile_for(settle_unchanged, 0, 0, ops, links, v, fates)

    def run(
        self,
        policy: str,
        spec: Speculation,
        begin: int,
        end: int,
        s: Scratch,
        breakdown: Breakdown,
        on_pause: Callable[[], None] | None = None,
    ) -> int:
        """With the whole team (every executor calls it): resolve the fresh failures of
        transactions begin..end-1; ``on_pause`` runs once the whole team is paused. The
        Coordinator is asked only if a failed transaction left a cell changed (a round
        trip per batch otherwise: GS's failures change nothing). Returns how many
        operations were redone."""
        team = self.team
        ops, links, v, fates = spec.ops, spec.links, spec.versions, spec.fates
        first_op, stop = int(ops.txn_ptr[begin]), int(ops.txn_ptr[end])
        self.redo_position[STRIDE * team.rank] = first_op  # the redo waits on it from the start
        team.barrier(breakdown)
        if on_pause is not None:
            on_pause()
        with breakdown.timing("abort"):
            t0 = begin + (end - begin) * team.rank // team.parties
            t1 = begin + (end - begin) * (team.rank + 1) // team.parties
            mine = STRIDE * team.rank
            self.settled[mine : mine + 2] = settle_unchanged(t0, t1, ops, links, v, fates)
        team.barrier(breakdown)
        left, settled = self.settled.reshape(team.parties, STRIDE)[:, :2].sum(axis=0)
        self.settled_failures += int(settled)
        if not left:
            return 0
        request = [POLICIES.index(policy), *spec.dims.words(), begin, end]
        marked = team.ask_coordinator(RESOLVE, request, breakdown, "abort")
        if marked:
            with breakdown.timing("abort"):
                roll_back_marked(team.rank, first_op, marked, ops, links, v, self.state)
                s.waited[0] = 0
                why = redo(
                    team.rank,
                    first_op,
                    stop,
                    marked,
                    ops,
                    links,
                    v,
                    fates,
                    self.state,
                    self.udf,
                    self.redo_position,
                    team.sync,
                    team.timeout_ns,
                    s,
                )
            breakdown.abort -= s.waited[0] / 1e9
            breakdown.sync += s.waited[0] / 1e9
            if why == SET_FULL:
                raise RuntimeFailure(SET_FULL_MESSAGE)
            team.check(why)
            self.redone += marked
        team.barrier(breakdown)
        if marked:
            clear_marks(team.rank, marked, ops, links, v, fates)
        return marked


def repair_arrays(parties: int) -> list[ArraySpec]:
    """The run arrays `Repairs` publishes in: a redo position and what a share of the
    failures needs, per executor."""
    return [
        ArraySpec("redo_position", "int64", (STRIDE * parties,)),
        ArraySpec("settled", "int64", (STRIDE * parties,)),
    ]
