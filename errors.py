"""The errors txstream raises, told apart by who has to act on them."""

from __future__ import annotations


class TxstreamError(Exception):
    """Base class of every txstream error."""


class SchemaError(TxstreamError):
    """Input or init state does not match the topology; nothing was processed (exit code 2)."""


class UsageError(TxstreamError):
    """A configuration that cannot run, e.g. an unknown scheduler (exit code 2)."""


class TopologyError(TxstreamError):
    """A topology definition is invalid, e.g. a user function that numba cannot compile."""


class RuntimeFailure(TxstreamError):
    """The engine itself failed while running (an actor died, a timeout expired)."""


class PeerFailed(RuntimeFailure):
    """An executor stopped because another one failed (that one's error is the cause)."""


class ActorDied(RuntimeFailure):
    """An actor's process died (killed, out of memory): a session with checkpoints
    recovers from it; any other failure would happen again on replay."""
