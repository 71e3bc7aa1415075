"""The errors txstream raises, told apart by who has to act on them."""

from __future__ import annotations

from pathlib import Path


class TxstreamError(Exception):
    """Base class of every txstream error.

    ``log`` is the run's log file once the run has one (its full trace is there); it is
    set when the error leaves the run, so that a one-line report can point to it.
    """

    log: Path | None = None


class SchemaError(TxstreamError):
    """Input or init state does not match the topology; nothing was processed (exit code 2)."""


class UsageError(TxstreamError):
    """A configuration that cannot run, e.g. an unknown scheduler (exit code 2)."""


class TopologyError(TxstreamError):
    """A topology definition is invalid, e.g. a user function that numba cannot compile."""


class RuntimeFailure(TxstreamError):
    """The engine itself failed while running (an actor died, a timeout expired).

    ``actor`` names the part that failed (``"Executor 1"``, ``"Sink"``, ``"Spark"``...)
    when it is known; the message then starts with it.
    """

    def __init__(self, cause: str, actor: str | None = None):
        super().__init__(f"{actor}: {cause}" if actor else cause)
        self.actor = actor
        self.cause = cause

    def __reduce__(self) -> tuple:
        return type(self), (self.cause, self.actor)


class PeerFailed(RuntimeFailure):
    """An executor stopped because another one failed (that one's error is the cause)."""


class ActorDied(RuntimeFailure):
    """An actor's process died (killed, out of memory): a session with checkpoints
    recovers from it; any other failure would happen again on replay."""
