"""A session's plan: everything checked before anything starts.

The topology, the init state, the cores, the output folder and a checkpoint to resume from
are checked here, in the driver, so that a mistake is one clear error before Ray, Spark or
shared memory exist (`plan`); the `Plan` then holds what the engine needs to start.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from txstream import topologies
from txstream.cluster.scratch import own_output_dir
from txstream.cluster.topology import host_topology
from txstream.config import RunConfig
from txstream.connectors.outputs import OutputDir
from txstream.connectors.sources import ArrowSource
from txstream.errors import UsageError
from txstream.state.checkpoints import Checkpoint, CheckpointStore
from txstream.state.init import InitState, key_indexes, key_type_of, read_init_state
from txstream.state.keys import DENSE, KeyIndex
from txstream.state.layout import Layout, NodeShare
from txstream.state.values import ValueType
from txstream.topologies.api import Topology

EXTRA_KEYS = 1 << 16
"""Keys a table of natural keys may gain beyond twice its init keys, by default: every
row is copied into each query snapshot, so room costs throughput."""
DEFAULT_SET_CAPACITY = 1 << 20
"""Distinct-set slots when the number of events is not known in advance (a session)."""
FORMAT = 2
"""Version of the checkpoint metadata this build writes and reads."""


@dataclass
class Plan:
    """A session checked and ready to start; nothing is running yet."""

    config: RunConfig
    topology: Topology
    init: dict[str, pa.Table]
    layout: Layout
    cores: list[tuple[int, int]]
    output: OutputDir
    own_output: bool
    """The output is a private temporary folder (no output asked for): removed at the end."""
    name: str | None
    expected_events: int | None = None
    input: dict[str, Any] | None = None
    """What identifies a one-shot run's input (checkpoints of another input are refused)."""
    store: CheckpointStore | None = None
    resume: Checkpoint | None = None
    """The checkpoint of an interrupted run this session continues from."""
    keys: dict[str, KeyIndex] | None = None
    """The key index of every table of natural keys, holding its init keys."""
    queryable: bool = True
    """Outside readers may query the state while it runs: the engine keeps snapshots of
    it for them (`txstream.state.snapshots`). A one-shot run without a name has none."""

    @property
    def label(self) -> str:
        """What names the run to a person (its metrics, its actors in Ray's dashboard):
        its name, or ``run-<pid>``."""
        return self.name or f"run-{os.getpid()}"

    def take_init(self) -> dict[str, pa.Table]:
        """The init tables, which the plan then forgets: once in the state, a copy kept
        alive would double a run's memory for as long as it runs."""
        init, self.init = self.init, {}
        return init

    @property
    def tables(self) -> dict[str, list[str]]:
        """The value columns of every table, by table name (and `LIVE` for natural keys:
        a query reads it to leave out keys that do not exist)."""
        return {t.name: list(t.state_columns) for t in self.topology.tables}

    @property
    def value_types(self) -> dict[str, dict[str, ValueType]]:
        """The type of every value column, by table name: what the state's int64 values
        are when a query or the final state hands them out."""
        return {t.name: t.value_types for t in self.topology.tables}

    @property
    def set_capacity(self) -> int:
        """Slots of the distinct sets (twice the events, when known)."""
        if not any(t.distinct for t in self.topology.tables):
            return 16
        wanted = 2 * (self.expected_events or DEFAULT_SET_CAPACITY)
        return 1 << max(4, int(wanted - 1).bit_length())

    def discard_unused(self) -> None:
        """Remove what was prepared and not committed: the private output folder, or the
        ``_temporary`` of an output that was never committed (idempotent). An output
        that checkpoints can resume is kept."""
        if self.own_output:
            shutil.rmtree(self.output.path, ignore_errors=True)
        elif self.store is None or self.store.complete:
            self.output.abandon()


