"""The modules of ``ccu`` import each other without a circle.

Every ``import`` statement of every module under ``ccu/`` counts, also those inside functions:
an import moved into a function only to dodge a circle is still a circle (the modules still
need each other), so it fails here like a top-level one. An edge goes from a module to the
module it names: ``import ccu.data.registry`` and ``from ccu.data.registry import get_spec``
to ``ccu.data.registry``; ``from ccu.data import in_distributions`` to the submodule
``ccu.data.in_distributions``; ``from ccu.data import get_spec`` (a name the package re-exports)
to the package ``ccu.data``.

The rules this enforces:

* No module reaches itself through imports (the graph has no cycle).
* A package's ``__init__`` may re-export from its submodules; so a submodule imports from the
  module that defines a name (``from ccu.run.config import get_profile``), never a re-exported name
  from its own or a parent package (``import ccu`` or ``from ccu import get_profile`` inside
  ``ccu.run.guarantees`` would make ``ccu.run.guarantees -> ccu -> ... -> ccu.run.guarantees``). Naming a
  submodule through its package (``from ccu import results``) is an edge to that submodule.
* The implicit import of a module's parent packages is not an edge: Python runs a package's
  ``__init__`` to the end before the body of any of its submodules starts, so it cannot
  interrupt one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_files(package: Path) -> dict[str, Path]:
    """Every module under ``package`` by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> dict[str, int]:
    """The modules of ``known`` that ``module`` imports, each with the line of its first import."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in known:  # ``import ccu.data.registry.x``: the module
            target = target.rpartition(".")[0]
        if target and target != module:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):  # also inside functions
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                add(submodule if submodule in known else source, node.lineno)
    return found


def import_graph(package: Path) -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    files = module_files(package)
    known = set(files)
    return {m: imports_of(m, p, known) for m, p in files.items()}, files


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def describe(cycle: list[str], graph, files, root: Path = ROOT) -> str:
    """The cycle one import per line, with the file and line of each."""
    steps = [
        f"  {a} -> {b}  ({files[a].relative_to(root)}:{graph[a][b]})"
        for a, b in zip(cycle, cycle[1:], strict=False)
    ]
    return "import cycle:\n" + "\n".join(steps)


def test_ccu_has_no_import_cycle():
    graph, files = import_graph(ROOT / "ccu")
    assert len(graph) > 30 and "ccu.data.registry" in graph["ccu.data"]
    cycle = find_cycle(graph)
    assert cycle is None, describe(cycle, graph, files)


def package_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports of a name from a package that contains the importing module (``import ccu`` or
    ``from ccu import get_profile`` in ``ccu.book.plots``), as ``module -> package``."""
    return sorted(
        f"{m} -> {t}" for m, targets in graph.items() for t in targets if m.startswith(f"{t}.")
    )


def test_no_module_imports_its_own_package():
    graph, _ = import_graph(ROOT / "ccu")
    bad = package_imports(graph)
    assert not bad, f"import from the defining module (ccu.<module>) instead: {bad}"


def test_the_graph_sees_function_level_package_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import f\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nfrom . import c\n")
    (pkg / "sub" / "c.py").write_text("import pkg\n")
    graph, _ = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.a": 1},
        "pkg.a": {"pkg.sub.b": 2},
        "pkg.sub": {},
        "pkg.sub.b": {"pkg.a": 1, "pkg.sub.c": 2},
        "pkg.sub.c": {"pkg": 1},
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    assert package_imports(graph) == ["pkg.sub.c -> pkg"]


@pytest.mark.parametrize(
    "files",
    [
        {"a": "import pkg.b\n", "b": "def g():\n    from pkg.a import x\n"},
        {"a": "from pkg import x\n", "__init__": "from pkg.a import y\n"},
    ],
)
def test_a_cycle_is_found_and_named(tmp_path, files):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / f"{name}.py").write_text(text)
    graph, paths = import_graph(pkg)
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) == 3
    text = describe(cycle, graph, paths, tmp_path)
    assert text.startswith("import cycle:") and f"{cycle[0]} -> {cycle[1]}" in text


