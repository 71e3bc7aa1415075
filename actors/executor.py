"""Executor: one of a team that processes every chunk of events together.

A plain class (tested with threads, without Ray); the job runs it as a Ray actor.
Dual-mode, as in TStream: in compute mode each executor pre-processes its share of
the chunk and decomposes it into operations, nothing executed; the operations go to
a shared-memory segment. Then, behind a barrier, the team switches to state-access
mode and the scheduler executes the chunk's punctuation batches one by one, a
barrier after each. Back in compute mode, each executor post-processes its share.
All synchronisation is in shared memory (`txstream.state.sync`).
"""

from __future__ import annotations

import os
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from txstream import schedulers, topologies
from txstream.cluster.topology import pin_process
from txstream.cluster.transport import get
from txstream.errors import RuntimeFailure
from txstream.monitor.metrics import LIVE_EXECUTOR, Breakdown
from txstream.schedulers._kernels import WAITED_SLOTS, run_transactions
from txstream.schedulers.base import reserved_capacity
from txstream.schedulers.decision import ABORT, EXPLORE, GRANULARITY, ORDERED
from txstream.schedulers.statements import Statements
from txstream.schedulers.team.aborts import MAP_SEGMENT
from txstream.schedulers.team.member import Member
from txstream.schedulers.team.placement import Seat
from txstream.state import dirty
from txstream.state._kernels import SET_FULL, SET_FULL_MESSAGE, undo_log
from txstream.state.checkpoints import CheckpointBuffer, CheckpointBufferHandle
from txstream.state.chunk import (
    ChunkArrays,
    ChunkDims,
    Outcomes,
    RunDims,
    TeamSegment,
    chunk_layout,
    segment_name,
)
from txstream.state.operations import COMMITTED, REJECTED, STATUS_NAMES
from txstream.state.segments import SegmentLayout
from txstream.state.shared import ArrayHandle, SharedArray
from txstream.state.snapshots import SnapshotHandle, SnapshotRing
from txstream.state.tables import SharedState, StateHandle
from txstream.state.values import bits_float, decimal_array
from txstream.topologies.api import (
    EventShare,
    Outputs,
    Topology,
    compile_validation,
    one_batch,
)

if TYPE_CHECKING:
    from txstream.config import RunConfig

STATUS_DICTIONARY = pa.array(STATUS_NAMES, pa.string())
"""The ``status`` column's dictionary (its codes are the status codes)."""
MAX_PENDING_WRITES = 2
"""Chunks an executor may have in flight to the sink before it waits (back-pressure)."""


def output_schema(topology: Topology) -> pa.Schema:
    """events.parquet columns (contract §4)."""
    fields = [
        ("ts", pa.int64()),
        ("event_id", pa.int64()),
        ("status", pa.string()),
        ("reason", pa.string()),
    ]
    fields += [(name, topology.output_type(name).arrow) for name in topology.output_columns]
    return pa.schema(fields)


def rows_schema(topology: Topology) -> pa.Schema:
    """The rows executors hand to the Sink: `output_schema` with ``status`` and ``reason``
    as dictionaries of their codes, written to Parquet as they are (a cast to strings
    would cost more than the rest of post-processing, bench/stages.py); read back, they
    are strings."""
    schema = output_schema(topology)
    for name, codes in (("status", pa.int8()), ("reason", pa.int32())):
        i = schema.get_field_index(name)
        schema = schema.set(i, pa.field(name, pa.dictionary(codes, pa.string())))
    return schema


def _output_rows(
    topology: Topology, events: EventShare, outcomes: Outcomes, ts0: int
) -> pa.RecordBatch:
    committed = outcomes.status == 0
    values = {name: outcomes.out_values[:, i] for i, name in enumerate(topology.outputs)}
    floats = [name for name in values if topology.output_type(name).floating]
    values |= {name: bits_float(values[name]) for name in floats}  # bits held, floats out
    outputs = Outputs(
        status=outcomes.status,
        values=values,
        valid={name: outcomes.out_set[:, i] & committed for i, name in enumerate(topology.outputs)},
    )
    extra = topology.post_process(events, outputs)
    # code 0 (no reason) is masked: a Parquet dictionary holds no null
    reasons = pa.array([text or "" for text in topology.reason_strings()], pa.string())
    reason_codes = pa.array(outcomes.status_reason, pa.int32(), mask=outcomes.status_reason == 0)
    columns = [
        pa.array(np.arange(ts0, ts0 + events.n, dtype=np.int64)),
        events.arrow.column("event_id").cast(pa.int64()),
        pa.DictionaryArray.from_arrays(pa.array(outcomes.status, pa.int8()), STATUS_DICTIONARY),
        pa.DictionaryArray.from_arrays(reason_codes, reasons),
    ]
    for name in topology.output_columns:
        values, valid = extra[name]
        of = topology.output_type(name)
        if of.decimal:
            values = np.asarray(values, np.int64)
            columns.append(decimal_array(values, of, np.asarray(valid, bool)))
        else:
            mask = None if valid.all() else ~valid
            values = np.asarray(values, of.arrow.to_pandas_dtype())
            columns.append(pa.array(values, of.arrow, mask=mask))
    return pa.RecordBatch.from_arrays(columns, schema=rows_schema(topology))


