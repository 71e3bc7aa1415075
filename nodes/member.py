"""One node of a run over several: a Ray actor on that node whose process runs a session of
its own (`txstream.session.Session`) — the team, as threads pinned to the node's cores, over
state in the node's own shared memory.

Every node's state has every key, but a node keeps only its own partition current: the
other rows hold the values it was last sent (`txstream.nodes.sequencer`), read by cross
transactions only. The driver calls `step` once per level with the node's events of that
level; steps run in the order given (a sequence number checks it): a step whose input from
another node was lost fails, and so do the ones after it, until the run recovers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from txstream.cluster.topology import keep_freed_memory
from txstream.cluster.transport import ThreadTransport
from txstream.config import RunConfig
from txstream.engine.plan import plan
from txstream.errors import RuntimeFailure
from txstream.monitor.console import Console
from txstream.session import Session


class NodeTeam:
    """A node's session (module docstring): ``options`` are the run's `RunConfig` fields
    as this node runs them; ``output``: where its session writes (None: a temporary
    folder)."""

    def __init__(
        self,
        node: int,
        topology: str,
        options: dict[str, Any],
        init: dict[str, pa.Table],
        output: str | None,
    ):
        keep_freed_memory()
        self.node = node
        config = RunConfig(topology=topology, **options)
        planned = plan(config, init, Path(output) if output else None)
        self.session = Session(planned, console=Console(enabled=False), transport=ThreadTransport())
        self.next_step = 0

    def resumed_from(self) -> int:
        """Events of this node's own input that its checkpoint covered (0: a fresh start)."""
        return self.session.resumed_from

    def step(
        self,
        seq: int,
        events: pa.Table | None,
        receive: np.ndarray,
        send: list[np.ndarray],
        *values: np.ndarray,
    ) -> Any:
        """Step ``seq``: install ``values`` (from other nodes) into the cells ``receive``,
        run ``events`` to the end, then read the cells of ``send`` (one array per node to
        send to). Returns the values read: one array per entry of ``send``, or None."""
        if seq != self.next_step:
            raise RuntimeFailure(
                f"node {self.node} was given step {seq}, expected {self.next_step}"
            )
        session = self.session
        if len(receive):
            session.set_cells(receive, np.concatenate(values))
        if events is not None and events.num_rows:
            session.push(events)
            session.drain()
        self.next_step += 1
        out = [session.read_cells(cells) for cells in send]
        if not out:
            return None
        return out[0] if len(out) == 1 else tuple(out)

    def checkpoint(self) -> int:
        """A checkpoint of this node's state as of every step so far; its ts on this node."""
        return self.session.checkpoint()

    def query(self, table: str, keys: list[int]) -> pa.Table:
        """Rows of ``table`` as of every step so far (the caller asks only for its keys)."""
        self.session.drain()
        return self.session.query(table, keys)[1]

    def finish(self) -> tuple[pa.Table, dict[str, pa.Table], dict]:
        """Close the session: this node's outputs (ts = position in its own input), every
        table as its state has it, and its metrics."""
        result = self.session.close()
        return result.events, result.state, result.metrics
