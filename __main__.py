"""``python -m txstream``: the command line."""

from txstream.cli import command

command()
