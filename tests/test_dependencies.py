"""What txstream declares it runs with (pyproject.toml's ranges), what CI runs (the pins of
constraints.txt) and what its private uses of Ray were checked against agree; the core needs
no Spark."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from txstream.cluster import ray_private

ROOT = Path(__file__).resolve().parent.parent
SPARK = {"pyspark", "raydp", "py4j"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared() -> dict[str, Requirement]:
    project = _project()
    lines = [*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]
    return {canonicalize_name(req.name): req for req in map(Requirement, lines)}


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"constraints.txt pins exact versions only: {line}"
            pins[canonicalize_name(name)] = pinned
    return pins


def test_the_core_needs_no_spark_and_the_extra_brings_it():
    project = _project()
    core = {Requirement(line).name.lower() for line in project["dependencies"]}
    assert not core & SPARK
    extra = project["optional-dependencies"]["spark"]
    assert {Requirement(line).name.lower() for line in extra} == {"pyspark", "raydp"}


def test_every_declared_package_is_pinned_within_its_range():
    pins = _pins()
    assert "txstream" not in pins
    for name, requirement in _declared().items():
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name]), (requirement, pins[name])


def test_the_declared_and_pinned_ray_is_the_one_its_private_uses_were_checked_on():
    low, high = ray_private.TESTED
    assert str(_declared()["ray"].specifier) == ",".join(
        sorted([f">={low[0]}.{low[1]}", f"<{high[0]}.{high[1]}"])
    )
    pinned = tuple(int(part) for part in re.findall(r"\d+", _pins()["ray"])[:2])
    assert low <= pinned < high


def test_this_virtualenv_runs_the_pinned_set():
    pins = _pins()
    for name in _declared():
        assert version(name) == pins[name], name
