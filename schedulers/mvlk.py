"""mvlk: multi-versioned locking, TStream's MVLK baseline.

Transactions are spread over the team by their place in ts order and register, in that
order, with the cells they touch (the run's order counter admits one at a time, but
registering never waits for a cell): a writer takes the cell's next writer number, a
reader notes how many writers precede it. A write waits until it is the cell's lowest
pending writer (the cell's low-water mark of writers done reached it); a read waits
until every earlier writer is done and reads the version as of its ts, even if later
writers have written since. Versions are kept per chunk (`txstream.schedulers._whole`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txstream.monitor.metrics import Breakdown
from txstream.schedulers._whole import MvVersions, MvWords, reset_heads, run_multiversioned
from txstream.schedulers.whole import WholeTransactionScheduler
from txstream.state.chunk import ChunkArrays, ChunkDims, RunDims
from txstream.state.operations import OperationShare
from txstream.state.segments import ArraySpec
from txstream.state.sync import STRIDE

if TYPE_CHECKING:
    from txstream.config import RunConfig


class MultiVersionLockScheduler(WholeTransactionScheduler):
    """Ordered registration, low-water marks, versioned reads (module docstring)."""

    name = "mvlk"

    @classmethod
    def chunk_arrays(cls, config: RunConfig, dims: ChunkDims) -> list[ArraySpec]:
        """The versions of the chunk's writers (`MvVersions`), by operation."""
        return [ArraySpec(f"mv_{name}", "int64", (dims.operations,)) for name in MvVersions._fields]

    @classmethod
    def run_arrays(cls, config: RunConfig, dims: RunDims) -> list[ArraySpec]:
        """The order counter; writers registered and done, latest writer, per cell."""
        return [
            ArraySpec("order", "int64", (STRIDE,)),
            *(ArraySpec(f"mv_{name}", "int64", (dims.cells,)) for name in ("seq", "done")),
            ArraySpec("mv_head", "int64", (dims.cells,), -1),
        ]

    def prepare(self, chunk: ChunkArrays, ops: OperationShare, breakdown: Breakdown) -> None:
        """The chunk's tickets; no writer of its cells listed yet (the team, then a
        barrier)."""
        self._tickets = self.tickets(ops)
        team = self.team
        n = len(ops)
        with breakdown.timing("lock"):
            reset_heads(
                n * team.rank // team.parties,
                n * (team.rank + 1) // team.parties,
                ops.arrays,
                self.run["mv_head"],
            )
        team.barrier(breakdown)

    def execute(
        self, chunk: ChunkArrays, ops: OperationShare, begin: int, end: int, breakdown: Breakdown
    ) -> None:
        """This executor's transactions of the batch, in ts order."""
        s = self.scratch(ops)
        run = self.run
        words = MvWords(run["order"], run["mv_seq"], run["mv_done"], run["mv_head"])
        versions = MvVersions(*(chunk.arrays[f"mv_{name}"] for name in MvVersions._fields))
        with breakdown.timing("useful"):
            why = run_multiversioned(
                begin,
                end,
                ops.arrays,
                self.state.arrays,
                self.udf,
                chunk.outcomes,
                self._tickets,
                words,
                versions,
                self.peer,
                s,
            )
        self.charge(why, s, breakdown)
