"""One node of a run over several: a Ray actor on that node whose process runs a session of
its own (`txstream.session.Session`) — the team, as threads pinned to the node's cores, over
state in the node's own shared memory.

A node's state holds its own keys (`txstream.state.layout.NodeShare`), then rows for the
other nodes' keys that a step's cross transactions touch: each step, the values sent to it
(`txstream.nodes.sequencer`) take those rows, and what the transactions write there is
dropped with them. The driver calls `step` once per level with the node's events of that
level; steps run in the order given (a sequence number checks it): a step whose input from
another node was lost fails, and so do the ones after it, until the run recovers.

The node knows each of its events' place in the whole input (global ts) and whether its
output is the one that counts (the event's home is this node); with checkpoints, it
writes them beside each checkpoint (``ts-<local ts>.npz``), so that a resumed node still
knows them for the events its checkpoint covers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from txstream import topologies
from txstream.actors.executor import output_schema
from txstream.cluster.topology import keep_freed_memory
from txstream.cluster.transport import ThreadTransport
from txstream.config import RunConfig
from txstream.engine.plan import plan
from txstream.errors import RuntimeFailure
from txstream.monitor.console import Console
from txstream.nodes import rounds
from txstream.session import Session
from txstream.state.layout import Layout, NodeShare


class NodeTeam:
    """A node's session (module docstring): ``share``: the keys it holds (``init`` has
    those rows); ``options`` are the run's `RunConfig` fields as this node runs them;
    ``output``: where its session writes (None: a temporary folder)."""

    def __init__(
        self,
        share: NodeShare,
        topology: str,
        options: dict[str, Any],
        init: dict[str, pa.Table],
        output: str | None,
    ):
        keep_freed_memory()
        self.node = share.node
        self.topology = topologies.get(topology)
        self.whole = Layout.of(self.topology.tables, share.sizes)
        """The layout of every key, in which the driver names cells."""
        config = RunConfig(topology=topology, **options)
        planned = plan(config, init, Path(output) if output else None, share=share)
        self.layout = planned.layout
        self.session = Session(planned, console=Console(enabled=False), transport=ThreadTransport())
        self.next_step = 0
        self.step_seconds = 0.0
        """Spent in steps: the rest of a level's time is Ray's (calls, values between nodes)."""
        self.folder = Path(config.checkpoint_dir) if config.checkpoint_dir else None
        self.global_ts: list[np.ndarray] = []
        self.home: list[np.ndarray] = []
        self.written = 0
        """Events whose global ts are written beside a checkpoint."""
        if self.session.resumed_from:
            self._load_positions(self.session.resumed_from)

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

    def step(
        self,
        seq: int,
        events: pa.Table | None,
        take: np.ndarray | None,
        global_ts: np.ndarray,
        home: np.ndarray,
        receive: np.ndarray,
        send: list[np.ndarray],
        *values: np.ndarray,
    ) -> Any:
        """Step ``seq``: install ``values`` (from other nodes) into the cells ``receive``,
        run ``events`` (its rows ``take``, if given; at ``global_ts`` in the input; ``home``:
        whether their outputs count here) to the end, then read the cells of ``send`` (one
        array per node to send to). Returns the values read: one array per entry of
        ``send``, or None."""
        begin = time.perf_counter()
        if seq != self.next_step:
            raise RuntimeFailure(
                f"node {self.node} was given step {seq}, expected {self.next_step}"
            )
        session = self.session
        if len(receive):
            session.set_cells(self._install(receive), np.concatenate(values))
        if take is not None:
            events = events.take(take)
        if events is not None and events.num_rows:
            session.push(events)
            self.global_ts.append(global_ts)
            self.home.append(home)
            session.drain()
        self.next_step += 1
        out = [session.read_cells(self._local(*self.whole.locate(cells))) for cells in send]
        self.step_seconds += time.perf_counter() - begin
        if not out:
            return None
        return out[0] if len(out) == 1 else tuple(out)

    def _install(self, cells: np.ndarray) -> np.ndarray:
        """Rows for the other nodes' keys among ``cells`` (of `whole`), for this step; the
        cells of this node's state that hold them, or hold its own keys among them."""
        columns, where, keys = self.whole.locate(cells)
        names = list(self.whole.stored)
        span = max(self.whole.sizes.values()) + 1
        table = np.array([names.index(t) for t, _ in columns])[where]
        held = np.sort(table * span + keys)  # (table, key) as one number
        held = held[np.diff(held, prepend=-1) != 0]
        bounds = np.searchsorted(held, np.arange(len(names) + 1) * span)
        share = self.layout.share
        for number, name in enumerate(names):
            keys_held = held[bounds[number] : bounds[number + 1]] - number * span
            share.hold(name, keys_held[share.others(keys_held)])
        return self._local(columns, where, keys)

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
        and state (``rows``: rows of every table it holds, its own and room for others').
        Nothing is committed or closed: if a node is lost before the driver has merged
        every node's results, all go back to their checkpoints."""
        session = self.session
        mine = self.outputs()
        state = {table: self.query(table, self.layout.keys(table)) for table in session.plan.tables}
        figures = {
            "events": session.pushed,
            "steps": self.next_step,
            "step_s": round(self.step_seconds, 3),
            "rows": self.layout.rows,
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
        return mine.set_column(0, "ts", pa.array(global_ts[local[keep]]))

    def discard(self) -> None:
        """Stop this node's session without committing anything (its results were merged)."""
        self.session.abandon()
