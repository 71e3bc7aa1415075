"""``python -m txstream``: the command line."""

from txstream.cli import main

raise SystemExit(main())
