"""Pairwise sampling of test matrices: every value of every axis meets every value of
every other axis in at least one case, in far fewer cases than the full product.

Greedy, deterministic: start from the ``required`` cases, then repeatedly add the
candidate that covers the most pairs not covered yet (candidates: every value of the
axis with the most uncovered pairs, completed greedily axis by axis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

Case = dict[str, Any]


def _pairs(case: Case, names: Sequence[str]) -> set[tuple]:
    return {((a, case[a]), (b, case[b])) for a, b in combinations(names, 2)}


def all_pairs(axes: Mapping[str, Sequence[Any]]) -> set[tuple]:
    """Every pair of values of two different axes."""
    names = list(axes)
    return {((a, x), (b, y)) for a, b in combinations(names, 2) for x in axes[a] for y in axes[b]}


def pairwise(axes: Mapping[str, Sequence[Any]], required: Sequence[Case] = ()) -> list[Case]:
    """Cases (dicts axis -> value) covering every pair of values of two axes; the
    ``required`` cases (complete, or partial: missing axes are chosen) come first."""
    names = list(axes)
    uncovered = all_pairs(axes)
    cases: list[Case] = []

    def complete(case: Case) -> Case:
        for name in names:
            if name not in case:
                case[name] = max(axes[name], key=lambda v: _gain({**case, name: v}))
        return case

    def _gain(partial: Case) -> int:
        known = [n for n in names if n in partial]
        return len(_pairs(partial, known) & uncovered)

    for case in required:
        case = complete(dict(case))
        cases.append(case)
        uncovered -= _pairs(case, names)
    while uncovered:
        (a, x), (b, y) = min(uncovered, key=lambda p: (names.index(p[0][0]), repr(p)))
        case = complete({a: x, b: y})
        cases.append(case)
        uncovered -= _pairs(case, names)
    return cases