#: the role packages of ``ccu``, each with the roles it may import (besides itself). Lower roles
#: never import higher ones: the math (core) stands alone; the data layer knows no model; the
#: results store knows no method, run nor report, so every one of them can use it; the report
#: draws tables from stored results without running or building a method; runs use all but the
#: book; the book's helpers use everything.
LAYERS = {
    "ccu.core": set(),
    "ccu.data": {"ccu.core"},
    "ccu.store": {"ccu.core", "ccu.data"},
    "ccu.methods": {"ccu.core", "ccu.data", "ccu.store"},
    "ccu.report": {"ccu.core", "ccu.data", "ccu.store"},
    "ccu.run": {"ccu.core", "ccu.data", "ccu.store", "ccu.methods", "ccu.report"},
    "ccu.book": {"ccu.core", "ccu.data", "ccu.store", "ccu.methods", "ccu.report", "ccu.run"},
}
#: modules outside the role packages: the package, its entry points, its version, the aliases
#: of moved modules and the folder of the paper's and the field's published tables
TOP_LEVEL = {"ccu", "ccu.__main__", "ccu._version", "ccu._moved", "ccu.cli", "ccu.cli_parser",
             "ccu.reference"}  # fmt: skip
#: modules of the data layer's own role that a model would be: data imports none of them
MODELS = ("ccu.core.model", "ccu.core.nets", "ccu.core.density", "ccu.core.diag_gmm")
#: what every role may import
EVERYONE = {"ccu._version"}


def role(module: str) -> str | None:
    """The role package of ``module`` (``ccu.core`` for ``ccu.core.bounds``), None for top level."""
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every module outside the role packages and :data:`TOP_LEVEL`, and every import that goes
    against :data:`LAYERS` (or from the data layer to a model), as one line each."""
    bad = [f"{m}: not in a role package {sorted(LAYERS)}" for m in sorted(graph)
           if role(m) is None and m not in TOP_LEVEL]  # fmt: skip
    for m, targets in sorted(graph.items()):
        mine = role(m)
        if mine is None:
            continue
        for t, line in sorted(targets.items()):
            theirs = role(t)
            allowed = theirs == mine or theirs in LAYERS[mine] or t in EVERYONE
            if mine == "ccu.data" and t.startswith(MODELS):
                allowed = False
            if not allowed:
                bad.append(f"{m} -> {t} (line {line}): {mine} may import {sorted(LAYERS[mine])}")
    return bad


def test_every_module_sits_in_its_role_and_imports_only_lower_roles():
    graph, _ = import_graph(ROOT / "ccu")
    bad = layer_violations(graph)
    assert not bad, "\n".join(bad)


def test_the_layer_rule_fails_on_a_flat_layout_and_on_an_import_against_the_grain(tmp_path):
    """The rule is not vacuous: the layout before the move (modules side by side at the top
    level) fails it, and so does one import upwards (a core module reading the store)."""
    flat = {"ccu": {}, "ccu.results": {}, "ccu.bounds": {"ccu.results": 3}}
    assert layer_violations(flat) == [
        "ccu.bounds: not in a role package " + str(sorted(LAYERS)),
        "ccu.results: not in a role package " + str(sorted(LAYERS)),
    ]
    upward = {"ccu.core.bounds": {"ccu.store.results": 7}, "ccu.store.results": {},
              "ccu.data.sources": {"ccu.core.model": 2}, "ccu.core.model": {}}  # fmt: skip
    assert layer_violations(upward) == [
        "ccu.core.bounds -> ccu.store.results (line 7): ccu.core may import []",
        "ccu.data.sources -> ccu.core.model (line 2): ccu.data may import ['ccu.core']",
    ]
