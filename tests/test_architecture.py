"""The shape of the code: the import graph of the lamina packages is acyclic (imports under
``TYPE_CHECKING`` and inside functions count too), and modules stay small.

The graph is built from the source with ``ast`` (nothing is imported), from the package
layout that ``pyproject.toml`` declares: each ``lamina.X`` package maps to a top-level folder.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 600
#: Modules over the limit still to be split, and import cycles still to be broken (a cycle
#: found must lie within one of these sets): both empty, and they only ever shrink.
OVERSIZED: set[str] = set()
KNOWN_CYCLES: tuple[frozenset[str], ...] = ()


def _packages() -> dict[str, Path]:
    """Package name -> folder, from ``[tool.setuptools] package-dir``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = config["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in package_dir.items()}


def _modules() -> dict[str, Path]:
    """Every module of every lamina package: dotted name -> file."""
    modules: dict[str, Path] = {}
    for package, folder in _packages().items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The lamina modules ``name`` imports, wherever the import statement stands."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:  # ``from pkg import name``: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # ``from . import keys`` imports the module keys
                candidate = f"{module}.{alias.name}"
                add(candidate if candidate in modules else module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one
    module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_covers_every_package_and_sees_relative_imports():
    graph = _graph()
    assert {name.split(".")[1] for name in graph} >= {"engine", "server", "tools"}
    assert "lamina.engine.state" in graph["lamina.engine.core"]
    assert "lamina.engine.keys" in graph["lamina.engine.core"]  # ``from . import keys``


def test_the_cycle_finder_reports_each_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(map(sorted, _cycles(graph))) == [["a", "b", "c"], ["d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_lamina_modules():
    unknown = [sorted(cycle) for cycle in _cycles(_graph())
               if not any(cycle <= known for known in KNOWN_CYCLES)]
    assert not unknown, f"import cycles: {unknown}"


def test_the_engine_imports_no_cycle():
    assert not [cycle for cycle in _cycles(_graph())
                if any(name.startswith("lamina.engine") for name in cycle)]


def test_the_known_cycles_are_still_there():
    cycles = _cycles(_graph())
    gone = [sorted(known) for known in KNOWN_CYCLES if not any(c <= known for c in cycles)]
    assert not gone, f"broken already, drop them from KNOWN_CYCLES: {gone}"


def test_modules_stay_under_the_size_limit():
    too_big = {
        name: lines for name, path in _modules().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
        and name not in OVERSIZED
    }
    assert not too_big, f"modules over {MAX_MODULE_LINES} lines: {too_big}"


def test_the_list_of_oversized_modules_only_names_modules_still_too_big():
    modules = _modules()
    fixed = [name for name in OVERSIZED
             if len(modules[name].read_text().splitlines()) <= MAX_MODULE_LINES]
    assert not fixed, f"no longer over the limit, drop them from OVERSIZED: {fixed}"
