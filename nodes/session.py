"""A session over several nodes of a Ray cluster (contract §8): the driver sequences the
input (`txstream.nodes.sequencer`), hands every node its steps, answers queries from the
nodes that own the keys, and merges what the nodes produced into one output, as a session
on one host writes it (`Job.run` is a session too: start, push everything, close).

Each node is a `NodeTeam` actor placed on its own Ray node. The values one node sends
another go from node to node (`NodeTeam.deliver`), never through the driver, which only
sends every node its part of a unit in one call (`NodeTeam.run`: its steps, level by
level), at most `UNITS_IN_FLIGHT` units ahead of the slowest node, and remembers for every
node which of its events are whose (global ts) and whose outputs count (the event's home
node)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from txstream.actors.executor import output_schema
from txstream.cluster.nodes import cpus_before, hosts_of, pick_nodes
from txstream.cluster.ray_runtime import actor_failure, ray_session, start_actor, stop_actors
from txstream.config import CHUNK_EVENTS
from txstream.connectors.inputs import Events, event_source, staged_by_spark
from txstream.connectors.outputs import part_name
from txstream.engine.engine import NAMESPACE
from txstream.engine.live import SCRAPE_TIMEOUT_S
from txstream.engine.plan import Plan
from txstream.engine.recovery import MAX_RECOVERIES, InputLog, Pushed
from txstream.errors import ActorDied, RuntimeFailure, TopologyError, TxstreamError, UsageError
from txstream.monitor.console import Console
from txstream.monitor.live_metrics import (
    CHUNK_BOUNDS,
    LATENCY_BOUNDS,
    Figures,
    Histogram,
    RunCollector,
)
from txstream.monitor.metrics import LatencyHistogram, SizeHistogram
from txstream.monitor.metrics_server import MetricsServer, serve_metrics
from txstream.monitor.ray_metrics import RayMetricsExport, metrics_agent_running
from txstream.nodes.cost import COST, COUNTS, counts
from txstream.nodes.front import CONCURRENCY, NodesFrontDoor
from txstream.nodes.member import CONCURRENCY as TEAM_CONCURRENCY
from txstream.nodes.member import NodeStep, NodeTeam
from txstream.nodes.sequencer import Partition, Sequencer, UnitPlan, cut, touched_cells
from txstream.result import Result
from txstream.state.keys import StreamKeys, node_of, restored_indexes
from txstream.state.operations import STATUS_NAMES
from txstream.state.tables import with_keys
from txstream.topologies.api import conform_events

if TYPE_CHECKING:  # Spark's connector is imported only when Spark stages the input
    from txstream.connectors.spark import SparkSource
    from txstream.nodes.intake import Prepared

UNIT_EVENTS = CHUNK_EVENTS
"""Events per unit of input: the sequencer's grain (levels restart with every unit). As
many as a team's largest chunk by default: a unit gathered on one node is one chunk
there, and each step pays a round trip through the node's pipeline, so fewer, larger
ones pay."""
UNITS_IN_FLIGHT = 2
"""Units submitted and not finished yet: one running, one ready."""
UNIT_LEVELS = 128
"""Most levels of a unit: a unit with more is cut in halves. A level is a round of steps
across the nodes (a round trip between them), and a reader's answer waits for the units
in flight: without a bound, a unit of events that depend on each other across nodes
would hold it for hundreds of levels."""
PREPARED_AHEAD = 1
"""Spark partitions being prepared beyond the one whose units are being submitted."""
ANSWER_POLL_S = 0.5
"""How long the answering thread waits for a question before looking whether to stop."""
RESTART_PAUSE_S = 2.0
"""Before placing the nodes again when a team died as it started: Ray may not know yet
that a node it was placed on is gone."""
NODES_META = "nodes.json"
"""In the checkpoint folder: the last checkpoint every node took, and what it belongs to."""
KEYS_FILE = "keys.npz"
"""In the checkpoint folder: the driver's key indexes as of its last checkpoint."""
NEVER = 1 << 40
"""A node's own checkpoint interval: nodes checkpoint only when the driver says."""


@dataclass
class _Unit:
    """A unit of input: ``n`` events, their cells (`touched_cells`), and where each node
    takes its events from: ``events`` (read by the driver), or a prepared Spark partition
    (`txstream.nodes.intake`): per node, a reference to the table of the events it takes
    part in (``parts``) and each event's row in it (``rank``), then the same for the
    table of all its events (for a unit gathered on one node)."""

    n: int
    txn: np.ndarray
    cells: np.ndarray
    events: pa.Table | None = None
    parts: list | None = None
    rank: list[np.ndarray] | None = None
    planned: UnitPlan | None = None
    """Its steps, once sequenced (`NodesSession._pieces`)."""

    def rows(
        self, node: int, positions: np.ndarray, gathered: bool
    ) -> tuple[Any, np.ndarray | None]:
        """What a step of ``node`` gets for the events at ``positions``: their rows, or a
        table of the node's (of all, if the unit is ``gathered``) and which of its rows."""
        if self.events is not None:
            return self.events.take(positions), None
        table = -1 if gathered else node
        return self.parts[table], self.rank[table][positions]

    def halves(self) -> tuple[_Unit, _Unit]:
        """The unit's first and second halves."""
        h = self.n // 2
        return tuple(
            _Unit(
                end - first,
                *cut(self.txn, self.cells, first, end),
                None if self.events is None else self.events.slice(first, end - first),
                self.parts,
                None if self.rank is None else [r[first:end] for r in self.rank],
            )
            for first, end in ((0, h), (h, self.n))
        )


