"""Output directories committed in Spark's manner: never half-written, never mixed.

A run writes under ``OUTPUT/_temporary/`` and moves its files into place only once they
are complete; the final commit writes ``OUTPUT/_SUCCESS`` last. A failed or interrupted
run therefore leaves nothing at the top of ``OUTPUT`` that could be taken for a result,
and a previous complete output stays untouched until the new run commits.

Two shapes of output:

* a one-shot run (``Job.run``, ``txstream run``) commits once, at the end:
  ``events.parquet``, ``state/<table>.parquet``, ``metrics.json``, ``_SUCCESS``;
* a session (``Job.start`` with an output, ``txstream run --follow``) commits its events
  progressively as part files ``events/part-<first ts>.parquet`` (each complete when it
  appears: written under ``_temporary`` and renamed), then ``state/``, ``metrics.json``
  and ``_SUCCESS`` when it closes.

Part files carry the ts of their first row in their name (zero-padded), so name order is
ts order and a recovery can drop the parts written after a checkpoint.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from txstream.errors import UsageError

TEMPORARY = "_temporary"
SUCCESS = "_SUCCESS"
LOGS = "_logs"
EVENTS = "events.parquet"
PARTS = "events"
STATE = "state"
METRICS = "metrics.json"
OURS = frozenset({TEMPORARY, LOGS})
"""Entries of an output directory that are txstream's bookkeeping, never a result."""
RUN = "_RUN"
"""File in ``_temporary`` naming the run that writes it (checkpoints refer to it)."""
_CLEARED = "_CLEARED"
"""Marker in ``_temporary``: this run already removed the previous output (--overwrite)."""


DICTIONARY_COLUMNS = ["status", "reason"]
"""Few distinct values: dictionary-encoded (they arrive as Arrow dictionaries, see
`txstream.actors.executor.rows_schema`), without min/max statistics (string compares).
The other columns are not: a dictionary attempted on unique int64 columns (ts, event_id)
is abandoned after costing most of the writer's time."""
DELTA_COLUMNS = {"ts": "DELTA_BINARY_PACKED", "event_id": "DELTA_BINARY_PACKED"}
"""Ascending integers: stored as their differences, which take under a byte per row when
event ids ascend; plain and compressed, they were most of the writer's time and of the
file."""


