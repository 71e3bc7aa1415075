"""What the import contracts (pyproject.toml, `lint-imports`) cannot state: no modules of
txstream form a circle, type hints' imports counted; and a module is imported by name only
in the two registries, so that every other dependency is one the contracts see."""

from __future__ import annotations

import re
from pathlib import Path

import grimp
import pytest
import txstream

PACKAGE = Path(txstream.__file__).parent
REGISTRIES = {"schedulers/__init__.py", "topologies/__init__.py"}
"""The scheduler and topology registries: they import a strategy or a topology by name."""
BY_NAME = re.compile(r"\bimport_module\b|\b__import__\b")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("txstream", exclude_type_checking_imports=False, cache_dir=None)


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def _one_circle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """A circle through the first module of ``component``, as ``a -> b -> ... -> a``."""
    first = component[0]
    for imported in sorted(graph.find_modules_directly_imported_by(first)):
        if imported in component:
            back = graph.find_shortest_chain(importer=imported, imported=first)
            return " -> ".join((first, *back))
    return first


def test_no_modules_import_each_other_in_a_circle(graph):
    circles = [_one_circle(graph, component) for component in _circles(graph)]
    assert not circles, "import circles (type hints' imports counted):\n" + "\n".join(circles)


def _package_files(graph: grimp.ImportGraph) -> list[Path]:
    """The package's own source files (tests/ and bench/ are not part of it)."""
    files = []
    for module in graph.modules:
        parts = module.split(".")[1:]
        path = PACKAGE.joinpath(*parts)
        files.append(path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))
    return sorted(files)


def test_only_the_registries_import_modules_by_name(graph):
    by_name = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _package_files(graph)
        if str(path.relative_to(PACKAGE)) not in REGISTRIES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BY_NAME.search(line)
    ]
    assert not by_name, "imports by name outside the registries:\n" + "\n".join(by_name)


def test_the_circle_check_sees_type_hints(graph):
    """The graph the circle check reads holds an import made only for type hints."""
    plain = grimp.build_graph("txstream", exclude_type_checking_imports=True, cache_dir=None)
    importer, imported = "txstream.schedulers.base", "txstream.config"
    assert graph.direct_import_exists(importer=importer, imported=imported)
    assert not plain.direct_import_exists(importer=importer, imported=imported)
