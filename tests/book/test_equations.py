"""The equation index (``ccu/book/equations.py``) against README.md, ``book/api.md``, the docstrings,
the book's table of contents and, where it is next to the checkout, the paper's TeX."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

import ccu
from ccu.book.equations import INDEX, N_EQUATIONS, TABLE_HEADER, Entry, lookup, table_row

ROOT = Path(__file__).resolve().parents[2]
TEX = ROOT.parent / "shared" / "paper" / "ccu-iclr2020.tex"


def resolve(name: str):
    """The object ``ccu.<...>`` names (a module attribute, or an attribute of one)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ModuleNotFoundError(name)


def chapter_title(chapter: str) -> str:
    """The chapter's first ``# `` heading."""
    cells = json.loads((ROOT / f"{chapter}.ipynb").read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    raise AssertionError(f"{chapter}.ipynb has no '# ' title")


def toc_files() -> set[str]:
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.add(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    walk(toc)
    found.add(toc["root"])
    return found


def entry_problems(entry: Entry) -> list[str]:
    """Everything wrong with one entry (empty when it is right)."""
    problems = []
    for field in (entry.ref, entry.what, entry.label, entry.chapter, *entry.functions):
        if "|" in field:
            problems.append(f"{entry.ref}: '|' would split the Markdown table: {field!r}")
    if not entry.functions:
        problems.append(f"{entry.ref}: names no function")
    stem = entry.chapter.removeprefix("book/")
    if not entry.chapter.startswith("book/") or not (ROOT / f"{entry.chapter}.ipynb").exists():
        problems.append(f"{entry.ref}: no chapter {entry.chapter}.ipynb")
    elif entry.chapter not in toc_files():
        problems.append(f"{entry.ref}: {entry.chapter} is not in _toc.yml")
    for name in entry.functions:
        parts = name.split(".")
        if parts[0] != "ccu" or any(p.startswith("_") for p in parts):
            problems.append(f"{entry.ref}: {name} is not a public ccu name")
            continue
        try:
            obj = resolve(name)
        except (ImportError, AttributeError) as err:
            problems.append(f"{entry.ref}: {name} does not exist ({err})")
            continue
        if len(parts) == 2 and parts[1] not in ccu.__all__:
            problems.append(f"{entry.ref}: {name} is not in ccu.__all__")
        doc = inspect.getdoc(obj) or ""
        if entry.cite.lower() not in doc.lower():  # "Eq. (4)" starting a sentence cites it
            problems.append(f"{entry.ref}: {name}'s docstring does not cite {entry.cite!r}")
        if f"book/{stem}.ipynb" not in doc:
            problems.append(f"{entry.ref}: {name}'s docstring does not name book/{stem}.ipynb")
    return problems


def table_problems(text: str, chapter_cell) -> list[str]:
    """Differences between the table in ``text`` and :data:`INDEX`; ``chapter_cell(entry)`` is
    the chapter column the file uses."""
    lines = text.splitlines()
    if TABLE_HEADER[0] not in lines:
        return [f"no table with the header {TABLE_HEADER[0]!r}"]
    start = lines.index(TABLE_HEADER[0])
    if lines[start + 1] != TABLE_HEADER[1]:
        return ["the header's separator row differs"]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    expected = [table_row(e, chapter_cell(e)) for e in INDEX]
    problems = [
        f"row {i + 1}: {got!r}\n  expected {want!r}"
        for i, (got, want) in enumerate(zip(rows, expected, strict=False))
        if got != want
    ]
    if len(rows) != len(expected):
        problems.append(f"{len(rows)} rows, the index has {len(expected)}")
    return problems


def readme_cell(entry: Entry) -> str:
    return f"[{chapter_title(entry.chapter)}]({entry.chapter}.ipynb)"


def api_cell(entry: Entry) -> str:
    return "{doc}`" + entry.chapter.removeprefix("book/") + "`"


@pytest.mark.parametrize("entry", INDEX, ids=[e.ref for e in INDEX])
def test_entry(entry):
    assert entry_problems(entry) == []


def test_every_equation_once():
    numbers = sorted(n for e in INDEX for n in e.equations)
    assert numbers == list(range(1, N_EQUATIONS + 1))
    assert len({e.ref for e in INDEX}) == len(INDEX)


@pytest.mark.parametrize(
    ("path", "cell"), [("README.md", readme_cell), ("book/api.md", api_cell)], ids=["README", "api"]
)
def test_tables_equal_the_index(path, cell):
    problems = table_problems((ROOT / path).read_text(), cell)
    assert not problems, "\n".join(problems)


def test_the_checks_can_fail():
    good = lookup("eq. (6)")
    broken = [
        dataclasses.replace(good, functions=("ccu.no_such_function",)),
        dataclasses.replace(good, functions=("ccu.core.losses._no_such",)),
        dataclasses.replace(good, functions=("ccu.confidence_bound",)),  # cites Corollary 3.1
        dataclasses.replace(good, ref="eq. (99)"),  # ccu_loss does not cite it
        dataclasses.replace(good, chapter="book/no_such_chapter"),
        dataclasses.replace(good, chapter="book/theorem1"),  # ccu_loss names book/training
        dataclasses.replace(good, what="p(y|x)"),
    ]
    for entry in broken:
        assert entry_problems(entry), entry
    readme = (ROOT / "README.md").read_text()
    row = table_row(good, readme_cell(good))
    assert table_problems(readme.replace(row, row.replace("ccu_loss", "ccu_los")), readme_cell)
    assert table_problems(readme.replace(row + "\n", ""), readme_cell)
    with pytest.raises(KeyError):
        lookup(99)


def tex_numbers(tex: str) -> dict[str, str]:
    """Label (or, unlabelled, the number itself) -> printed number for the paper's equations,
    theorems, figures and tables, and ``"#equations"`` -> how many equations it numbers."""
    body = tex.split("\\end{document}")[0]
    found: dict[str, str] = {}
    counts = {"equation": 0, "figure": 0, "table": 0, "theorem": 0, "corollary": 0}
    section, n_sections, appendix = "0", 0, False
    pattern = (
        r"(?P<appendix>\\appendix\b)|(?P<section>\\section\{)"
        r"|\\begin\{(?P<env>equation|align|figure|table)\}(?P<content>.*?)\\end\{(?P=env)\}"
        r"|\\begin\{(?P<thm>theorem|corollary)\}(?:\\label\{(?P<thm_label>[^}]+)\})?"
    )
    for m in re.finditer(pattern, body, flags=re.S):
        if m["appendix"]:
            n_sections, appendix = 0, True  # sections from here on are lettered A, B, ...
        elif m["section"]:
            n_sections += 1
            section = chr(ord("A") + n_sections - 1) if appendix else str(n_sections)
            counts["theorem"] = counts["corollary"] = 0
        elif m["thm"]:
            counts[m["thm"]] += 1
            number = f"{m['thm'].capitalize()} {section}.{counts[m['thm']]}"
            found[m["thm_label"] or number] = number
        elif m["env"] in ("figure", "table"):  # numbered in caption order, per kind
            for label in re.findall(r"\\caption\{\\label\{([^}]+)\}", m["content"]):
                counts[m["env"]] += 1
                found[label] = f"{m['env'].capitalize()} {counts[m['env']]}"
        else:  # equation or align: one number per row without \nonumber
            rows = m["content"].split("\\\\")
            first = counts["equation"] + 1
            counts["equation"] += sum("\\nonumber" not in r and "\\notag" not in r for r in rows)
            label = re.match(r"\s*\\label\{([^}]+)\}", m["content"])
            found[label[1] if label else f"({first})"] = f"({first})"
    found["#equations"] = str(counts["equation"])
    return found


@pytest.mark.skipif(not TEX.exists(), reason="the paper's TeX is not next to the checkout")
def test_numbers_match_the_tex():
    numbers = tex_numbers(TEX.read_text())
    assert numbers["#equations"] == str(N_EQUATIONS)
    for entry in INDEX:
        for label in filter(None, entry.label.split(", ")):
            if label.startswith("App:"):  # an appendix section, not a number
                continue
            printed = numbers[label]
            if printed.startswith("("):
                assert int(printed[1:-1]) in entry.equations, (label, printed, entry.ref)
            else:
                assert entry.ref.startswith(printed), (label, printed, entry.ref)
        if entry.ref.startswith(("Theorem", "Corollary")):  # the appendix's restatements too
            assert entry.cite in numbers.values(), (entry.cite, sorted(numbers.values()))