def events_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A Parquet writer of event outputs (``schema``: an executor's `rows_schema` or
    `output_schema`), each column encoded for what it holds (see `DICTIONARY_COLUMNS`,
    `DELTA_COLUMNS`)."""
    return pq.ParquetWriter(
        str(path),
        schema,
        use_dictionary=DICTIONARY_COLUMNS,
        column_encoding={
            name: DELTA_COLUMNS[name] for name in schema.names if name in DELTA_COLUMNS
        },
        write_statistics=[n for n in schema.names if n not in DICTIONARY_COLUMNS],
        store_schema=False,  # read back, the dictionary columns are plain strings
    )


def part_name(first_ts: int) -> str:
    """File name of the part whose first row has ``first_ts`` (name order = ts order)."""
    return f"part-{first_ts:012d}.parquet"


def part_first_ts(name: str) -> int:
    """The first ts of a part, from its file name."""
    return int(name[len("part-") : -len(".parquet")])


@dataclass(frozen=True)
class OutputDir:
    """Where a run's outputs go and how they are committed (picklable: the Sink commits
    parts from its own process, the driver makes the final commit)."""

    path: Path
    overwrite: bool = False
    progressive: bool = False
    """A session: events are committed as part files while it runs."""

    @property
    def temporary(self) -> Path:
        """Where files are written until they are committed."""
        return self.path / TEMPORARY

    @property
    def staged_parts(self) -> Path:
        """Complete part files not committed yet (one-shot runs commit them at the end)."""
        return self.temporary / "parts"

    @property
    def committed_parts(self) -> Path:
        """Part files of a session, committed as they complete."""
        return self.path / PARTS

    def prepare(self, resume: bool = False) -> None:
        """Check the directory before anything starts, and make ``_temporary``.

        Refuses (UsageError) a location that is not a directory or cannot be written, and
        a non-empty one unless ``overwrite`` - leftovers of a failed run (``_temporary``,
        ``_logs``) do not count. With ``resume``, the ``_temporary`` of the interrupted run
        is kept (recovery continues it); otherwise it is started afresh.
        """
        path = self.path
        if path.exists() and not path.is_dir():
            raise UsageError(f"output {path} exists and is not a directory")
        if path.is_dir() and not self.overwrite and not resume:
            results = sorted(p.name for p in path.iterdir() if p.name not in OURS)
            if results:
                raise UsageError(
                    f"output {path} is not empty (holds {', '.join(results[:3])}"
                    f"{', ...' if len(results) > 3 else ''}); use --overwrite to replace it"
                )
        try:
            if not resume and self.temporary.exists():
                shutil.rmtree(self.temporary)
            self.staged_parts.mkdir(parents=True, exist_ok=True)
            probe = self.temporary / ".probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"cannot write to output {path}: {exc.strerror or exc}") from exc

    def stage_part(self, written: Path, first_ts: int) -> Path:
        """A complete part file (written anywhere under ``_temporary``) becomes part
        ``first_ts``: staged for the final commit, or - in a session - committed now."""
        if self.progressive:
            self._clear_previous()
            self.committed_parts.mkdir(exist_ok=True)
            target = self.committed_parts / part_name(first_ts)
        else:
            target = self.staged_parts / part_name(first_ts)
        os.replace(written, target)
        return target

    def parts(self) -> list[Path]:
        """This run's complete part files in ts order (staged or committed)."""
        folder = self.committed_parts if self.progressive else self.staged_parts
        return sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []

    def committed_events(self) -> list[Path]:
        """The files of the committed events in ts order, once `commit` ran: one file, or
        a session's parts."""
        return self.parts() if self.progressive else [self.path / EVENTS]

    def drop_parts_from(self, ts: int) -> None:
        """Remove the parts whose first row is at or after ``ts``, and parts being written
        (a recovery replays them)."""
        for part in self.parts():
            if part_first_ts(part.name) >= ts:
                part.unlink()
        for written in self.temporary.glob("*.inprogress"):
            written.unlink()

    def mark_run(self, token: str) -> None:
        """Tag ``_temporary`` with the run writing it (a resumed run must be that one)."""
        (self.temporary / RUN).write_text(token)

    def run_token(self) -> str | None:
        """The tag of the run whose uncommitted output this is, if any."""
        try:
            return (self.temporary / RUN).read_text()
        except OSError:
            return None

    def commit(self, state: dict[str, object], metrics_json: str) -> None:
        """Final commit: events (one file, or the session's parts already in place),
        ``state/`` and ``metrics.json`` moved into place, then ``_SUCCESS``; the previous
        output (``overwrite``) goes first. ``state`` maps table names to Arrow tables."""
        staging = self.temporary
        (staging / STATE).mkdir(exist_ok=True)
        for name, table in state.items():
            pq.write_table(table, staging / STATE / f"{name}.parquet")
        (staging / METRICS).write_text(metrics_json)
        if not self.progressive:
            _merge(self.parts(), staging / EVENTS)
        self._clear_previous()
        moved = [STATE, METRICS] + ([] if self.progressive else [EVENTS])
        for name in moved:
            os.replace(staging / name, self.path / name)
        if self.progressive and not self.committed_parts.exists():
            self.committed_parts.mkdir()  # a session without a single event
        (self.path / SUCCESS).write_bytes(b"")
        shutil.rmtree(staging, ignore_errors=True)

    def abandon(self) -> None:
        """After a failure: remove what was never committed (the log stays)."""
        shutil.rmtree(self.temporary, ignore_errors=True)

    def _clear_previous(self) -> None:
        """Remove the previous output (once per run, at its first commit)."""
        marker = self.temporary / _CLEARED
        if marker.exists():
            return
        success = self.path / SUCCESS
        success.unlink(missing_ok=True)  # first: a half-replaced output is never "complete"
        for entry in self.path.iterdir():
            if entry.name in OURS:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        marker.write_bytes(b"")


def _merge(parts: list[Path], target: Path) -> None:
    """One Parquet file of the parts' rows in order: the single part is renamed; several
    (a run that checkpointed) are copied batch by batch."""
    if len(parts) == 1:
        os.replace(parts[0], target)
        return
    schema = pq.read_schema(parts[0])
    with events_writer(target, schema) as writer:
        for part in parts:
            for batch in pq.ParquetFile(part).iter_batches():
                writer.write_batch(batch)


def file_stamps(files: list[Path]) -> list[tuple[int, int]]:
    """What tells a file from one written in its place later (inode, modification time)."""
    return [(st.st_ino, st.st_mtime_ns) for st in (f.stat() for f in files)]


def read_events(
    files: list[Path],
    schema: pa.Schema,
    columns: list[str] | None = None,
    stamps: list[tuple[int, int]] | None = None,
) -> pa.Table:
    """The output rows in ``files`` (in order) as one table (of ``schema``'s ``columns``,
    all by default). With ``stamps`` (`file_stamps` when they were committed), files
    replaced or removed since, say by a later run into the same output, are a UsageError
    rather than someone else's rows."""
    gone = UsageError(
        f"the run's events in {files[0].parent if files else 'its output'} were replaced or removed"
    )
    try:
        if stamps is not None and file_stamps(files) != stamps:
            raise gone
        tables = [pq.read_table(f, columns=columns) for f in files]
    except FileNotFoundError as exc:
        raise gone from exc
    if tables:
        return pa.concat_tables(tables)
    names = schema.names if columns is None else columns
    return pa.schema([schema.field(n) for n in names]).empty_table()