class InPlace:
    """``events`` to run by the calling thread straight on ``state``, one by one in ts
    order with serial's kernel (every scheduler's results equal serial's), a range of them
    at a time (`run`); their output rows, ts from 0 (`rows`). No chunk, team or sink: what
    a few events cost is then their work, not a pipeline's hand-offs (a node's steps of a
    run over several, `txstream.nodes.member`); their statements are built once for all
    of them. Only while the state's team is idle."""

    def __init__(
        self, topology: Topology, state: SharedState, events: pa.Table, udf_cost_us: float
    ):
        self.topology, self.state = topology, state
        batch = self.batch = EventShare(one_batch(events), topology, state.layout.sizes)
        topology.pre_process(batch)
        statements = self.statements = Statements(batch, state.layout)
        topology.state_access(batch, statements)
        sizes = statements.sizes()
        n, outputs = batch.n, len(topology.outputs)
        self.outcomes = Outcomes(
            np.where(batch.reason != 0, REJECTED, COMMITTED).astype(np.int8),
            batch.reason.astype(np.int32),
            np.zeros((n, outputs), np.int64),
            np.zeros((n, outputs), np.bool_),
        )
        self.udf = topology.udf(int(round(udf_cost_us * 1000)))
        self.reads = np.empty(max(1, sizes.op_reads), np.int64)
        self.waited = np.zeros(WAITED_SLOTS, np.int64)
        self.ops = statements.operations()
        self.log = undo_log(sizes.txn_ops)

    def run(self, begin: int, end: int) -> None:
        """Events ``begin..end-1``, after those before them."""
        arrays, outcomes = self.state.arrays, self.outcomes
        ops, udf, reads, log, waited = self.ops, self.udf, self.reads, self.log, self.waited
        ran = run_transactions(begin, end, ops, arrays, udf, reads, log, outcomes, waited)
        if ran == SET_FULL:
            raise RuntimeFailure(SET_FULL_MESSAGE)
        if self.topology.marks_created:
            status = np.full_like(outcomes.status, REJECTED)
            status[begin:end] = outcomes.status[begin:end]
            self.state.set_existing(self.statements.created_cells(status))

    def rows(self) -> pa.RecordBatch:
        """The output rows of every event (of those not run, as if committed)."""
        return _output_rows(self.topology, self.batch, self.outcomes, 0)


DECISIONS = (
    *(("explore", choice) for choice in (*EXPLORE, ORDERED)),
    *(("granularity", choice) for choice in GRANULARITY),
    *(("abort", choice) for choice in ABORT),
)
"""The scheduler's choices (`Scheduler.decisions`) an executor publishes, counted, after
its `LIVE_EXECUTOR` columns."""
LIVE_COLUMNS = len(LIVE_EXECUTOR) + len(DECISIONS)
"""The columns of an executor's row of live figures."""


