"""Honest help: every option of every verb explained with its default, only built choices,
`--version`, and docs/options.md (the option reference) equal to `--help`.

`python tests/test_cli_help.py` rewrites docs/options.md's reference from `--help`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from txstream.cli.main import _parser, main
from txstream.monitor.logs import version
from txstream.schedulers import SCHEDULERS

OPTIONS = Path(__file__).parent.parent / "docs" / "options.md"
BEGIN = "<!-- cli-reference: generated from --help by tests/test_cli_help.py, do not edit -->"
END = "<!-- end of cli-reference -->"


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def reference() -> str:
    """What docs/options.md's reference must hold: `--help` of the command and each verb."""
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


def _section(text: str) -> str:
    assert BEGIN in text and END in text, "docs/options.md lacks the generated reference"
    begin = text.index(BEGIN)
    return text[begin : text.index(END, begin) + len(END)]


def check_reference(text: str) -> None:
    """Fail unless ``text`` (docs/options.md) holds exactly `--help` of every verb."""
    section = _section(text)
    for name, sub in _verbs(_parser()).items():
        for action in sub._actions:
            for option in action.option_strings:
                assert option in section, f"docs/options.md lacks {name} {option}"
    assert section == reference(), "docs/options.md is stale: python tests/test_cli_help.py"


def test_options_reference_is_the_help():
    check_reference(OPTIONS.read_text())


@pytest.mark.parametrize(
    "old, new",
    [
        ("  --overwrite ", "  "),  # an option missing
        ("replace a non-empty output", "replace an output"),  # its text differs
        ("(default: 10240)", "(default: 1024)"),  # its default differs
    ],
)
def test_a_stale_reference_fails(old, new):
    text = OPTIONS.read_text()
    assert old in text
    with pytest.raises(AssertionError):
        check_reference(text.replace(old, new, 1))


def _write_reference() -> None:
    text = OPTIONS.read_text()
    begin = text.index(BEGIN)
    end = text.index(END, begin) + len(END)
    OPTIONS.write_text(text[:begin] + reference() + text[end:])


if __name__ == "__main__":
    import os

    os.environ["COLUMNS"] = "200"
    _write_reference()
    sys.exit(0)
