"""The command line: ``txstream run | query | status | generate`` over the public API."""

from txstream.cli.main import command, main

__all__ = ["command", "main"]
