"""Honest help: every option of every verb explained with its default, only built choices,
`--version`, and the README's CLI reference equal to `--help`.

`python tests/test_cli_help.py` rewrites the README's reference from `--help`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from txstream.cli.main import _parser, main
from txstream.monitor.logs import version
from txstream.schedulers import SCHEDULERS

README = Path(__file__).parent.parent / "README.md"
BEGIN = "<!-- cli-reference: generated from --help by tests/test_cli_help.py, do not edit -->"
END = "<!-- end of cli-reference -->"


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def reference() -> str:
    """What the README's CLI reference must hold: `--help` of the command and each verb."""
    parser = _parser()
    parts = [("txstream --help", parser.format_help())]
    parts += [
        (f"txstream {name} --help", sub.format_help()) for name, sub in _verbs(parser).items()
    ]
    body = "\n".join(f"$ {command}\n{text}" for command, text in parts)
    return f"{BEGIN}\n```text\n{body}```\n{END}"


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # help is at most 100 wide: the same everywhere


def test_every_option_of_every_verb_has_a_help_line_and_its_default():
    parser = _parser()
    verbs = _verbs(parser)
    assert {"generate", "run"} <= verbs.keys()
    for name, sub in verbs.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            text = _help_of(sub, action)
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert text, f"{where} has no help"
            flag = action.option_strings and action.nargs == 0
            if action.option_strings and not flag:
                assert "default" in text or "required" in text, f"{where}: no default ({text})"


def test_only_built_schedulers_are_offered():
    [scheduler] = [a for a in _verbs(_parser())["run"]._actions if a.dest == "scheduler"]
    assert tuple(scheduler.choices) == tuple(SCHEDULERS)


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"txstream {version()}\n"


def test_help_mentions_every_option_with_a_line():
    text = _verbs(_parser())["run"].format_help()
    for option in ("--executors", "--address", "--log-level", "--verbose", "--source"):
        assert option in text
    assert "(default: serial)" in text and "(default: 1)" in text


def test_readme_cli_reference_is_the_help():
    readme = README.read_text()
    assert BEGIN in readme and END in readme, "README lacks the generated CLI reference"
    begin = readme.index(BEGIN)
    section = readme[begin : readme.index(END, begin) + len(END)]
    assert section == reference(), "README's CLI reference is stale: python tests/test_cli_help.py"


def _write_readme_reference() -> None:
    readme = README.read_text()
    begin = readme.index(BEGIN)
    end = readme.index(END, begin) + len(END)
    README.write_text(readme[:begin] + reference() + readme[end:])


if __name__ == "__main__":
    import os

    os.environ["COLUMNS"] = "200"
    _write_readme_reference()
    sys.exit(0)
