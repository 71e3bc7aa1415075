"""What a running session promises, on one host or several: `StreamSession`.

`Job.start` returns one: a `txstream.session.Session` (one host) or a
`txstream.nodes.session.NodesSession` (``nodes`` > 1). Both take the same calls with the
same arguments and keep the same promises, so a program does not depend on where its
team runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa
    from txstream.connectors.inputs import Events
    from txstream.result import Result


@runtime_checkable
class StreamSession(Protocol):
    """A running stream of events (contract §6): push events as they come, read the state
    and the outputs behind the watermark, close it for the `Result`. Leaving a ``with``
    block closes it (after an exception: stops everything, commits nothing).

    Events get ts 0, 1, ... in the order pushed (after those a resumed checkpoint covers).
    Whatever fails surfaces on the next call, with its cause.
    """

    def push(self, events: Events, batch_id: int | None = None) -> None:
        """Append ``events`` to the stream: whatever
        `txstream.connectors.inputs.event_source` takes (Arrow data, Parquet files, a
        Spark DataFrame, a Source). A wrong schema raises `SchemaError` and applies
        nothing; another kind of input, `UsageError`. May return before the events are
        processed. ``batch_id``: the Spark micro-batch these events are
        (`txstream.connectors.streaming`: each is applied once); refused by a session that
        cannot keep that promise."""
        ...

    def flush(self) -> int:
        """Wait until every pushed event is processed and its outputs are committed; the
        watermark (= every event pushed)."""
        ...

    def query(self, table: str, keys: list[int] | None = None) -> tuple[int, pa.Table]:
        """``(w, rows)``: the rows of ``table`` (``key`` + value columns; the given keys in
        that order, or every key) as the state stands after exactly the first ``w``
        events, ``w`` a watermark the session reached (never part of a batch). UsageError
        for an unknown table or key."""
        ...

    def outputs(self, since: int = 0) -> Iterator[pa.RecordBatch]:
        """The committed output rows from ts ``since`` on, in ts order, as record batches
        (after `flush`: those of every event pushed). UsageError in a one-shot run, which
        returns its outputs in its Result."""
        ...

    @property
    def watermark(self) -> int:
        """How many events (ts below it) are processed: their transactions decided and
        their outputs written."""
        ...

    def close(self) -> Result:
        """Process everything pushed, commit the outputs, free every resource; the
        `Result`. Again after success: the same Result."""
        ...

    def __enter__(self) -> StreamSession: ...

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...
