"""What a run tells the person who started it, on stderr, from its first second.

Phases of start-up and shut-down (``starting Ray ... 2.1 s``), the event bar with a
rate and an ETA, and warnings. Nothing else reaches the terminal during a run: Ray's,
Spark's and the JVMs' output goes to the run's log (`txstream.monitor.logs`). On a terminal the
current line is redrawn in place (a phase shows its elapsed seconds while it lasts);
elsewhere (a file, CI) every phase is one line and the bar a line every 10 s.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

log = logging.getLogger("txstream")
# Without it, a record made before a run's log is set up (a warning about the options)
# would reach Python's last-resort handler: the same warning again on stderr, bare.
log.addHandler(logging.NullHandler())

_TICK_S = 0.5
"""How often a terminal line is redrawn while a phase lasts."""
_PLAIN_EVERY_S = 10.0
"""How often the bar is printed as a new line when stderr is not a terminal."""
_BAR_WIDTH = 20
_SCALES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


class Console:
    """Phases, progress and warnings on stderr (phases and bar only when ``enabled``).

    ``stream`` defaults to ``sys.stderr`` at the time of writing; a run that sends the
    process's own stderr to its log points the console at the terminal
    (`instead_of_stderr`).
    Seconds of every finished phase are kept in ``phases``.
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None):
        self.enabled = enabled
        self._stream = stream
        self._lock = threading.RLock()
        self._line = ""  # the unfinished line now shown (redrawn on a terminal)
        self.phases: dict[str, float] = {}

    @property
    def stream(self) -> TextIO:
        """Where the console writes now."""
        return self._stream or sys.stderr

    @property
    def interactive(self) -> bool:
        """Whether the stream is a terminal (lines are redrawn in place)."""
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    @contextmanager
    def instead_of_stderr(self, stream: TextIO) -> Iterator[None]:
        """Write to ``stream`` instead of ``sys.stderr`` for the duration (the terminal,
        while fd 2 goes to a log); a console given its own stream keeps it."""
        if self._stream is not None:
            yield
            return
        with self._lock:
            self._stream = stream
        try:
            yield
        finally:
            with self._lock:
                self._end_line()
                self._stream = None

    @contextmanager
    def phase(self, what: str) -> Iterator[None]:
        """Report ``what`` (``"starting Ray"``) while it lasts, then its seconds."""
        start = time.perf_counter()
        log.info("%s", what)
        stop = threading.Event()
        ticker = None
        if self.enabled:
            self._show(f"txstream: {what} ...", final=False)
            if self.interactive:
                ticker = threading.Thread(target=self._tick, args=(what, start, stop), daemon=True)
                ticker.start()
        failed = True
        try:
            yield
            failed = False
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            seconds = time.perf_counter() - start
            self.phases[what] = round(seconds, 3)
            outcome = "failed after" if failed else "done in"
            log.info("%s: %s %.3f s", what, outcome, seconds)
            if self.enabled:
                ending = f"{'failed after ' if failed else ''}{seconds:.1f} s"
                self._show(f"txstream: {what} ... {ending}", final=True)

    def _tick(self, what: str, start: float, stop: threading.Event) -> None:
        while not stop.wait(_TICK_S):
            self._show(f"txstream: {what} ... {time.perf_counter() - start:.0f} s", final=False)

    def note(self, message: str) -> None:
        """One line of news (shown with the phases and bar, also recorded in the log)."""
        log.info("%s", message)
        if self.enabled:
            self._show(f"txstream: {message}", final=True)

    def warn(self, message: str) -> None:
        """One warning line (shown even when phases and bar are not)."""
        log.warning("%s", message)
        with self._lock:
            self._end_line()
            self.stream.write(f"txstream: warning: {message}\n")
            self.stream.flush()

    def progress(
        self, total: int | None, label: str, since: float | None = None, base: int = 0
    ) -> ProgressBar:
        """An event bar for ``total`` events (None: unknown), labelled ``label``, whose rate
        counts the events after ``base`` over the seconds since ``since`` (a
        `time.perf_counter` value; default: now)."""
        return ProgressBar(self, total, label, since, base)

    def _show(self, text: str, final: bool) -> None:
        """Show ``text`` as the current line (redrawn on a terminal), ending it if final."""
        with self._lock:
            stream = self.stream
            if self.interactive:
                pad = " " * max(0, len(self._line) - len(text))
                stream.write(f"\r{text}{pad}")
                self._line = "" if final else text
                if final:
                    stream.write("\n")
            elif final:
                if self._line and text.startswith(self._line):
                    stream.write(f" {text[len(self._line) :].lstrip()}\n")
                else:
                    self._end_line()
                    stream.write(text + "\n")
                self._line = ""
            else:
                self._end_line()
                stream.write(text)
                self._line = text
            stream.flush()

    def _end_line(self) -> None:
        """Finish an unfinished line, so that the next write starts on its own."""
        if self._line:
            self.stream.write("\n")
            self.stream.flush()
            self._line = ""


