"""One session protocol (`txstream.session.StreamSession`): a session on one host and one
over several nodes take the same calls with the same arguments."""

from __future__ import annotations

import inspect

import pytest
from txstream.job import Job
from txstream.nodes.session import NodesSession
from txstream.session import Session, StreamSession

METHODS = ["push", "flush", "query", "outputs", "checkpoint", "close"]


@pytest.mark.parametrize("session", [Session, NodesSession])
@pytest.mark.parametrize("method", METHODS)
def test_both_sessions_take_the_protocols_arguments(session, method):
    assert inspect.signature(getattr(session, method)) == inspect.signature(
        getattr(StreamSession, method)
    )


@pytest.mark.parametrize("session", [Session, NodesSession])
def test_both_sessions_have_the_protocols_properties_and_are_context_managers(session):
    for name, kind in (("watermark", "int"), ("checkpointing", "bool")):
        assert isinstance(inspect.getattr_static(session, name), property)
        assert inspect.signature(getattr(session, name).fget).return_annotation == kind
    for name in ("__enter__", "__exit__"):
        assert inspect.signature(getattr(session, name)).parameters.keys() == (
            inspect.signature(getattr(StreamSession, name)).parameters.keys()
        )


def test_job_start_returns_the_protocol():
    assert inspect.signature(Job.start).return_annotation == "StreamSession"