@dataclass(frozen=True)
class _Saved:
    """The last checkpoint every node took: after ``ts`` events of the input, which were
    ``local[i]`` events of node i's own; its round (`txstream.nodes.rounds`)."""

    ts: int
    local: list[int]
    round: int


class NodesSession:
    """A session of ``plan`` over ``plan.config.nodes`` nodes (module docstring; its
    promises: `txstream.session.StreamSession`); started as it is made, ended by `close`.

    With a checkpoint folder, every node checkpoints at the same unit boundary every
    ``--checkpoint-every`` batches' worth of events (``node-<i>/`` in the folder, its
    session's outputs beside them), and the driver keeps the units since. When a node is
    lost, every node goes back to that checkpoint (on the nodes still alive, sharing them
    if need be) and the units since are run again: as the input's order is fixed, they
    produce the same steps, values and outputs (exactly once: a node's outputs after its
    checkpoint are dropped when it resumes).
    """

    def __init__(self, plan: Plan, console: Console, job_config: object | None = None):
        self.plan = plan
        self.config = plan.config
        self.console = console
        nodes = self.config.nodes
        self.keys = StreamKeys(plan.keys, plan.topology.key_columns) if plan.keys else None
        """The key index of every table of natural keys: the driver turns keys into rows."""
        self._partition()
        self.teams: list[Any] = []
        self.units_sent = [0] * nodes
        self.units_submitted = 0
        """Units submitted since the start, each a fresh name for its values between nodes."""
        self.latency = LatencyHistogram()
        self.unit_sizes = SizeHistogram()
        """Events per unit handed to the nodes: the live metrics' chunk sizes."""
        self.figures = {
            "units": 0,
            "cross": 0,
            "partitions_prepared": 0,
            "unit_levels_max": 0,
            "gathered_units": 0,
            **dict.fromkeys(COUNTS, 0),
        }
        self.in_flight: deque[tuple[float, int, list]] = deque()
        self.ts = 0
        """Events submitted so far."""
        self.done = 0
        """Events whose steps all ended."""
        folder = self.config.checkpoint_dir
        self.folder = Path(folder).resolve() if folder else None
        self.every = (self.config.checkpoint_every or 0) * self.config.punctuation_interval
        self.saved = _Saved(0, [0] * nodes, 0)
        self.since: list[_Unit] = []
        """The units after the last checkpoint, run again after the loss of a node."""
        self.recoveries: list[dict[str, Any]] = []
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        self.checkpointed_at: float | None = None
        """When the newest checkpoint was written (epoch seconds)."""
        self._resumed_from = 0
        self.last_batch_id = -1
        """The last Spark micro-batch pushed (`txstream.connectors.streaming`), -1 if none."""
        self._inputs = InputLog(keep=False)
        """The pushes' micro-batches, for the checkpoints' metadata (the units since the
        last checkpoint are kept in `since`)."""
        self.extra_metrics: dict[str, Any] = {}
        """Metrics the caller adds (e.g. Spark's start-up), written with the session's."""
        self._result: Result | None = None
        self._lock = threading.RLock()
        """Held while calls are made to the nodes (steps, questions) or the nodes are
        started again: the door's questions come from another thread. Waiting for the
        calls' results is done without it."""
        self._begin = 0.0
        self._door: Any = None
        self._stack = ExitStack()
        self._running = False
        """Whether every node runs: not while they start or recover."""
        self._failure: BaseException | None = None
        self._outcomes: tuple[dict[str, int], dict[str, int]] | None = None
        """The nodes' events by status and rejection reason last read (`_figures`)."""
        self._pushed_high = 0
        self._server: MetricsServer | None = None
        self._ray_metrics: RayMetricsExport | None = None
        begin = time.perf_counter()
        try:
            # first: a port in use fails at once
            collector = RunCollector(plan.label, self.config.topology, self._figures)
            self._server = serve_metrics(self.config, collector, self._alive, self._ready, console)
            self._stack.enter_context(
                ray_session(self.config.address, job_config, phase=console.phase)
            )
            self._stack.callback(self._stop)
            if self.folder is not None:
                self._resume_or_clear()
            with console.phase(f"starting {nodes} nodes"):
                self._start(pick_nodes(nodes))
            if metrics_agent_running():
                self._ray_metrics = RayMetricsExport(collector)
            if plan.name:
                self._open_door(plan.name)
        except BaseException:
            self._teardown(failed=True)
            raise
        self._running = True
        self.startup_s = time.perf_counter() - begin
        self._begin = time.perf_counter()
        self._bar = self._stack.enter_context(
            console.progress(plan.expected_events or 0, "running", self._begin, 0)
        )

    def _partition(self) -> None:
        """The partition of the keys and the sequencer on it: every row given so far of a
        table of natural keys on the node of its natural key's ``node_of``."""
        plan, nodes = self.plan, self.config.nodes
        placed = {}
        for table, index in (self.keys.indexes if self.keys else {}).items():
            placed[table] = node_of(index.keys(), nodes)
        self.partition = Partition(plan.layout, plan.topology, nodes, placed)
        self.sequencer = Sequencer(plan.topology, plan.layout, self.partition)
        self.shipped = [{t: len(o) for t, o in placed.items()} for _ in range(nodes)]
        """Per node, the rows of each table of natural keys it was told the node of."""

    def _open_door(self, name: str) -> None:
        """Outside readers reach the session by ``name`` (`txstream.nodes.front`): a door
        named so, whose questions a thread of this process answers between units."""
        import ray

        try:
            self._door = start_actor(
                NodesFrontDoor,
                self.config.timeout_s,
                self._status(),  # `status` has figures before a unit ends
                label="front door",
                name=name,
                namespace=NAMESPACE,
                concurrency_groups=CONCURRENCY,
            )
            ray.get(self._door.status.remote(), timeout=self.config.timeout_s)
        except ValueError as exc:
            raise UsageError(f"a session named {name!r} already runs on this cluster") from exc
        self._stack.callback(stop_actors, [self._door])
        closing = threading.Event()
        answering = threading.Thread(target=self._answer, args=(closing,), daemon=True)
        answering.start()
        self._stack.callback(answering.join)
        self._stack.callback(closing.set)

    def _answer(self, closing: threading.Event) -> None:
        """Answer the door's questions until ``closing``."""
        import ray

        door = self._door
        while not closing.is_set():
            try:
                asked = ray.get(door.next_question.remote(ANSWER_POLL_S))
                if asked is None:
                    continue
                number, (_, table, keys) = asked
                try:
                    value, failure = self._query(table, keys, recover=False), None
                except TxstreamError as exc:
                    value, failure = None, exc
                door.answer.remote(number, value, failure)
            except ray.exceptions.RayError:  # the door or Ray is gone: the session ends
                return

    def _status(self) -> dict[str, Any]:
        """What `txstream status` shows of a run over nodes."""
        seconds = time.perf_counter() - self._begin if self._begin else 0.0
        return {
            "watermark": self.done,
            "received": self.ts,
            "pending": self.ts - self.done,
            "uptime_s": round(seconds, 3),
            "throughput_eps": round((self.done - self.resumed_from) / seconds, 1)
            if seconds > 0
            else None,
            "nodes": self.config.nodes,
        }

    # ---------------------------------------------------------------- health
    def _alive(self) -> bool:
        """Whether the session goes on (it has not failed)."""
        return self._failure is None

    def _ready(self) -> bool:
        """Whether every node runs: not while they start or recover, nor once it ended."""
        return self._running and self._alive()

    def _figures(self) -> Figures | None:
        """What a scrape of the live metrics reads (`txstream.monitor.live_metrics`), as of
        a session on one host: the driver's own counts, and the nodes' events by status
        (`_ask_outcomes`, only while they run). None before the nodes first answer."""
        ready = self._ready()
        if ready:
            self._ask_outcomes()
        if self._outcomes is None:
            return None
        statuses, reasons = self._outcomes
        self._pushed_high = max(self._pushed_high, self.ts)  # a recovery submits again
        latency = self.latency.cumulative(LATENCY_BOUNDS)  # before the count: never above it
        chunks, count = self.unit_sizes.buckets(CHUNK_BOUNDS)
        saved_at = self.checkpointed_at
        return Figures(
            pushed=self._pushed_high,
            watermark=self.done,
            committed=self.done,  # what `outputs` yields: every event done
            backlog_bytes=0,  # `push` returns once its units are submitted: no table waits
            statuses=statuses,
            reasons=reasons,
            latency=Histogram(latency, self.latency.sum, int(self.latency.counts.sum())),
            chunks=Histogram(chunks, self.unit_sizes.sum, count),
            executors=[],  # each node's team is its own
            checkpoints=self.checkpoints,
            checkpoint_seconds=self.checkpoint_seconds,
            checkpoint_age_s=None if saved_at is None else max(0.0, time.time() - saved_at),
            recoveries=len(self.recoveries),
            rows={},
            ready=ready,
        )

    def _ask_outcomes(self) -> None:
        """The nodes' events by status and rejection reason (`NodeTeam.outcomes`, of the
        events whose home each is), added up; the last ones kept while a node does not
        answer (busy with the steps before, or lost). A recovery's nodes count from their
        checkpoints and decide the same events again alike: every count keeps its highest
        value, so that the counters only grow and end exact."""
        import ray

        teams = list(self.teams)
        try:
            answers = ray.get([t.outcomes.remote() for t in teams], timeout=SCRAPE_TIMEOUT_S)
        except Exception:  # a busy or lost node: the next scrape asks again
            return
        statuses, reasons = Counter(), Counter()
        for node_statuses, node_reasons in answers:
            statuses.update(node_statuses)
            reasons.update(node_reasons)
        before_statuses, before_reasons = self._outcomes or ({}, {})
        self._outcomes = (_highest(before_statuses, statuses), _highest(before_reasons, reasons))

    @property
    def resumed_from(self) -> int:
        """The ts this session continues from (0: it started afresh)."""
        return self._resumed_from

    def _resume_or_clear(self) -> None:
        """Continue from the last checkpoint every node took (`NODES_META`), if the folder
        holds one of this run's; start afresh otherwise. UsageError for another run's."""
        meta_path = self.folder / NODES_META
        want = self._identity()
        if meta_path.exists() and not (self.plan.store and self.plan.store.complete):
            meta = json.loads(meta_path.read_text())
            for key, value in want.items():
                if meta.get(key) != value:
                    raise UsageError(
                        f"checkpoint {meta_path} is of another {key} ({meta.get(key)}, here "
                        f"{value}); use another --checkpoint-dir or remove it"
                    )
            self.saved = _Saved(meta["ts"], meta["local"], meta["round"])
            if self.keys is not None:  # the rows of natural keys as they were then
                with np.load(self.folder / KEYS_FILE) as saved:
                    indexes = restored_indexes(self.keys.indexes, saved.__getitem__)
                self.plan.keys = indexes
                self.keys = StreamKeys(indexes, self.plan.topology.key_columns)
                self._partition()
            self.ts = self.done = self._resumed_from = self.saved.ts
            last = meta.get("last_batch_id")
            self._inputs = InputLog(keep=False, last_batch_id=last)
            self.last_batch_id = -1 if last is None else last
            self.console.note(f"resuming from {self.folder} at event {self.saved.ts:,}")
            return
        self.plan.store.clear()  # and the mark of a completed run
        meta_path.unlink(missing_ok=True)
        (self.folder / KEYS_FILE).unlink(missing_ok=True)
        for old in self.folder.glob("node-*"):
            shutil.rmtree(old)

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint over several nodes must match to be resumed."""
        plan = self.plan
        return {
            "nodes": self.config.nodes,
            "topology": self.config.topology,
            "sizes": plan.layout.sizes,
            "input": plan.input,
            "output": str(plan.output.path.resolve()),
        }

    def __enter__(self) -> NodesSession:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._teardown(failed=True)

    def _teardown(self, failed: bool) -> None:
        """Stop every node and the Ray this session started; remove what it wrote to
        temporary places (idempotent)."""
        self._running = False
        if failed:
            self._failure = self._failure or RuntimeFailure("the session failed")
        if self._server is not None:  # first: a scrape asks the nodes
            self._server.close()
            self._server = None
        if self._ray_metrics is not None:
            self._ray_metrics.close()
            self._ray_metrics = None
        self._stack.close()
        if failed or self.plan.own_output:
            self.plan.discard_unused()

    def push(self, events: Events, batch_id: int | None = None) -> None:
        """Append ``events`` to the stream (`StreamSession.push`): what `event_source`
        takes, Parquet files read with Spark or pyarrow per the ``source`` option. Returns
        once they are submitted, at most `UNITS_IN_FLIGHT` units ahead of the nodes.
        ``batch_id``: the Spark micro-batch these events are; a checkpoint remembers the
        last one it covers (`txstream.connectors.streaming`)."""
        if self._result is not None:
            raise UsageError("the session is closed")
        start = self.ts
        cfg = self.config
        source = event_source(events, self.plan.topology, cfg.source, cfg.spark_exchange_dir)
        if source is not events and hasattr(source, "close"):  # staged by Spark for it
            self._stack.callback(source.close)
        size = min(UNIT_EVENTS, self.every) if self.folder is not None else UNIT_EVENTS
        if staged_by_spark(source) and self.keys is None:  # natural keys: rows given here
            units = self._spark_units(source, size)
        else:
            units = (self._read_unit(batch) for batch in source.iter_batches(size))
        for unit in units:
            for piece in self._pieces(unit):
                self._advance(piece)
                self._bar.update(self.done)
                if self._door is not None:
                    self._door.report.remote(self._status())
        self._inputs.record(Pushed(start, self.ts, batch_id=batch_id))
        if batch_id is not None:
            self.last_batch_id = batch_id

    def _pieces(self, unit: _Unit) -> Iterator[_Unit]:
        """``unit`` sequenced, or its halves, theirs and so on, until each piece fits: no
        step needs more rows for other nodes' keys than a node has (`Sequencer.plan`), and
        at most `UNIT_LEVELS` levels; or gathered on one node (`Sequencer.gather`): of the
        plans that fit, the cheaper per `COST`."""
        plans = [
            self.sequencer.plan(unit.n, unit.txn, unit.cells, UNIT_LEVELS),
            self.sequencer.gather(unit.n, unit.txn, unit.cells),
        ]
        fit = [p for p in plans if p is not None]
        if fit:
            unit.planned = min(fit, key=COST.seconds)
            yield unit
            return
        if unit.n < 2:  # one event has one level: it needs more room than a node has
            raise TopologyError(
                f"{self.plan.topology.name}: an event touches more keys of other nodes "
                "than a node has room for; run on fewer nodes"
            )
        for half in unit.halves():
            yield from self._pieces(half)

    def _read_unit(self, batch: pa.RecordBatch) -> _Unit:
        """A unit of events the driver has read."""
        plan = self.plan
        events = conform_events(batch, plan.topology.event_schema)
        if self.keys is not None:
            events = self.keys.rows(events)
            self._place()
        return _Unit(events.num_rows, *touched_cells(plan.topology, plan.layout, events), events)

    def _place(self) -> None:
        """Place the rows the key index gave since the last unit: each on the node of its
        natural key."""
        for table, index in self.keys.indexes.items():
            first = self.partition.shares[0].placed(table)
            if index.count > first:
                keys = index.keys(np.arange(first, index.count, dtype=np.int64))
                self.partition.place(table, node_of(keys, self.config.nodes))

    def _spark_units(self, source: SparkSource, size: int) -> Iterator[_Unit]:
        """The units of a Spark source's partitions, each prepared by a Ray task on the
        driver's node (`txstream.nodes.intake`), `PREPARED_AHEAD` partitions ahead."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from txstream.connectors.spark import follow
        from txstream.nodes.intake import prepare_partition

        plan, nodes = self.plan, self.config.nodes
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        prepare = ray.remote(prepare_partition).options(
            num_cpus=0, num_returns=nodes + 2, scheduling_strategy=here
        )
        pending: deque[list] = deque()
        last_position = -1
        partitions = source.partitions()
        while True:
            for chunk in partitions:
                pending.append(
                    prepare.remote(
                        plan.topology.name, plan.layout.sizes, nodes, source.schema, chunk
                    )
                )
                if len(pending) > PREPARED_AHEAD:
                    break
            if not pending:
                return
            refs = pending.popleft()
            got: Prepared = self._get(refs[0])
            last_position = follow(last_position, got.first, got.last)
            rank = [np.cumsum((got.mask >> node) & 1) - 1 for node in range(nodes)]
            rank.append(np.arange(got.rows))
            self.figures["partitions_prepared"] += 1
            for first in range(0, got.rows, size):
                end = min(got.rows, first + size)
                txn, cells = cut(got.txn, got.cells, first, end)
                yield _Unit(end - first, txn, cells, None, refs[1:], [r[first:end] for r in rank])

    def flush(self) -> int:
        """Wait until every pushed event is done on every node; the watermark."""
        self._drain()
        return self.done

    @property
    def watermark(self) -> int:
        """Events whose steps ended on every node."""
        return self.done

    @property
    def checkpointing(self) -> bool:
        """Whether the session writes checkpoints (and so recovers from failures)."""
        return self.folder is not None

    def checkpoint(self) -> int:
        """Flush, then every node checkpoints as of every pushed event; its ts. Needs a
        checkpoint folder."""
        if self.folder is None:
            raise UsageError("checkpoint() needs a checkpoint folder (checkpoint_dir)")
        self.flush()
        self._checkpoint()
        return self.saved.ts

    @property
    def pushed(self) -> int:
        """Events pushed so far."""
        return self.ts

    def query(self, table: str, keys: list[int] | None = None) -> tuple[int, pa.Table]:
        """``(w, rows)``: the rows of ``table`` (``key`` + value columns; the given keys in
        that order, or every key) after exactly the first ``w`` events (`StreamSession.query`),
        ``w`` being every event pushed so far: each owner answers once it has run every
        step submitted before the question (the same cut on every node), without draining
        the others."""
        return self._query(table, keys, recover=True)

    def _query(self, table: str, keys: list[int] | None, recover: bool) -> tuple[int, pa.Table]:
        """`query`; without ``recover``, the loss of a node is an error (the door's thread
        leaves recovering to the thread that pushes)."""
        if self._result is not None:
            raise UsageError("the session is closed")
        if self.keys is not None and table in self.keys.indexes:  # by natural key
            return self.keys.query(
                table, keys, lambda rows: self._query_placed(table, rows, recover)
            )
        return self._query_rows(table, keys, recover)

    def _query_placed(self, table: str, rows: np.ndarray, recover: bool) -> tuple[int, pa.Table]:
        """`_query_rows` of rows of a table of natural keys; a row that a unit not
        sequenced yet was given holds no key at the cut (all 0, `LIVE` included)."""
        placed = rows < self.partition.shares[0].placed(table)
        w, got = self._query_rows(table, rows[placed], recover)
        if placed.all():
            return w, got
        later = int((~placed).sum())
        zeros = pa.table({c: pa.array(np.zeros(later, np.int64)) for c in got.column_names})
        order = np.concatenate([np.flatnonzero(placed), np.flatnonzero(~placed)])
        return w, pa.concat_tables([got, zeros]).take(pa.array(np.argsort(order)))

    def _query_rows(self, table: str, keys: Any, recover: bool) -> tuple[int, pa.Table]:
        """`_query` of rows ``keys`` (the keys of a table of dense keys)."""
        size = self.plan.layout.sizes.get(table)
        if size is None:
            tables = ", ".join(self.plan.layout.sizes)
            raise UsageError(f"query: no table {table!r}; the tables are {tables}")
        wanted = np.arange(size) if keys is None else np.asarray(keys, np.int64).reshape(-1)
        bad = wanted[(wanted < 0) | (wanted >= size)]
        if len(bad):
            raise UsageError(f"query: key {int(bad[0])} is not a key of {table!r} (0..{size - 1})")
        owner = self.partition.owner_of(table, wanted)
        asked = [n for n in range(self.config.nodes) if (owner == n).any()]
        at: list[int] = []  # the cut: events submitted when the questions were

        def calls() -> list:
            at[:] = [self.ts]  # after a recovery too: the same events are submitted again
            return [self.teams[n].query.remote(table, wanted[owner == n].tolist()) for n in asked]

        answers = self._ask(calls, drain=False, recover=recover)
        w = at[0]
        if not answers:
            return w, self._empty_rows(table)
        position = np.concatenate([np.flatnonzero(owner == n) for n in asked])
        return w, pa.concat_tables(answers).take(pa.array(np.argsort(position)))

    def outputs(self, since: int = 0) -> Iterator[pa.RecordBatch]:
        """The output rows from ts ``since`` on, in ts order, as record batches
        (`StreamSession.outputs`): those of every event pushed before the call, each
        node's of the events whose home it is, once it has run every step submitted
        before (the same cut as `query`)."""
        if self._result is not None:
            raise UsageError("the session is closed")
        if not self.plan.output.progressive:
            raise UsageError("outputs() is for sessions; a one-shot run returns its Result")
        pieces = self._ask(lambda: [team.outputs.remote(since) for team in self.teams], drain=False)
        yield from self._merged(pieces).to_batches()

    def _merged(self, pieces: list[pa.Table]) -> pa.Table:
        """The nodes' outputs (global ts) as one table in ts order."""
        schema = output_schema(self.plan.topology)
        merged = (
            pa.concat_tables([p.cast(schema) for p in pieces]) if pieces else schema.empty_table()
        )
        return merged.take(pc.sort_indices(merged, [("ts", "ascending")]))

    def _empty_rows(self, table: str) -> pa.Table:
        columns = {"key": pa.array([], pa.int64())}
        columns |= {c: pa.array([], pa.int64()) for c in self.plan.tables[table]}
        return pa.table(columns)

    def close(self) -> Result:
        """Process everything pushed, merge and commit the outputs, stop every node; the
        `Result`."""
        if self._result is not None:
            return self._result
        try:
            outputs, state, node_metrics = self._finish()
            seconds = time.perf_counter() - self._begin
            metrics = self._metrics(outputs, node_metrics, seconds)
            metrics.update(self.extra_metrics)
            self._bar.close(metrics["throughput_eps"], metrics["seconds"])
            self._commit(outputs, state, metrics)
            self._result = Result(outputs, state, metrics)
            self._get([team.discard.remote() for team in self.teams])
        except BaseException:
            self._teardown(failed=True)
            raise
        self._teardown(failed=False)
        return self._result

    def _start(self, node_ids: list[str]) -> None:
        """A `NodeTeam` on each node, each with the init state of its own keys; with
        checkpoints, each resumes from its own (as of ``self.saved``)."""
        cfg = self.config
        options = {
            **{k: v for k, v in cfg.as_dict().items() if k not in ("topology", "nodes")},
            "address": None,
            "transport": "threads",
            "progress": False,
            "checkpoint_dir": None,
            "checkpoint_every": None,
            "metrics_port": None,  # the driver serves the run's
        }
        taken = cpus_before(hosts_of(node_ids), cfg.executors)
        for share, node_id, cpus_taken in zip(self.partition.shares, node_ids, taken, strict=True):
            node, output = share.node, None
            self.shipped[node] = {t: share.placed(t) for t in self.shipped[node]}
            if self.folder is not None:
                home = self.folder / f"node-{node}"
                options["checkpoint_dir"] = str(home)
                options["checkpoint_every"] = NEVER  # only when the driver says
                output = str(home / "output")
            init = {name: _own_init(t, share.own_keys(name)) for name, t in self.plan.init.items()}
            team = start_actor(
                NodeTeam,
                share,
                cfg.topology,
                dict(options),
                init,
                output,
                (self.saved.local[node], self.saved.round),
                cpus_taken,
                label=f"node {node}",
                node_id=node_id,
                concurrency_groups=TEAM_CONCURRENCY,
            )
            self.teams.append(team)
        addresses = self._get([team.address.remote() for team in self.teams])
        self._get([team.connect.remote(self.teams, addresses) for team in self.teams])
        resumed = self._get([team.resumed_from.remote() for team in self.teams])
        if resumed != self.saved.local:
            raise RuntimeFailure(
                f"the nodes resumed at events {resumed} of their own, not {self.saved.local}"
            )

    def _stop(self) -> None:
        stop_actors(self.teams)
        self.teams = []

    def _stop_and_wait(self) -> None:
        """Stop every node and wait until Ray reports each dead. Its process may outlive
        the report, still writing into its folder: its successor waits for that process
        to end before it reads there (`rounds.claim`)."""
        import ray

        teams = self.teams
        self._stop()
        deadline = time.monotonic() + self.config.timeout_s
        for team in teams:
            while time.monotonic() < deadline:
                try:
                    ray.get(team.resumed_from.remote(), timeout=1.0)
                except ray.exceptions.RayActorError:
                    break
                except ray.exceptions.GetTimeoutError:
                    continue
                time.sleep(0.05)

    def _advance(self, unit: _Unit) -> None:
        """Submit a unit; wait while too many are in flight; checkpoint when one is due."""
        if self.folder is not None:
            self.since.append(unit)
        self.unit_sizes.add(unit.n)
        self._submit_unit(unit)
        while len(self.in_flight) > UNITS_IN_FLIGHT:
            self._wait_oldest()
        if self.folder is not None and self.ts - self.saved.ts >= self.every:
            self._checkpoint()

    def _submit_unit(self, unit: _Unit) -> None:
        with self._lock:
            refs = self._submit(unit, self.ts)
            self.in_flight.append((time.perf_counter(), unit.n, refs))
            self.ts += unit.n

    def _wait_oldest(self) -> None:
        """Wait for the oldest unit in flight; recover if a node was lost."""
        try:
            self._complete(self.in_flight[0])
            _, events, _ = self.in_flight.popleft()
            self.done += events
        except ActorDied as lost:
            self._recover(lost)

    def _drain(self) -> None:
        while self.in_flight:
            self._wait_oldest()

    def _ask(self, calls: Callable[[], list], drain: bool = True, recover: bool = True) -> list:
        """The results of ``calls()``, calls to the nodes made (with ``drain``) once every
        submitted unit is done; after the loss of a node, made again once all are back (if
        ``recover``; else `ActorDied`)."""
        while True:
            if drain:
                self._drain()
            with self._lock:
                refs = calls()
            try:
                return self._get(refs)
            except ActorDied as lost:
                if not recover:
                    raise
                self._recover(lost)

    def _checkpoint(self) -> None:
        """Every node checkpoints once all submitted units are done (the same boundary)."""
        number = self.saved.round + 1
        begin = time.perf_counter()
        local = self._ask(lambda: [team.checkpoint.remote(number) for team in self.teams])
        self.saved = _Saved(self.ts, local, number)
        if self.keys is not None:  # every key the nodes' rows hold (`StreamKeys.arrays`)
            with open(self.folder / f"{KEYS_FILE}.tmp", "wb") as f:
                np.savez(f, **self.keys.arrays())
            (self.folder / f"{KEYS_FILE}.tmp").replace(self.folder / KEYS_FILE)
        meta = {**self._identity(), "ts": self.ts, "local": local, "round": number}
        meta["last_batch_id"] = self._inputs.position(self.ts)["last_batch_id"]
        written = self.folder / f"{NODES_META}.tmp"
        written.write_text(json.dumps(meta, indent=1))
        written.replace(self.folder / NODES_META)
        self.since = []
        self.checkpoints += 1
        self.checkpoint_seconds += time.perf_counter() - begin
        self.checkpointed_at = time.time()

    def _recover(self, lost: ActorDied) -> None:
        """Every node back to the last checkpoint, on the nodes alive; the units since it
        submitted again (see the class docstring). Only the thread that pushes recovers.
        Not ready meanwhile; failed if it cannot."""
        self._running = False
        try:
            self._restart(lost)
        except BaseException as exc:
            self._failure = exc
            raise
        self._running = True

    def _restart(self, lost: ActorDied) -> None:
        """`_recover`'s work, with the lock held."""
        with self._lock:
            if self.folder is None:
                raise lost
            stuck = [r for r in self.recoveries if r["from_ts"] == self.saved.ts]
            if len(stuck) >= MAX_RECOVERIES:
                raise lost
            begin = time.perf_counter()
            self.console.warn(f"recovering from the checkpoint at event {self.saved.ts:,}: {lost}")
            self.recoveries.append({"cause": str(lost)[:300], "from_ts": self.saved.ts})
            self._stop_and_wait()
            self.in_flight.clear()
            self.units_sent = [0] * self.config.nodes
            self.ts = self.done = self.saved.ts
            for attempt in range(MAX_RECOVERIES):
                try:
                    self._start(pick_nodes(self.config.nodes, share=True))
                    break
                except ActorDied:  # placed on a node the cluster did not know dead yet
                    self._stop_and_wait()
                    if attempt == MAX_RECOVERIES - 1:
                        raise
                    time.sleep(RESTART_PAUSE_S)
            for unit in self.since:
                self._submit_unit(unit)
            self.recoveries[-1]["seconds"] = round(time.perf_counter() - begin, 3)

    def _submit(self, whole: _Unit, ts0: int) -> list:
        """Submit every node's steps of a sequenced piece (`_pieces`) that starts at
        ``ts0``, one call per node that has any; the references of the calls, to wait
        for."""
        unit = whole.planned
        f = self.figures
        f["units"] += 1
        f["unit_levels_max"] = max(f["unit_levels_max"], len(unit.steps))
        f["cross"] += unit.cross
        f["gathered_units"] += unit.gathered
        for name, count in counts(unit).items():
            f[name] += count
        refs = []
        for node, team in enumerate(self.teams):
            mine = [(at, lv[node]) for at, lv in enumerate(unit.steps) if lv[node] is not None]
            if not mine:
                continue
            positions = np.concatenate([step.events for _, step in mine])
            rows, take = (
                whole.rows(node, positions, unit.gathered) if len(positions) else (None, None)
            )
            steps = [
                NodeStep(
                    at,
                    len(step.events),
                    ts0 + step.events,
                    unit.home[step.events] == node,
                    step.receive,
                    step.send,
                )
                for at, step in mine
            ]
            refs.append(
                team.run.remote(
                    self.units_sent[node],
                    self.units_submitted,
                    rows,
                    take,
                    steps,
                    self._placed_since(node),
                )
            )
            self.units_sent[node] += 1
        self.units_submitted += 1
        return refs

    def _placed_since(self, node: int) -> dict[str, np.ndarray]:
        """The node of every row of a table of natural keys given since ``node`` was last
        told (`NodeTeam.run` places them)."""
        placed = {}
        for table, shipped in self.shipped[node].items():
            owner, _ = self.partition.shares[0].owners(table)
            if len(owner) > shipped:
                placed[table] = owner[shipped:].copy()
                self.shipped[node][table] = len(owner)
        return placed

    def _complete(self, unit: tuple[float, int, list]) -> None:
        """Wait for a unit's steps; its events' latency from the moment it was sequenced."""
        submitted, events, refs = unit
        self._get(refs)
        self.latency.add(np.full(events, time.perf_counter() - submitted))

    def _finish(self) -> tuple[pa.Table, dict[str, pa.Table], list[dict]]:
        """Every node's outputs (those of its home events, with their global ts) merged in
        ts order, every table with each key's values from the node that owns it, and the
        nodes' own metrics."""
        results = self._ask(lambda: [team.results.remote() for team in self.teams])
        merged = self._merged([events for events, _, _ in results])
        columns: dict[str, dict[str, np.ndarray]] = {}
        for name, first in results[0][1].items():
            size = self.plan.layout.sizes[name]
            columns[name] = {}
            for column in first.column_names[1:]:
                values = np.zeros(size, np.int64)
                for (_, tables, _), share in zip(results, self.partition.shares, strict=True):
                    values[share.own_keys(name)] = tables[name].column(column).to_numpy()
                columns[name][column] = values
        state = with_keys(self.plan.layout, columns, self.keys.indexes if self.keys else None)
        return merged, state, [m for _, _, m in results]

    def _metrics(self, outputs: pa.Table, nodes: list[dict], seconds: float) -> dict:
        counts = dict.fromkeys(STATUS_NAMES, 0)
        for c in pc.value_counts(outputs.column("status")).to_pylist():
            counts[c["values"]] = c["counts"]
        events = outputs.num_rows
        return {
            "events": events,
            **counts,
            "seconds": round(seconds, 6),
            "throughput_eps": round((events - self.resumed_from) / seconds, 1)
            if seconds > 0
            else None,
            "latency_ms": {f"p{q}": self.latency.percentile_ms(q) for q in (50, 99)},
            "startup_s": round(self.startup_s, 3),
            "phases_s": dict(self.console.phases),
            "nodes": {
                **self.figures,
                "per_node": nodes,
            },
            "recoveries": self.recoveries,
            "checkpoints": {"written": self.checkpoints} if self.folder is not None else None,
            "config": {
                **self.config.as_dict(),
                "pushed": events,
                "resumed_from": self.resumed_from,
            },
        }

    def _commit(self, outputs: pa.Table, state: dict[str, pa.Table], metrics: dict) -> None:
        """The output as a run on one host commits it: events in one file (a one-shot
        run) or one part (a session, whose parts are committed only now)."""
        out = self.plan.output
        written = out.temporary / part_name(0)
        pq.write_table(outputs, written)
        out.stage_part(written, 0)
        out.commit(state, json.dumps(metrics, indent=2) + "\n")
        if self.folder is not None:
            self.plan.store.mark_complete()
            (self.folder / NODES_META).unlink(missing_ok=True)
            (self.folder / KEYS_FILE).unlink(missing_ok=True)
            for node in self.folder.glob("node-*"):
                shutil.rmtree(node)

    def _get(self, refs: Any) -> Any:
        import ray

        try:
            return ray.get(refs, timeout=self.config.timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise RuntimeFailure(f"no progress within {self.config.timeout_s} s") from exc
        except ray.exceptions.RayError as exc:
            raise actor_failure(exc) from exc


def _highest(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Every key's highest count of ``a`` and ``b``, in the order first seen."""
    return {key: max(a.get(key, 0), b.get(key, 0)) for key in {**a, **b}}


def _own_init(table: pa.Table, own: np.ndarray) -> pa.Table:
    """The rows of ``table`` (an init table) among a node's ``own`` rows: those of a table
    of natural keys given since (a node started again after new keys) hold no init."""
    return table.take(own[own < table.num_rows])
