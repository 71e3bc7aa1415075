"""Event sources: where the ProgressController reads events from, in ts order.

A source is created in the driver (its schema is checked there, before anything
runs) and pickled into the ProgressController actor, which iterates it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from txstream.errors import SchemaError


class Source(Protocol):
    """Ordered batches of events (row order = ts order)."""

    schema: pa.Schema
    num_rows: int | None

    def iter_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """Batches of at most ``max_rows`` rows, in input order."""
        ...


class SkippedSource:
    """A source without its first ``skip`` rows: the input after a checkpoint, replayed."""

    def __init__(self, source: Source, skip: int):
        self.source = source
        self.skip = skip
        self.schema = source.schema
        self.num_rows = None if source.num_rows is None else source.num_rows - skip

    def iter_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """The source's batches from row ``skip`` on."""
        left = self.skip
        for batch in self.source.iter_batches(max_rows):
            if left >= batch.num_rows:
                left -= batch.num_rows
                continue
            yield batch.slice(left)
            left = 0

    def close(self) -> None:
        """Close the underlying source, if it needs closing."""
        if hasattr(self.source, "close"):
            self.source.close()


def parquet_files(path: str | Path) -> list[Path]:
    """A Parquet file, or the Parquet files of a folder in name order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and p.is_file())
        if not files:
            raise SchemaError(f"events: no .parquet files in {path}")
        return files
    if not path.is_file():
        raise SchemaError(f"events: {path} not found")
    return [path]


PARQUET_BATCH_ROWS = 16384
"""Rows pyarrow decodes at a time: small enough that the decoded columns stay in the CPU's
cache until they are used (larger batches read a whole input slower), and that the first
batch comes soon after the start."""


class ArrowSource:
    """Parquet read with pyarrow (one file or a folder in name order), or an Arrow table.

    For Parquet, creating it checks the files from their footers (one schema for all) and
    counts their rows; ``files`` are the files in input order. ``table`` is the table (None
    for Parquet): a session hands events in memory to the engine as they are.
    """

    def __init__(self, events: str | Path | pa.Table):
        if isinstance(events, pa.Table):
            self.table: pa.Table | None = events
            self.files: list[Path] = []
            self.schema = events.schema
            self.num_rows = events.num_rows
            return
        self.table = None
        self.files = parquet_files(events)
        schemas = []
        rows = 0
        for f in self.files:
            try:
                meta = pq.ParquetFile(f)
            except Exception as exc:
                raise SchemaError(f"events: cannot read {f} ({exc})") from exc
            schemas.append(meta.schema_arrow)
            rows += meta.metadata.num_rows
        if any(not s.equals(schemas[0]) for s in schemas[1:]):
            raise SchemaError(f"events: files in {events} have different schemas")
        self.schema = schemas[0]
        self.num_rows = rows

    def iter_batches(self, max_rows: int) -> Iterator[pa.RecordBatch]:
        """Batches in file order, then row order."""
        if self.table is not None:
            yield from self.table.to_batches(max_chunksize=max_rows)
            return
        strings = [f.name for f in self.schema if pa.types.is_string(f.type)]
        for f in self.files:  # strings as they are stored: see topologies.api.DICTIONARY_STRING
            # decoded on the reading thread, not on Arrow's pool: its threads would run on
            # the executors' cores and slow them down
            # not pre-buffered: a row group's column chunks read whole before its first
            # batch would keep the first events waiting longer
            parquet = pq.ParquetFile(f, read_dictionary=strings, pre_buffer=False)
            rows = min(max_rows, PARQUET_BATCH_ROWS)
            yield from parquet.iter_batches(batch_size=rows, use_threads=False)