def plan(
    config: RunConfig,
    init_state: InitState,
    output: str | Path | None,
    *,
    name: str | None = None,
    progressive: bool = True,
    source: Any = None,
    share: NodeShare | None = None,
    queryable: bool = True,
    cpus_taken: int = 0,
) -> Plan:
    """Check everything a session needs before starting anything; UsageError,
    SchemaError or TopologyError otherwise. ``progressive``: outputs are committed as
    part files while the session runs (a one-shot run commits once, at the end).
    ``source``: a one-shot run's input (it identifies the run for checkpoints); ``share``:
    the keys a node of a run over several holds (``init_state`` has only those);
    ``queryable``: see `Plan.queryable`; ``cpus_taken``: CPUs of this host that other
    nodes' teams of the run take, which this one's executors are pinned past
    (`HostTopology.assign`)."""
    config = with_key_type(config, init_state)
    topology = topologies.get(config.topology, config.key_type)
    cores = host_topology(config.sockets).assign(config.executors, cpus_taken=cpus_taken)
    # from malloc, not pyarrow's mimalloc, which keeps freed memory a while: the init
    # tables' goes back to the kernel as soon as the engine has loaded them
    pa.set_memory_pool(pa.system_memory_pool())
    init = read_init_state(topology, init_state, share)
    sizes = share.sizes if share else topology.sizes_from({k: t.num_rows for k, t in init.items()})
    keys: dict[str, KeyIndex] = {}
    if share is None:
        natural = [t for t in topology.tables if t.natural]
        limits = {t.name: config.max_keys or 2 * sizes[t.name] + EXTRA_KEYS for t in natural}
        sizes |= limits
        keys = key_indexes(topology, init, limits)
    else:  # the driver turns natural keys into rows: the node's events carry rows
        topology = topology.on_rows()
    layout = Layout.of(topology.tables, sizes, share)
    if name is not None and not name:
        raise UsageError("a session name must not be empty")
    if name and config.transport == "threads":
        raise UsageError(
            "a named session is reached through Ray: --transport threads takes no --name"
        )
    store = CheckpointStore(config.checkpoint_dir) if config.checkpoint_dir else None
    identity = input_identity(source) if source is not None else None
    resume = None
    if store is not None:
        resume = resume_point(
            store, {"topology": config.topology, "sizes": layout.sizes, "input": identity}
        )
    own = output is None
    if resume is not None:
        _check_resumable(resume, output, progressive)
    # absolute: the Sink writes from its own process, whose working folder may differ
    path = own_output_dir() if own else Path(output).resolve()
    out = OutputDir(path, overwrite=config.overwrite or own, progressive=progressive)
    try:
        out.prepare(resume=resume is not None)
    except BaseException:
        if own:
            shutil.rmtree(path, ignore_errors=True)
        raise
    expected = getattr(source, "num_rows", None)
    return Plan(
        config,
        topology,
        init,
        layout,
        cores,
        out,
        own,
        name,
        expected,
        identity,
        store,
        resume,
        keys,
        queryable,
    )


def with_key_type(config: RunConfig, init_state: InitState) -> RunConfig:
    """``config`` with the key type of a bundled topology that runs on natural keys:
    ``--key-type``, or else what its init state's ``key`` column says (the first table's)."""
    if config.key_type is not None or config.topology not in topologies.NATURAL_KEYS:
        return config
    first = topologies.get(config.topology).tables[0].name
    return replace(config, key_type=key_type_of(init_state, first) or DENSE)


def _check_resumable(checkpoint: Checkpoint, output: str | Path | None, progressive: bool) -> None:
    """An interrupted run is resumed only into its own uncommitted output."""
    meta, where = checkpoint.meta, f"checkpoint {checkpoint.path}"
    if output is None or meta.get("output") is None:
        raise UsageError(
            f"{where} belongs to a run without an output directory, whose outputs cannot be "
            "resumed; remove it to start afresh"
        )
    out = OutputDir(Path(output), progressive=progressive)
    if meta["output"] != str(Path(output).resolve()) or out.run_token() != meta["output_run"]:
        raise UsageError(
            f"{where} belongs to the output {meta['output']}, not to {output}, or that output "
            "was committed or removed since; remove the checkpoints to start afresh"
        )
    if meta.get("progressive") != progressive:
        raise UsageError(f"{where} is of a {'session' if meta.get('progressive') else 'run'}")


def input_identity(source: Any) -> dict[str, Any] | None:
    """What identifies a one-shot run's input, so that a checkpoint of another input is
    refused: its files (names, sizes, rows) or its row count and schema."""
    if isinstance(source, ArrowSource) and source.files:
        return {
            "files": [[str(Path(f).resolve()), Path(f).stat().st_size] for f in source.files],
            "rows": source.num_rows,
        }
    if hasattr(source, "schema") and getattr(source, "num_rows", None) is not None:
        return {"rows": source.num_rows, "schema": str(source.schema)}
    return None


def resume_point(store: CheckpointStore, identity: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint of an interrupted run to continue from (None: start afresh);
    UsageError if it belongs to another topology, table size, input or format."""
    if store.complete:
        return None
    checkpoint = store.latest()
    if checkpoint is None:
        return None
    meta = checkpoint.meta
    where = f"checkpoint {checkpoint.path}"
    if meta.get("format") != FORMAT:
        raise UsageError(f"{where} was written by another txstream version")
    for key, label in (("topology", "topology"), ("sizes", "table sizes"), ("input", "input")):
        if meta.get(key) != identity.get(key):
            raise UsageError(
                f"{where} is of another {label} ({meta.get(key)} here {identity.get(key)}); "
                "use another --checkpoint-dir or remove it"
            )
    return checkpoint