class Executor:
    """One member of the team of executors (see module docstring).

    With ``cpu``, every thread of the process is pinned to that core first (before any
    kernel runs, so a numba thread pool would size itself to it). ``sync`` is the
    team's sync block: a shared-memory handle, or an array when executors are threads.
    A scheduler that declares Coordinator policies needs the run's `Coordinator` serving
    that block. Executor 0
    hands what each chunk wrote to the ``snapshots`` ring at its end (queries read it; a
    run nobody can query has none: `Plan.queryable`).
    """

    def __init__(
        self,
        config: RunConfig,
        state: StateHandle,
        seat: Seat,
        sync: ArrayHandle | np.ndarray,
        segment_prefix: str,
        snapshots: SnapshotHandle | SnapshotRing | None,
        sink: object | None = None,
        cpu: int | None = None,
        checkpoints: CheckpointBufferHandle | None = None,
        live: ArrayHandle | np.ndarray | None = None,
    ):
        self.rank = seat.rank  # first: named in errors of the rest of __init__
        if cpu is not None:
            pin_process(cpu)
        self.config = config
        self.topology = topologies.get(config.topology, config.key_type)
        self._no_rows = pa.RecordBatch.from_pylist([], schema=rows_schema(self.topology))
        """What an empty share outputs."""
        self.state = SharedState.attach(state)
        self._sync = SharedArray.attach(sync) if isinstance(sync, ArrayHandle) else None
        self.team = Member(seat, self._sync.array if self._sync else sync, config.timeout_s)
        self.scheduler_class = schedulers.get(config.scheduler)
        self.scheduler = self.scheduler_class(config, self.topology, self.state, self.team)
        self.segment_prefix = segment_prefix
        self.snapshots = (
            SnapshotRing.attach(snapshots) if isinstance(snapshots, SnapshotHandle) else snapshots
        )
        self.sink = sink
        self.checkpoints = CheckpointBuffer.attach(checkpoints) if checkpoints else None
        self.breakdown = Breakdown()
        self._live_segment = SharedArray.attach(live) if isinstance(live, ArrayHandle) else None
        self._live = self._live_segment.array if self._live_segment else live
        """The team's rows of live figures (`LIVE_COLUMNS`): this executor's is written
        after every chunk."""
        self.chunks: list[dict] = []
        self.batch_seconds: list[float] = []
        self.operations = 0
        self._pending: deque = deque()
        self._chunk: ChunkArrays | None = None
        self._own_chunk: ChunkArrays | None = None
        """The chunk segment of chunks this executor runs alone (`Member.alone`): the
        team's stays as its peers have it mapped."""
        self._run: TeamSegment | None = None
        self._run_mapped = False
        """The run segment is mapped, if the scheduler declares one (the first chunk)."""
        self._taken: np.ndarray | None = None
        """Executor 0's scratch for the groups each chunk wrote (`dirty.take`)."""

    def __repr__(self) -> str:
        """How Ray names this actor in its logs and errors (errors of an executor that
        reach the driver through the ProgressController keep only their message)."""
        return f"Executor {self.rank}"

    def warm_up(self, schema: pa.Schema, thread_cpu: int | None = None) -> int:
        """Load every kernel (numba cache) on an empty chunk, before timing starts (all
        executors together, as for any chunk), and those the empty chunk does not reach
        (`Scheduler.warm_up`); this executor's process id. With ``thread_cpu`` (an
        executor that is a thread: its calls all run on the thread of this one), that
        thread alone is pinned to the core."""
        if thread_cpu is not None:
            os.sched_setaffinity(0, {thread_cpu})
        empty = pa.RecordBatch.from_pylist([], schema=schema)
        compile_validation()
        if self.rank == 0:
            dirty.warm_up()
        self.run_share(empty, -1, 0, 0, np.zeros(1, np.int64), Breakdown())
        self.scheduler.warm_up(self._chunk)
        self.batch_seconds.clear()
        return os.getpid()

    def process(
        self,
        share: pa.Table | pa.RecordBatch,
        seq: int,
        first: int,
        ts0: int,
        batch_ends: np.ndarray,
        arrival: np.ndarray,
        checkpoint: bool = False,
        alone: bool = False,
    ) -> bool:
        """Run this executor's share of chunk ``seq`` (its events ``first..`` of the
        chunk, which starts at ``ts0`` and whose punctuation batches end at
        ``batch_ends``) and hand its rows to the sink, keeping at most a few writes in
        flight. With ``checkpoint``, executor 0 copies the state at the chunk's end into
        the checkpoint buffer; ``alone``: executor 0 runs the whole chunk, its peers
        stepped aside (`Member.alone`). Returns whether the next chunks may go to this
        executor alone (`Scheduler.alone_next`)."""
        chunk_time = Breakdown()
        events = int(batch_ends[-1])
        self.team.alone = alone
        rows = self.run_share(share, seq, first, ts0, batch_ends, chunk_time, checkpoint)
        self.breakdown.add(chunk_time)
        self.chunks.append({"ts": ts0, "events": events, "breakdown_s": chunk_time.as_dict()})
        if self._live is not None:
            decisions = self.scheduler.decisions()
            chosen = (decisions.get(dimension, {}).get(c, 0) for dimension, c in DECISIONS)
            self._live[self.rank] = (*self.breakdown.seconds(), self.operations, *chosen)
        if rows.num_rows:
            self._pending.append(self.sink.write.remote(rows, ts0 + first, arrival))
        if len(self._pending) > MAX_PENDING_WRITES:
            self._wait(self._pending.popleft())
        return self.scheduler.alone_next()

    def run_share(
        self,
        share: pa.Table | pa.RecordBatch,
        seq: int,
        first: int,
        ts0: int,
        batch_ends: np.ndarray,
        breakdown: Breakdown,
        checkpoint: bool = False,
    ) -> pa.RecordBatch:
        """Pre-process the share, execute the chunk's punctuation batches with the team,
        post-process the share; its output rows. A failure here releases the peers'
        waits."""
        try:
            return self._run_share(share, seq, first, ts0, batch_ends, breakdown, checkpoint)
        except BaseException:
            self.team.fail()
            raise

    def _run_share(
        self, share, seq, first, ts0, batch_ends, breakdown, checkpoint
    ) -> pa.RecordBatch:
        events = int(batch_ends[-1]) if len(batch_ends) else 0
        team, topology, layout = self.team, self.topology, self.state.layout
        with breakdown.timing("useful"):
            # a share from a thread of the ProgressController is made one batch here: a
            # copy when it spans several of the source's batches, on this executor's core
            batch = EventShare(one_batch(share), topology, layout.sizes)
            # an empty share of a chunk dealt whole to executor 0 (`whole_chunks`) runs no
            # topology code; the warm-up's empty chunk does, to warm it up
            idle = batch.n == 0 < events
            if not idle:
                topology.pre_process(batch)
        with breakdown.timing("construct"):
            txn = Statements(batch, layout)
            if not idle:
                topology.state_access(batch, txn)
        sizes = txn.sizes()
        operations, reads, width = sizes.operations, sizes.reads, sizes.arg_width
        self.operations += operations
        team.publish_share(sizes)
        self.scheduler.publish()
        self.team.barrier(breakdown)
        chunk = self._map_chunk(seq, events, breakdown)
        r = team.rank
        before = team.shares()[:r]
        first_op, first_read = sum(c.operations for c in before), sum(c.reads for c in before)
        if not self.scheduler.takes_statements(txn, batch.n == events):
            with breakdown.timing("construct"):
                views = chunk.share_ops(
                    first, batch.n, first_op, operations, first_read, reads, width
                )
                txn.build_into(views, first, first_op, first_read)
        share = slice(first, first + batch.n)
        chunk.start_share(share, batch.reason)
        self.team.barrier(breakdown)
        ops = chunk.operations()
        self.scheduler.prepare(chunk, ops, breakdown)
        begin = 0
        in_step = self.scheduler.batches_in_step()
        for end in batch_ends:
            start = perf_counter()
            self.scheduler.execute(chunk, ops, begin, int(end), breakdown)
            if in_step:
                self.team.barrier(breakdown)
            self.batch_seconds.append(perf_counter() - start)
            begin = int(end)
        self.scheduler.finish(chunk, ops, first, first + batch.n, breakdown)
        self.team.barrier(breakdown)  # the whole chunk is done: the state is as of ts0 + events
        if topology.marks_created:  # keys this chunk created, before the state is copied
            self.state.set_existing(txn.created_cells(chunk.outcomes.status[share]))
            self.team.barrier(breakdown)
        if team.rank == 0 and seq >= 0:
            self._publish(ts0 + events, checkpoint)
        if idle:
            return self._no_rows
        outcomes = Outcomes(*(column[share].copy() for column in chunk.outcomes))
        with breakdown.timing("useful"):
            return _output_rows(topology, batch, outcomes, ts0 + first)

    def _publish(self, ts: int, checkpoint: bool) -> None:
        """Executor 0, the whole team past the chunk's last barrier: hand what the chunk
        wrote to the snapshots of queries and to the checkpoints (a copy of it all, with
        ``checkpoint``); what it costs grows with the chunk's writes, not the state."""
        if self.snapshots is None and self.checkpoints is None:
            return
        if self._taken is None:
            self._taken = np.empty(len(self.state.dirty), np.int64)
        groups = dirty.take(self.state.dirty, self._taken)
        if self.snapshots is not None:
            self.snapshots.publish(self.state.values, groups, ts)
        if self.checkpoints is not None:
            self.checkpoints.note(self.state, groups)
            if checkpoint:
                self.checkpoints.copy_from(self.state, ts)

    def _map_chunk(self, seq: int, events: int, breakdown: Breakdown) -> ChunkArrays:
        """The chunk segment laid out for this chunk; when the chunk does not fit,
        executor 0 replaces the segment by a larger one and the others map it. The
        first time, the run segment too."""
        team, layout = self.team, self.state.layout
        shares = team.shares()
        dims = ChunkDims(
            operations=sum(c.operations for c in shares),
            reads=sum(c.reads for c in shares),
            transactions=events,
            arg_width=max(1, *(c.arg_width for c in shares)),
            outputs=max(1, len(self.topology.outputs)),
            parties=team.parties,
            pools=team.seat.pools,
            rows=layout.rows,
        )
        scheduler = self.scheduler_class
        if not self._run_mapped:
            run_dims = RunDims(layout.cells, layout.rows, team.parties, team.seat.pools)
            run_layout = SegmentLayout(scheduler.run_arrays(self.config, run_dims))
            if run_layout.specs:
                self._run = self._shared_segment(TeamSegment, "run", run_layout, None, breakdown)
                self._run.use(run_layout)
                if team.rank == 0:
                    run_layout.fill(self._run.arrays)
                self.scheduler.map_run(self._run.arrays)
                team.barrier(breakdown)  # the run arrays hold their initial values
            self._run_mapped = True
        if team.alone:  # walked in order: the operations and results only, as serial's
            laid_out = chunk_layout(dims, [])
            chunk = self._own_segment(seq, dims, laid_out)
        else:
            laid_out = scheduler.chunk_layout(self.config, dims)
            if self._chunk is None or not laid_out.fits(self._chunk.capacity):
                if self._chunk is not None:
                    self._chunk.close()
                self._chunk = self._shared_segment(
                    ChunkArrays,
                    seq,
                    scheduler.chunk_capacity(self.config, dims),
                    [seq, *dims.words()],
                    breakdown,
                )
            chunk = self._chunk
        limits = (max(c.txn_ops for c in shares), max(c.op_reads for c in shares))
        chunk.use_chunk(dims, laid_out, limits)
        return chunk

    def _own_segment(self, seq: int, dims: ChunkDims, layout: SegmentLayout) -> ChunkArrays:
        """The segment of chunks run alone, replaced by a larger one when the chunk does
        not fit (no peer or Coordinator maps it: a chunk run alone is walked in order)."""
        if self._own_chunk is None or not layout.fits(self._own_chunk.capacity):
            if self._own_chunk is not None:
                self._own_chunk.close()
            name = segment_name(self.segment_prefix, f"alone{seq}")
            capacity = reserved_capacity(self.config, dims, layout)
            self._own_chunk = ChunkArrays.create(name, capacity)
            self._own_chunk.unlink()
        return self._own_chunk

    def _shared_segment(self, kind, what, capacity: SegmentLayout, coordinator_args, breakdown):
        """A segment executor 0 creates and every executor maps (the Coordinator too,
        with ``coordinator_args``, if the scheduler has one), then unlinked."""
        team = self.team
        name = segment_name(self.segment_prefix, what)
        segment = kind.create(name, capacity) if team.rank == 0 else None
        if coordinator_args is not None and self.scheduler_class.coordinator_policies(self.config):
            team.ask_coordinator(MAP_SEGMENT, coordinator_args, breakdown, "sync")
        team.barrier(breakdown)
        if team.rank != 0:
            segment = kind.attach(name, capacity)
        team.barrier(breakdown)
        if team.rank == 0:
            segment.unlink()  # every executor (and the Coordinator) has it mapped
        return segment

    def flush(self) -> dict:
        """Wait for all writes to the sink; returns this executor's time breakdown (in
        all and per chunk), how long each punctuation batch's state access took (to the
        barrier that ends it), the operations it decomposed and the CPUs it runs on."""
        while self._pending:
            self._wait(self._pending.popleft())
        return {
            "breakdown_s": self.breakdown.as_dict(),
            "chunks": self.chunks,
            "batch_seconds": self.batch_seconds,
            "operations": self.operations,
            "cpus": sorted(os.sched_getaffinity(0)),
            "scheduler": self.scheduler.report(),
        }

    def _wait(self, ref: object) -> None:

        with self.breakdown.timing("sync"):
            get(ref, self.config.timeout_s)

    def close(self) -> None:
        """Detach from shared state."""
        for segment in (self._chunk, self._own_chunk, self._run):
            if segment is not None:
                segment.close()
        self.state.close()
        if self.snapshots is not None:
            self.snapshots.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
        for attached in (self._sync, self._live_segment):
            if attached is not None:
                attached.close()