class ProgressBar:
    """The event bar of a run: count, share, rate and ETA.

    Its rate is the one metrics.json and the summary give (``throughput_eps``): the events
    this run processed (those after ``base``, where a resumed run started) over the
    seconds since ``since`` (its first event read), so the figure the bar shows while it
    runs converges to the one it ends with, and its last line (`close`) shows the
    run's own figures.
    """

    def __init__(
        self, console: Console, total: int | None, label: str, since: float | None, base: int
    ):
        self.console = console
        self.total = total
        self.label = label
        self.base = base
        self.n = base
        self._created = time.perf_counter()
        self._since = self._created if since is None else since
        self._printed = 0.0

    def update(self, n: int) -> None:
        """``n`` events are done in all; redraw (terminal) or print every 10 s (else)."""
        now = time.perf_counter()
        self.n = n
        if not self.console.enabled:
            return
        if self.console.interactive:
            self.console._show(self._text(now), final=False)
        elif now - self._created - self._printed >= _PLAIN_EVERY_S:
            self._printed = now - self._created
            self.console._show(self._text(now), final=True)

    def close(self, rate: float | None, seconds: float) -> None:
        """Show the final line with the run's figures: its rate and seconds."""
        if self.console.enabled:
            parts = [*self._head(), f"{_si(rate)} events/s in {seconds:.1f} s"]
            self.console._show("  ".join(parts), final=True)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None:  # no last line: the failure's comes next
            with self.console._lock:
                self.console._end_line()

    def rate(self, now: float) -> float | None:
        """Events per second so far (None before the first events are done)."""
        done, elapsed = self.n - self.base, now - self._since
        return done / elapsed if done > 0 and elapsed > 0 else None

    def eta(self, now: float) -> float | None:
        """Seconds left at the current rate (None while unknown)."""
        rate = self.rate(now)
        if self.total is None or not rate:
            return None
        return max(0.0, (self.total - self.n) / rate)

    def _head(self) -> list[str]:
        count = f"{_si(self.n)}/{_si(self.total)}" if self.total is not None else _si(self.n)
        parts = [f"txstream: {self.label}"]
        if self.total:
            share = min(1.0, self.n / self.total)
            filled = int(share * _BAR_WIDTH)
            parts.append(f"{share:4.0%} |{'#' * filled}{'.' * (_BAR_WIDTH - filled)}|")
        parts.append(f"{count} events")
        return parts

    def _text(self, now: float) -> str:
        rate, eta = self.rate(now), self.eta(now)
        elapsed = now - self._since
        parts = self._head()
        parts.append(f"{_si(rate)} events/s" if rate else "waiting for the first events")
        parts.append(f"{elapsed:.0f} s, ETA {eta:.0f} s" if eta is not None else f"{elapsed:.0f} s")
        return "  ".join(parts)


def _si(value: float | None) -> str:
    """A count in a few characters: 950, 12.3k, 1.00M."""
    if value is None:
        return "?"
    scale, suffix = next(((s, x) for s, x in _SCALES if value >= s), (1.0, ""))
    scaled = value / scale
    digits = 0 if scaled >= 100 or not suffix else 1 if scaled >= 10 else 2
    return f"{scaled:.{digits}f}{suffix}"
