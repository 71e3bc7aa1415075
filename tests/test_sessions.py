"""One session protocol (`txstream.sessions.StreamSession`): a session on one host and one
over several nodes take the same calls with the same arguments."""

from __future__ import annotations

import inspect

import pytest
from txstream.job import Job
from txstream.nodes.session import NodesSession
from txstream.session import Session
from txstream.sessions import StreamSession

METHODS = ["push", "flush", "query", "outputs", "close"]


@pytest.mark.parametrize("session", [Session, NodesSession])
@pytest.mark.parametrize("method", METHODS)
def test_both_sessions_take_the_protocols_arguments(session, method):
    assert inspect.signature(getattr(session, method)) == inspect.signature(
        getattr(StreamSession, method)
    )


@pytest.mark.parametrize("session", [Session, NodesSession])
def test_both_sessions_have_the_watermark_as_a_property_and_are_context_managers(session):
    assert isinstance(inspect.getattr_static(session, "watermark"), property)
    assert inspect.signature(session.watermark.fget).return_annotation == "int"
    for name in ("__enter__", "__exit__"):
        assert inspect.signature(getattr(session, name)).parameters.keys() == (
            inspect.signature(getattr(StreamSession, name)).parameters.keys()
        )


def test_job_start_returns_the_protocol():
    assert inspect.signature(Job.start).return_annotation == "StreamSession"
