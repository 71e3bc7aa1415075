"""The watermark words: how far a run's outputs are written, and how far committed.

Two int64 words in shared memory: the Sink publishes them, the driver and the
ProgressController read them without a call (a session's `watermark` and `committed`, the
ts at which queries read the state, the back-pressure of pushes).
"""

from __future__ import annotations

from txstream.state.shared import ArrayHandle, SharedArray

WRITTEN, COMMITTED = 0, 1
"""The words: outputs written up to ts (the watermark), and committed up to ts."""


class Watermark:
    """A run's watermark words (module docstring); created by the driver, attached by the
    actors that publish or read them."""

    def __init__(self, words: SharedArray):
        self._words = words

    @classmethod
    def create(cls, run_id: str) -> Watermark:
        """New words (driver side), both 0."""
        return cls(SharedArray.create(run_id, "watermark", (2,), "int64"))

    @classmethod
    def attach(cls, handle: ArrayHandle) -> Watermark:
        """The words of ``handle`` (actor side)."""
        return cls(SharedArray.attach(handle))

    @property
    def handle(self) -> ArrayHandle:
        """What an actor attaches with."""
        return self._words.handle

    @property
    def written(self) -> int:
        """How many events (ts below it) have their outputs written."""
        return int(self._words.array[WRITTEN])

    @property
    def committed(self) -> int:
        """How many events (ts below it) have their outputs committed (at most `written`)."""
        return int(self._words.array[COMMITTED])

    def publish(self, written: int, committed: int) -> None:
        """Both words at once (the Sink)."""
        self._words.array[:] = (written, committed)

    def reset(self, ts: int) -> None:
        """Both words at ``ts``: a team starting after the first ``ts`` events."""
        self.publish(ts, ts)

    def close(self) -> None:
        """Detach (and unlink, on the driver side)."""
        self._words.close()
