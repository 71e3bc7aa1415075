"""Spark input over several nodes, without the driver process in the way of the events.

Each Spark partition, converted to Arrow on a Spark executor, is prepared by a Ray task
(`prepare_partition`): it puts the rows in input order, conforms them to the topology's
schema, learns every transaction's cells and makes one table per node, of the events that
node takes part in. The driver gets only the cells and who takes part (16 to 40 bytes an
event, against the whole row), sequences them, and hands each node's steps a reference to
its table and which of its rows to run: the rows go between object stores, never through
the driver's process.

The task runs on the driver's Ray node, so its tables live in that node's object store:
a recovery after the loss of another node runs the units since the checkpoint again from
the same tables, instead of Ray rebuilding them from partitions that may have gone with a
Spark executor on that node (found failing a recovery, 1 run in 16, before).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from txstream import topologies
from txstream.connectors.spark import partition_table
from txstream.nodes.sequencer import participants, touched_cells
from txstream.state.layout import Layout
from txstream.topologies.api import conform_events


@dataclass(frozen=True)
class Prepared:
    """What the driver gets of a prepared partition: its ``rows`` events, whose input
    positions span ``first..last`` (-1: none), their cells (`touched_cells`) and a bit per
    node taking part in each (`participants`)."""

    rows: int
    first: int
    last: int
    txn: np.ndarray
    cells: np.ndarray
    mask: np.ndarray


def prepare_partition(
    topology: str, sizes: dict[str, int], nodes: int, schema: pa.Schema, chunk: pa.Buffer | str
) -> tuple:
    """A Spark source's chunk (its Arrow IPC stream, or its file's path on this node:
    `SparkSource.partitions`) as `Prepared`, followed by one table per node: the events it
    takes part in, in input order, and the table of all (for a unit gathered on one node;
    a Ray task, see the module docstring)."""
    spec = topologies.get(topology)
    layout = Layout.of(spec.tables, sizes)
    table, first, last = partition_table(chunk, schema)
    events = conform_events(table, spec.event_schema)
    txn, cells = touched_cells(spec, layout, events)
    mask = participants(layout, nodes, events.num_rows, txn, cells)
    parts = [events.take(np.flatnonzero((mask >> node) & 1)) for node in range(nodes)]
    return (Prepared(events.num_rows, first, last, txn, cells, mask), *parts, events)
