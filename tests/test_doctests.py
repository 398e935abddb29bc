"""Every docstring example of the library runs: each ``ccu`` module with a ``>>>`` line is
doctested (found by reading the sources, so a new example is run without listing it here)."""

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ccu"
WITH_EXAMPLES = sorted(
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
    for p in PACKAGE.rglob("*.py")
    if ">>> " in p.read_text(encoding="utf-8")
)


def test_the_examples_are_found():
    # ccu.book.equations and ccu.core.density_check hold examples: an empty list means the search broke
    assert {"ccu.book.equations", "ccu.core.density_check"} <= set(WITH_EXAMPLES)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
