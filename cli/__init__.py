"""The command line: ``txstream run | query | status | generate`` over the public API."""

from txstream.cli.main import main

__all__ = ["main"]
