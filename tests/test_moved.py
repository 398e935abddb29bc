"""The modules' old names (before the packages by role, ``CHANGELOG.md``) still import, give the
new modules with a warning that points at the import, and nothing of ours uses them any more."""

import ast
import importlib
import json
import re
import sys
import warnings
from pathlib import Path

import pytest

import ccu
from ccu._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_gives_the_new_module_and_says_where_it_went(old, monkeypatch):
    new = MOVED[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    parent, _, leaf = old.rpartition(".")
    monkeypatch.delattr(sys.modules[parent], leaf, raising=False)
    first = new if isinstance(new, str) else new[0]
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {first}")) as caught:
        __import__(old)  # as an import statement does
    module = sys.modules[old]
    assert caught[0].filename == __file__  # the warning points at the importing line
    if isinstance(new, str):
        assert module is importlib.import_module(new)
        assert module.__name__ == new and module.__spec__.name == new  # not renamed by the alias
        return
    for part in map(importlib.import_module, new):  # a split module: every name of every part
        for name in (n for n in vars(part) if not n.startswith("_")):
            assert hasattr(module, name), (old, part.__name__, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_an_old_notebooks_imports_run():
    """The statements of a notebook written before the move, each with its warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from ccu.config import get_profile
        from ccu.guarantees import certify_sets, field_table
        from ccu.steps import RunTimes, TimeBox, train_one
        from ccu.testing import check_density

    assert get_profile("smoke").epochs >= 1
    assert callable(check_density) and callable(certify_sets) and callable(field_table)
    assert TimeBox(None).on_epoch_end is None and callable(train_one) and RunTimes
    assert ccu.certified_radius is importlib.import_module("ccu.core.bounds").certified_radius


#: the old names without ``ccu.``: ``results``, ``config``, ...
OLD_LEAVES = {m.split(".", 1)[1] for m in MOVED}
#: an old module name as docs and comments spell it: ``ccu.results``, ``ccu/results.py`` aside
OLD_NAME = re.compile(rf"\bccu\.({'|'.join(sorted(OLD_LEAVES, key=len, reverse=True))})\b(?![\w/])")


def old_imports(source: str) -> list[str]:
    """The imports of ``source`` (Python) that name a module by its old name, however they are
    written: ``import ccu.results``, ``from ccu.config import x``, ``from ccu import (results,
    ...)`` over several lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                a.name for a in node.names if a.name in MOVED or a.name.rpartition(".")[0] in MOVED
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in MOVED:
                found.append(node.module)
            elif node.module == "ccu":
                found += [f"ccu.{a.name}" for a in node.names if a.name in OLD_LEAVES]
    return found


def _code(path: Path) -> str:
    """A file's Python: the file itself, a Snakefile's import statements, or a notebook's code
    cells (IPython magics and shell lines left out)."""
    if path.name == "Snakefile":  # Snakemake's own syntax around Python
        lines = path.read_text().splitlines()
        return "\n".join(ln for ln in lines if ln.startswith(("import ", "from ")))
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return "\n".join(
        ln for c in code for ln in c.splitlines() if not ln.lstrip().startswith(("%", "!"))
    )


def test_old_imports_are_found_however_they_are_written():
    source = "import ccu.results\nfrom ccu import (\n    chapter,\n    report,\n)\nfrom ccu.config import a\n"
    assert old_imports(source) == ["ccu.results", "ccu.chapter", "ccu.config"]
    assert OLD_NAME.findall("see ccu.results.write_json and ccu/results.py") == ["results"]


def test_nothing_of_ours_uses_an_old_name():
    files = [
        path
        for folder in ("ccu", "tools", "book", "tests", "benchmarks", "workflow")
        for pattern in ("*.py", "*.ipynb", "*.md", "Snakefile", "*.sh")
        for path in sorted((ROOT / folder).rglob(pattern))
        if "_build" not in path.parts
    ] + [ROOT / "README.md"]
    # the aliases themselves, this test, and the layer rule's example of the flat layout
    allowed = {ROOT / "ccu" / "_moved.py", Path(__file__), ROOT / "tests" / "test_import_graph.py"}
    found = []
    for path in (p for p in files if p not in allowed):
        rel = path.relative_to(ROOT)
        found += [f"{rel}: {m.group(0)}" for m in OLD_NAME.finditer(path.read_text())]
        if path.suffix in (".py", ".ipynb") or path.name == "Snakefile":
            found += [f"{rel}: import of {name}" for name in old_imports(_code(path))]
    assert len(files) > 100 and not found, found
