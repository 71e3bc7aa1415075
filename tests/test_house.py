"""The repository speaks of the product, not of how it was built.

Code, docstrings, comments and documents say what txstream is and why it is so; the story
of its making belongs to git. This test fails on words of a work period in any tracked
text file (bench/results excepted: result files keep the names they were written under),
and prints every hit as file:line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
SKIPPED = ("bench/results/",)
UNTRACKED = {".git", ".venv", "__pycache__", "data", "out"}
"""Folders a tree walk passes over where git cannot list the tracked files."""
S = "stop"
"""The word, joined here so that this file does not carry the phrases it looks for."""

_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_ORDINALS = (
    rf"\d+(?:st|nd|rd|th)|(?:twenty|thirty|forty|fifty)-?(?:{_UNITS})|(?-i:First)|second"
    r"|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|(?:thir|four|fif|six|seven|eigh|nine)teenth|(?:twen|thir|for|fif)tieth"
)
"""Ordinals that number a period of work ("Seventh pass", "Twenty-first pass", "2nd round").
A lowercase "first" is left out: "the first round" of a benchmark is its warm-up, not a
period of work."""
WORK_PERIOD = {
    "a numbered stop": re.compile(rf"\b{S}s? \d+\b", re.I),
    "the present period": re.compile(rf"\bthis {S}\b(?!\()", re.I),
    "a numbered pass or round": re.compile(rf"\b(?:{_ORDINALS}) (?:pass|round)\b", re.I),
    "a named helper": re.compile(r"\bhelpers? `\w+`"),
    "an issue number": re.compile(r"\bissues? #?\d+\b", re.I),
    # "#19" in prose: not a colour (#222;), an anchor (#1-intro), a format or a regex
    "a ticket number": re.compile(r"(?:^|(?<=[(\[])|(?<=[^:\s]\s))#\d{1,3}(?=[\s).,:\]]|$)"),
}
"""Each kind of work-period word and a pattern that finds it. `stop()` and SIGSTOP, a pass
through data, a round trip and "#" in code do not match."""


def tracked_texts() -> list[Path]:
    """Tracked files of the repository, as paths relative to it, but for `SKIPPED` and this
    file (its patterns would match themselves); outside a git checkout, every file of the
    tree but those under `UNTRACKED`."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        names = [n for n in listed.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if not UNTRACKED.intersection(p.relative_to(ROOT).parts)
        ]
    return [
        Path(n) for n in names if not n.startswith(SKIPPED) and n != SELF and (ROOT / n).is_file()
    ]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    data = (ROOT / path).read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def work_period_words(path: Path, text: str) -> list[str]:
    """Every line of ``text`` with a work-period word, as "file:line: kind: line"."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        for kind, pattern in WORK_PERIOD.items():
            if pattern.search(line):
                hits.append(f"{path}:{number}: {kind}: {line.strip()[:120]}")
    return hits


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (f"connects sooner (docs/performance.md, {S} 49)", "a numbered stop"),
        (f"{S.title()} 28's figures", "a numbered stop"),
        (f"as measured this {S}", "the present period"),
        ("in the third pass over the docs", "a numbered pass or round"),
        ("a 2nd round of review", "a numbered pass or round"),
        (f"### Twenty-first pass ({S} 47): Spark's driver", "a numbered pass or round"),
        ("Second pass: the first run", "a numbered pass or round"),
        ("the helper `sparkstop` ends it", "a named helper"),
        ("the acceptance of issue 12", "an issue number"),
        ("see issues #18 and #19", "an issue number"),
        ("fixed in #19.", "a ticket number"),
        ("(#7)", "a ticket number"),
    ],
)
def test_each_pattern_finds_its_kind(line, kind):
    assert WORK_PERIOD[kind].search(line)


@pytest.mark.parametrize(
    "line",
    [
        "session.stop()",
        "os.kill(pid, signal.SIGSTOP)",
        "def stop(self) -> None:",
        "ray stop --force",
        "the ProgressController's pass over the chunk",
        "one kernel pass over the events",
        "a Coordinator round trip",
        "After round one, a fixed strategy runs again",
        "the first round of a process is the slow one",
        "an untimed warm-up pass",
        "inlined helpers and kernels",
        "color: #222; margin: 0",
        'f"{label} #{attempt}"',
        "x = values[1]  # the first",
        "see docs/design.md#1-layers",
        r"re.sub(r'(\d)#1', ...)",
        "issues, if any, are logged",
    ],
)
def test_the_patterns_spare_code(line):
    assert not [k for k, p in WORK_PERIOD.items() if p.search(line)], line


def test_no_work_period_words_in_tracked_files():
    hits = []
    for path in tracked_texts():
        text = _text(path)
        if text is not None:
            hits += work_period_words(path, text)
    assert not hits, "words of a work period, not of the product:\n" + "\n".join(hits)
