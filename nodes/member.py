"""One node of a run over several: a Ray actor on that node whose process runs a session of
its own (`txstream.session.Session`) — the team, as threads pinned to the node's cores, over
state in the node's own shared memory.

A node's state holds its own keys (`txstream.state.layout.NodeShare`), then rows for the
other nodes' keys that a step's cross transactions touch: each step, the values sent to it
(`txstream.nodes.sequencer`) take those rows, and what the transactions write there is
dropped with them. The driver calls `run` once per unit with the node's whole part of it
(its steps: which events at which level, what to install, what to send to whom), without
waiting; units run in the order given (a sequence number checks it), the node looping over
its levels. The values a step sends go straight to the nodes that need them (`deliver`,
a call of one actor on another, served on a thread of its own while a step runs), never
through the driver: a step waits only for the values it reads, not for the other nodes'
steps of its level. A step whose values do not come (their sender lost) fails, and the
run recovers.

A step of few events runs in place (`Session.in_place`): not pushed through the
session's pipeline, whose hand-offs would cost more than its work; the node keeps their
outputs itself. When the node has room for every other node's key its unit's steps
receive, those are given rows once for the unit, and the statements of all its steps that
run in place are built once, each step running its range of them.

The node knows each of its pushed events' place in the whole input (global ts) and
whether its output is the one that counts (the event's home is this node); with
checkpoints, it writes them beside each checkpoint (``ts-<local ts>.npz``), and the
outputs of the events run in place since the one before (``in-place-<round>.parquet``), so
that a resumed node still has them for the events its checkpoint covers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
from txstream import topologies
from txstream.actors.executor import output_schema
from txstream.cluster.topology import keep_freed_memory
from txstream.cluster.transport import ThreadTransport
from txstream.config import RunConfig
from txstream.connectors.outputs import part_first_ts, read_events
from txstream.engine.live import outcomes
from txstream.engine.plan import plan
from txstream.errors import RuntimeFailure
from txstream.monitor.console import Console
from txstream.nodes import rounds
from txstream.nodes.mail import Link, Listener, Mailbox, host
from txstream.session import InPlace, Session
from txstream.state.layout import Layout, NodeShare

IN_PLACE_EVENTS = 1024
"""A step of at most this many events runs in place: below it, the pipeline's hand-offs
(push, ProgressController, the executors' barriers, Sink) cost more than the work."""
IN_PLACE = "in-place-"
"""Beside a node's checkpoints: the outputs of the events it ran in place, per round."""
MAIL = "mail"
"""The concurrency group of `NodeTeam.deliver`: values arrive while a step runs."""
CONCURRENCY = {MAIL: 1}


@dataclass(frozen=True)
class NodeStep:
    """What a node does in one level of a unit (`txstream.nodes.sequencer.Step`, as the
    driver sends it): the next ``count`` of its events of the unit, at ``global_ts`` in
    the input (``home``: whether their outputs count here), after installing the cells
    it ``receive``s, then ``send``."""

    at: int
    count: int
    global_ts: np.ndarray
    home: np.ndarray
    receive: list[tuple[int, np.ndarray]]
    send: list[tuple[int, np.ndarray]]


class NodeTeam:
    """A node's session (module docstring): ``share``: the keys it holds (``init`` has
    those rows); ``options`` are the run's `RunConfig` fields as this node runs them;
    ``output``: where its session writes (None: a temporary folder); ``back_to``: with
    checkpoints, the (own events, round) of the one it resumes from (`rounds.take_back`);
    ``cpus_taken``: CPUs of this host that the teams of the nodes before it take
    (`txstream.cluster.nodes.cpus_before`), its executors pinned past them."""

    def __init__(
        self,
        share: NodeShare,
        topology: str,
        options: dict[str, Any],
        init: dict[str, pa.Table],
        output: str | None,
        back_to: tuple[int, int] = (0, 0),
        cpus_taken: int = 0,
    ):
        keep_freed_memory()
        self.node = share.node
        config = RunConfig(topology=topology, **options)
        self.folder = Path(config.checkpoint_dir) if config.checkpoint_dir else None
        if self.folder is not None:  # once the node before is gone: it wrote there
            self._folder_lock = rounds.claim(self.folder, config.timeout_s)
            rounds.take_back(self.folder, *back_to)
        self.topology = topologies.get(topology, config.key_type)
        self.whole = Layout.of(self.topology.tables, share.sizes)
        """The layout of every key, in which the driver names cells."""
        planned = plan(
            config, init, Path(output) if output else None, share=share, cpus_taken=cpus_taken
        )
        self.layout = planned.layout
        self.session = Session(planned, console=Console(enabled=False), transport=ThreadTransport())
        self.next_unit = 0
        self.steps = 0
        self.step_seconds = 0.0
        """Spent in steps once their values arrived: the rest of a level's time is Ray's
        (calls, values between nodes)."""
        self.global_ts: list[np.ndarray] = []
        self.home: list[np.ndarray] = []
        self.written = 0
        """Events whose global ts are written beside a checkpoint."""
        self.in_place: list[pa.Table] = []
        """Output rows (global ts) of the events run in place whose home is this node."""
        self.in_place_written = 0
        """Of `in_place`, those written beside a checkpoint."""
        self.statuses: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        """Of the events whose home is this node, those counted so far (`outcomes`)."""
        self._counted_parts: set[str] = set()
        self._counted_in_place = 0
        self.peers: list[Any] = []
        """Every node's team (`connect`), this one's included."""
        self.mailbox = Mailbox(self.node, config.timeout_s)
        self.host = host()
        self.listener = Listener(self.mailbox) if self.host is not None else None
        self.links: list[Link | None] = []
        """To each node of this host, a socket (`connect`); None: by actor call."""
        if self.session.resumed_from:
            self._load_positions(self.session.resumed_from)
        if self.folder is not None:
            resumed = planned.resume
            self._load_in_place(rounds.round_of(resumed.path) if resumed else 0)

    def resumed_from(self) -> int:
        """Events of this node's own input that its checkpoint covered (0: a fresh start)."""
        return self.session.resumed_from

    def _load_positions(self, upto: int) -> None:
        """Global ts and home flags of the first ``upto`` events, from the files written
        beside the checkpoints (later ones, of a checkpoint not every node took, go)."""
        for path in sorted(self.folder.glob("ts-*.npz")):
            if int(path.stem[len("ts-") :]) > upto:
                path.unlink()
                continue
            with np.load(path) as saved:
                self.global_ts.append(saved["ts"])
                self.home.append(saved["home"])
        self.written = sum(len(ts) for ts in self.global_ts)
        if self.written != upto:
            raise RuntimeFailure(
                f"node {self.node}: the positions beside its checkpoints cover {self.written} "
                f"events, its checkpoint {upto}"
            )

    def _load_in_place(self, number: int) -> None:
        """The outputs of the events run in place up to round ``number``, from the files
        beside the checkpoints (those of later rounds go)."""
        for path in sorted(self.folder.glob(f"{IN_PLACE}*.parquet")):
            if int(path.stem[len(IN_PLACE) :]) > number:
                path.unlink()
            else:
                self.in_place.append(pq.read_table(path))
        self.in_place_written = len(self.in_place)

    def address(self) -> tuple[str | None, str | None]:
        """Where nodes of this host reach this one's socket: (`host`, name)."""
        return self.host, self.listener.name if self.listener is not None else None

    def connect(self, peers: list[Any], addresses: list[tuple[str | None, str | None]]) -> None:
        """Every node's team and `address`, in node order: where a step sends values (by
        socket to the nodes of this host, by actor call to the others)."""
        self.peers = peers
        self.links = [
            Link(name) if to != self.node and self.host is not None and where == self.host else None
            for to, (where, name) in enumerate(addresses)
        ]

    @ray.method(concurrency_group=MAIL)
    def deliver(self, level: tuple[int, int], source: int, values: np.ndarray) -> None:
        """The values node ``source`` sends for this node's step of ``level`` (unit,
        level)."""
        self.mailbox.put((*level, source), values)

    def _send(self, to: int, level: tuple[int, int], values: np.ndarray) -> None:
        """``values`` to node ``to`` for its step of ``level`` (unit, level). A socket
        that fails (its node lost) is not used again: the actor call to a lost node is
        dropped too, and the run recovers."""
        link = self.links[to]
        if link is not None:
            try:
                link.send((*level, self.node), values)
                return
            except OSError:
                self.links[to] = None
        self.peers[to].deliver.remote(level, self.node, values)

    def run(
        self,
        seq: int,
        unit: int,
        events: pa.Table | None,
        take: np.ndarray | None,
        steps: list[NodeStep],
        placed: dict[str, np.ndarray],
    ) -> None:
        """This node's part of unit ``seq`` (``unit`` names its values between nodes):
        place the new rows of tables of natural keys (``placed``: the node of each,
        `NodeShare.place`), then run ``steps`` in turn, each on the next of ``events``
        (its rows ``take``, if given), waiting only for the values it reads."""
        if seq != self.next_unit:
            raise RuntimeFailure(
                f"node {self.node} was given unit {seq}, expected {self.next_unit}"
            )
        for table, owner in placed.items():
            self.layout.share.place(table, owner)
        if take is not None:
            events = events.take(take)
        first = np.cumsum([0] + [step.count for step in steps])[:-1]
        received = [cells for step in steps for _, cells in step.receive]
        held = not received or self._hold(np.concatenate(received), check=True)
        small = [held and 0 < step.count <= IN_PLACE_EVENTS for step in steps]
        in_place = None
        if any(small):  # their statements built once
            chosen = [
                np.arange(begin, begin + step.count)
                for begin, step, alone in zip(first, steps, small, strict=True)
                if alone
            ]
            in_place = self.session.in_place(events.take(np.concatenate(chosen)))
        ran = 0
        for step, begin, alone in zip(steps, first, small, strict=True):
            rows = events.slice(begin, step.count) if step.count else None
            run = (in_place, ran) if alone else None
            self._step((unit, step.at), rows, step, held, run)
            ran += step.count if alone else 0
        if in_place is not None:
            mine = [step for step, alone in zip(steps, small, strict=True) if alone]
            self._keep_in_place(
                pa.Table.from_batches([in_place.rows()]),
                np.concatenate([step.global_ts for step in mine]),
                np.concatenate([step.home for step in mine]),
            )
        self.next_unit += 1

    def _step(
        self,
        level: tuple[int, int],
        events: pa.Table | None,
        step: NodeStep,
        held: bool,
        prepared: tuple[InPlace, int] | None,
    ) -> None:
        """The step of ``level`` (unit, level): install the values of the cells it
        receives once their nodes delivered them (rows for other nodes' keys among them
        given now unless ``held`` for the whole unit), run ``events`` to the end (those of
        ``prepared`` from its given first one, if given), then send the cells it sends to
        their nodes' next level."""
        session = self.session
        receive, home, global_ts = step.receive, step.home, step.global_ts
        values = self.mailbox.take(*level, [source for source, _ in receive])
        begin = time.perf_counter()
        if receive:
            cells = np.concatenate([cells for _, cells in receive])
            local = self._local(*self.whole.locate(cells)) if held else self._hold(cells)
            session.set_cells(local, np.concatenate(values))
        if prepared is not None:
            in_place, first = prepared
            in_place.run(first, first + step.count)
        elif events is not None and events.num_rows <= IN_PLACE_EVENTS:
            in_place = session.in_place(events)
            in_place.run(0, events.num_rows)
            self._keep_in_place(pa.Table.from_batches([in_place.rows()]), global_ts, home)
        elif events is not None:
            session.push(events)
            self.global_ts.append(global_ts)
            self.home.append(home)
            session.drain()
        self.steps += 1
        unit, at = level
        for to, cells in step.send:
            values = session.read_cells(self._local(*self.whole.locate(cells)))
            self._send(to, (unit, at + 1), values)
        self.step_seconds += time.perf_counter() - begin

    def _keep_in_place(self, rows: pa.Table, global_ts: np.ndarray, home: np.ndarray) -> None:
        """The output rows of events run in place (at ``global_ts``) whose ``home`` is
        this node."""
        rows = rows.filter(pa.array(home))
        self.in_place.append(rows.set_column(0, "ts", pa.array(global_ts[home])))

    def _hold(self, cells: np.ndarray, check: bool = False) -> np.ndarray | bool:
        """Rows for the other nodes' keys among ``cells`` (of `whole`), until the next
        hold; the cells of this node's state that hold them, or hold its own keys among
        them. With ``check``: whether the node has room for all of them (if not, none is
        given a row)."""
        columns, where, keys = self.whole.locate(cells)
        names = list(self.whole.stored)
        span = max(self.whole.sizes.values()) + 1
        table = np.array([names.index(t) for t, _ in columns])[where]
        held = np.sort(table * span + keys)  # (table, key) as one number
        held = held[np.diff(held, prepend=-1) != 0]
        bounds = np.searchsorted(held, np.arange(len(names) + 1) * span)
        share = self.layout.share
        wanted = {}
        for number, name in enumerate(names):
            keys_held = held[bounds[number] : bounds[number + 1]] - number * span
            wanted[name] = keys_held[share.others(name, keys_held)]
        if check and any(len(k) > share.foreign_rows(name) for name, k in wanted.items()):
            return False
        for name, keys_held in wanted.items():
            share.hold(name, keys_held)
        return True if check else self._local(columns, where, keys)

    def _local(self, columns: list[tuple[str, str]], where: np.ndarray, keys: np.ndarray):
        """The cells of this node's state that hold the cells of `whole` that
        `Layout.locate` gave as ``columns``, ``where`` and ``keys``."""
        local = np.empty_like(keys)
        for j, (table, column) in enumerate(columns):
            at = where == j
            if at.any():
                local[at] = self.layout.cells_of(table, column, keys[at])
        return local

    def checkpoint(self, number: int) -> int:
        """A checkpoint of this node's state as of every step so far, of round ``number``
        (`txstream.nodes.rounds`), the global ts of the events since the previous one
        written first; its ts on this node."""
        session = self.session
        session.drain()
        if len(self.in_place) > self.in_place_written:
            path = self.folder / f"{IN_PLACE}{number:06d}.parquet"
            pq.write_table(pa.concat_tables(self.in_place[self.in_place_written :]), path)
            self.in_place_written = len(self.in_place)
        if session.pushed > self.written:
            ts, home = np.concatenate(self.global_ts), np.concatenate(self.home)
            self.global_ts, self.home = [ts], [home]
            path = self.folder / f"ts-{session.pushed:012d}.npz"
            with open(path.with_suffix(".tmp"), "wb") as f:
                np.savez(f, ts=ts[self.written :], home=home[self.written :])
            path.with_suffix(".tmp").replace(path)
            self.written = session.pushed
        rounds.keep_aside(self.folder, session.pushed)
        ts = session.checkpoint()
        rounds.mark(self.folder, ts, number)
        return ts

    def query(self, table: str, keys: list[int] | np.ndarray) -> pa.Table:
        """Rows of ``table`` as of every step so far (the caller asks only for its keys):
        read from the state itself once the team is idle, with no snapshot to wait for
        (before the first step there is none; and the values of its cells sent back after
        a gathered unit are in none)."""
        session, wanted = self.session, np.asarray(keys, np.int64)
        session.drain()
        rows = {"key": pa.array(wanted)}
        for column in session.plan.tables[table]:
            rows[column] = pa.array(session.read_cells(self.layout.cells_of(table, column, wanted)))
        return pa.table(rows)

    def results(self) -> tuple[pa.Table, dict[str, pa.Table], dict]:
        """Once every step ran: the outputs of the events whose home is this node (their ts
        that of the whole input), its own keys of every table, and figures of its steps
        and state (``rows``: rows of every table it holds, its own and room for others';
        ``cpus``: the CPU each of its executors is pinned to).
        Nothing is committed or closed: if a node is lost before the driver has merged
        every node's results, all go back to their checkpoints."""
        session = self.session
        mine = self.outputs()
        state = {table: self.query(table, self.layout.keys(table)) for table in session.plan.tables}
        figures = {
            "events": session.pushed,
            "steps": self.steps,
            "step_s": round(self.step_seconds, 3),
            "rows": self.layout.rows,
            "cpus": [cpu for _, cpu in session.plan.cores],
        }
        return mine, state, figures

    def outputs(self, since: int = 0) -> pa.Table:
        """The outputs of the events whose home is this node, from global ts ``since`` on,
        with their global ts; committed first (as of every step so far)."""
        session = self.session
        session.flush()
        global_ts = np.concatenate(self.global_ts or [np.zeros(0, np.int64)])
        wanted = global_ts >= since  # a step's events may be of earlier ones' ts
        first = int(np.argmax(wanted)) if wanted.any() else len(wanted)
        batches = list(session.outputs(first))
        events = (
            pa.Table.from_batches(batches)
            if batches
            else output_schema(self.topology).empty_table()
        )
        local = events.column("ts").to_numpy()
        keep = np.concatenate(self.home or [np.zeros(0, bool)])[local] & wanted[local]
        mine = events.filter(pa.array(keep))
        mine = mine.set_column(0, "ts", pa.array(global_ts[local[keep]]))
        if not self.in_place:
            return mine
        in_place = pa.concat_tables(self.in_place).cast(mine.schema)
        return pa.concat_tables([mine, in_place.filter(pc.greater_equal(in_place["ts"], since))])

    def outcomes(self) -> tuple[dict[str, int], dict[str, int]]:
        """Of the events whose home is this node, as of every step so far: how many by
        status, and the rejected ones by reason (what the driver's live metrics read).
        Each committed part and each in-place step is read once."""
        session = self.session
        session.flush()
        home = np.concatenate(self.home or [np.zeros(0, bool)])
        schema = output_schema(self.topology)
        for part in session.plan.output.parts():
            if part.name in self._counted_parts:
                continue
            rows = read_events([part], schema, ["status", "reason"])
            first = part_first_ts(part.name)
            self._count(rows.filter(pa.array(home[first : first + rows.num_rows])))
            self._counted_parts.add(part.name)
        for rows in self.in_place[self._counted_in_place :]:  # home events only
            self._count(rows)
        self._counted_in_place = len(self.in_place)
        return dict(self.statuses), dict(self.reasons)

    def _count(self, rows: pa.Table) -> None:
        statuses, reasons = outcomes(rows)
        self.statuses.update(statuses)
        self.reasons.update(reasons)

    def discard(self) -> None:
        """Stop this node's session without committing anything (its results were merged),
        and its sockets."""
        self.session.abandon()
        for link in self.links:
            if link is not None:
                link.close()
        if self.listener is not None:
            self.listener.close()
