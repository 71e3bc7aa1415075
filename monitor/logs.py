"""Where a run's logs go: one file, ``OUTPUT/_logs/txstream.log``.

Ray's, Spark's and the JVMs' output is not for the terminal: while a run lasts, the
process's stdout and stderr (file descriptors 1 and 2, which the processes it starts, such
as Spark's JVM, inherit) point at the log file, and only the console (phases, bar,
warnings) writes to the terminal. txstream's own records (phases with their seconds, the
full trace of a failure) go to the same file. Parquet and Spark readers skip names that
start with ``_``, so the log can live beside the outputs. A run without an output folder
logs to a private temporary folder, removed at the end unless the run failed. With
``verbose``, nothing is redirected: everything, txstream's records included, also shows
on stderr.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from txstream.config import LEVELS
from txstream.errors import SchemaError, UsageError
from txstream.monitor.console import Console

LOG_FOLDER = "_logs"
LOG_FILE = "txstream.log"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_RAY_COLOR = "RAY_COLOR_PREFIX"

log = logging.getLogger("txstream")
_redirected = threading.Lock()
"""Held while a run has the process's fds 1 and 2: a run started meanwhile (another
thread) keeps its own records in its file but leaves the fds alone."""


def level_number(level: str) -> int:
    """The `logging` level of a `--log-level` value."""
    if level not in LEVELS:
        raise UsageError(f"--log-level must be one of {', '.join(LEVELS)}")
    return logging.getLevelName(level.upper())


def captured() -> bool:
    """Whether a run's log now receives this process's stderr (`run_log`): then Ray's and
    Spark's chatter on stderr goes there, not to the terminal."""
    return _redirected.locked()


def log_of(exc: BaseException) -> Path | None:
    """The log file of the run that ``exc`` ended, if a run log recorded it."""
    return getattr(exc, "txstream_log", None)


@contextmanager
def run_log(
    output: str | os.PathLike | None,
    level: str = "info",
    verbose: bool = False,
    console: Console | None = None,
) -> Iterator[Path]:
    """Send this run's logs to ``output/_logs/txstream.log`` (a private temporary file
    without ``output``) and its console to the terminal; yields the log's path.

    A failure is recorded there with its full trace and leaves with the path
    (`log_of`); the temporary folder is then kept. A schema or usage error (nothing ran,
    its one line says everything) leaves no log and no folder made for it.
    """
    number = level_number(level)
    path, created = _log_path(output)
    with ExitStack() as stack:
        # Appended to: a run started again (a resume) keeps the log of the one it follows.
        stream = stack.enter_context(open(path, "a", buffering=1, encoding="utf-8"))
        handlers = [logging.StreamHandler(stream)]
        if verbose:
            handlers.append(logging.StreamHandler(sys.stderr))
        stack.callback(log.setLevel, log.level)
        log.setLevel(number)
        for handler in handlers:
            handler.setFormatter(logging.Formatter(_FORMAT))
            log.addHandler(handler)
            stack.callback(log.removeHandler, handler)
        if not verbose and _redirected.acquire(blocking=False):
            stack.callback(_redirected.release)
            terminal = stack.enter_context(_redirect_std_fds(stream))
            if console is not None and terminal is not None:
                stack.enter_context(console.instead_of_stderr(terminal))
        log.info("txstream %s, Python %s, pid %d", version(), sys.version.split()[0], os.getpid())
        try:
            yield path
        except (SchemaError, UsageError):
            _remove_created(path, created)  # nothing ran: the one-line message says it all
            raise
        except BaseException as exc:
            log.error("run failed", exc_info=exc)
            exc.txstream_log = path  # every exception class of Python takes attributes
            exc.add_note(f"txstream log: {path}")  # shown with the traceback
            raise
        if output is None:
            _remove_created(path, created)


def _log_path(output: str | os.PathLike | None) -> tuple[Path, list[Path]]:
    """Where the log goes, and what is made for it: the folders (outermost first) and the
    log itself, unless an earlier run's log is there."""
    if output is None:
        folder = Path(tempfile.mkdtemp(prefix="txstream_log_"))
        return folder / LOG_FILE, [folder, folder / LOG_FILE]
    folder = Path(output) / LOG_FOLDER
    created = [p for p in (Path(output), folder, folder / LOG_FILE) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {output}: {exc.strerror}") from exc
    return folder / LOG_FILE, created


def _remove_created(path: Path, created: list[Path]) -> None:
    """Remove the log and the folders made for it (only if left empty), not an earlier
    run's log."""
    if path in created:
        path.unlink(missing_ok=True)
    for folder in reversed(created[:-1] if path in created else created):
        try:
            folder.rmdir()
        except OSError:  # not empty: something else is there now
            return


@contextmanager
def _redirect_std_fds(log_stream) -> Iterator[object | None]:
    """Point fds 1 and 2 at the log for the duration; yields a text stream to the
    terminal's stderr (None when ``sys.stderr`` is not fd 2, e.g. in a notebook, where
    it stays the console's stream)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    terminal = None
    color = os.environ.get(_RAY_COLOR)
    os.environ[_RAY_COLOR] = "0"  # Ray prints workers' output without color codes
    try:
        if _fileno(sys.stderr) == 2:
            terminal = open(saved[1], "w", buffering=1, closefd=False, errors="replace")
        os.dup2(log_stream.fileno(), 1)
        os.dup2(log_stream.fileno(), 2)
        yield terminal
    finally:
        for stream in (sys.stdout, sys.stderr, log_stream):
            stream.flush()
        if terminal is not None:
            terminal.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        if color is None:
            os.environ.pop(_RAY_COLOR, None)
        else:
            os.environ[_RAY_COLOR] = color


def _fileno(stream: object) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def version() -> str:
    """txstream's installed version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("txstream")
    except PackageNotFoundError:
        return "(not installed)"
