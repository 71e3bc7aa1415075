"""The pairwise sampler covers every pair of values, in few cases."""

from __future__ import annotations

from itertools import combinations

from pairwise import all_pairs, pairwise


def test_every_pair_of_values_of_two_axes_is_covered_in_few_cases():
    axes = {"a": range(4), "b": range(4), "c": "xyz", "d": (1, 2), "e": range(5)}
    cases = pairwise(axes)
    covered = {((x, case[x]), (y, case[y])) for case in cases for x, y in combinations(axes, 2)}
    assert covered == all_pairs(axes)
    assert len(cases) <= 30  # the full product has 480


def test_required_cases_come_first_completed():
    cases = pairwise({"a": (1, 2), "b": (1, 2), "c": (1, 2, 3)}, required=[{"a": 2, "c": 3}])
    assert {"a": 2, "c": 3}.items() <= cases[0].items() and "b" in cases[0]
