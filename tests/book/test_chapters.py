"""The chapters' layout: notebooks are the only source, stripped, uniform and short-celled."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
MAX_CODE_LINES = 15
#: the rendered book shows about 80 characters of code; a longer line scrolls sideways
MAX_CODE_WIDTH = 80


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _source(cell):
    return "".join(cell["source"])


def test_the_chapters_are_the_notebooks():
    assert {p.stem for p in CHAPTERS} >= {
        "two_moons",
        "theorem1",
        "corollary1",
        "training",
        "ood_detection",
        "adversarial_noise",
    }


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_layout(path):
    cells = _cells(path)
    md = [_source(c) for c in cells if c["cell_type"] == "markdown"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert md[0].startswith("# "), "a chapter starts with its title"
    head = "\n".join(md[:2])
    assert "**Overview.**" in head and "**Prerequisites.**" in head
    assert any(s.lstrip().startswith("## Parameters") for s in md)
    assert "## Summary" in md[-1], "a chapter ends with its summary"
    tagged = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1, "exactly one parameters cell"
    for name in ("dataset", "profile", "seed", "device", "overrides"):
        assert re.search(rf"^{name} = ", _source(tagged[0]), re.M), name
    setup = code[code.index(tagged[0]) + 1]
    # statements, not physical lines: the formatter wraps a long call at 80 characters; the
    # imports aside (one per package of ccu the chapter uses: ccu.book, ccu.run, ...)
    statements = ast.parse(_source(setup)).body
    work = [s for s in statements if not isinstance(s, ast.Import | ast.ImportFrom)]
    assert "setup_chapter(" in _source(setup) and len(work) <= 2, (
        "setup: its imports and at most two statements"
    )
    for c in code:
        lines = _source(c).splitlines()
        assert len(lines) <= MAX_CODE_LINES, f"{len(lines)}-line code cell:\n{_source(c)}"
        wide = [ln for ln in lines if len(ln) > MAX_CODE_WIDTH]
        assert not wide, f"code lines over {MAX_CODE_WIDTH} characters: {wide}"
        assert not c.get("outputs") and c.get("execution_count") is None, "outputs are stripped"
        assert not re.search(r"^\s*assert\b", _source(c), re.M), (
            "no assertions in cells: a check behind the prose raises from ccu.book.checks\n"
            + _source(c)
        )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_figure_is_numbered_and_shown_once(path):
    """Each glued figure has a {glue:figure} directive (numbered, captioned), and its cell hides
    the copy it displays for Jupyter users (``remove-output``)."""
    cells = _cells(path)
    glued, shown = [], []
    for c in cells:
        src = _source(c)
        if c["cell_type"] == "code":
            names = re.findall(r"glue_figure\(\s*\"([^\"]+)\"", src)
            if names:
                assert "remove-output" in c["metadata"].get("tags", []), src
            glued += names
        else:
            for name, body in re.findall(r"```\{glue:figure\} (\S+)\n(.*?)```", src, re.S):
                assert re.search(r"^:name: fig-", body, re.M), f"{name} has no :name:"
                caption = [ln for ln in body.splitlines() if ln and not ln.startswith(":")]
                assert caption, f"{name} has no caption"
                shown.append(name)
    assert sorted(glued) == sorted(shown)
    assert len(set(glued)) == len(glued)


def _nbstripout_args():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["nbstripout"]["args"]


def test_notebooks_are_stripped_as_configured(tmp_path):
    cmd = [sys.executable, "-m", "nbstripout", "--verify", *_nbstripout_args()]
    ok = subprocess.run([*cmd, *map(str, CHAPTERS)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # and the check can fail: a notebook with an output and an execution count
    nb = json.loads(CHAPTERS[0].read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["execution_count"] = 3
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]
    dirty = tmp_path / "dirty.ipynb"
    dirty.write_text(json.dumps(nb))
    assert subprocess.run([*cmd, str(dirty)], capture_output=True).returncode != 0


#: a cross-reference to the library in a chapter's prose, e.g. {py:func}`ccu.ball_attack`
PY_ROLE = re.compile(r"\{py:(?:func|class|mod|meth|attr|data|exc)\}`(?:[^`<]*<)?~?([\w.]+)>?`")
#: what the API page documents: an auto-directive's target, and an automodule's ``:members:``
AUTO = re.compile(
    r"^\.\. auto(function|class|data|module|exception):: ([\w.]+)\n((?:   :.*\n)*)", re.M
)


def api_page_names(text: str) -> set[str]:
    """The names ``book/api.md`` documents (so that a ``{py:...}`` role to them is a link)."""
    names = set()
    for _, target, options in AUTO.findall(text):
        names.add(target)
        for line in options.splitlines():
            key, _, value = line.strip().partition(" ")
            if key == ":members:":
                names |= {f"{target}.{m.strip()}" for m in value.split(",") if m.strip()}
    return names


def test_every_library_name_a_chapter_links_is_on_the_api_page():
    """A ``{py:...}`` role whose target the API page does not document renders as plain text
    (the build is not nitpicky): the reader gets no link. Every one in the chapters' prose must
    name something ``book/api.md`` documents."""
    example = ".. automodule:: ccu.a\n   :members: f, g\n\n.. autofunction:: ccu.h\n"
    assert api_page_names(example) == {"ccu.a", "ccu.a.f", "ccu.a.g", "ccu.h"}
    documented = api_page_names((BOOK / "api.md").read_text())
    assert {"ccu.ball_attack", "ccu.run.balls.certify_balls"} <= documented  # the parse works
    missing = {}
    for path in CHAPTERS:
        for cell in _cells(path):
            if cell["cell_type"] == "markdown":
                for name in PY_ROLE.findall(_source(cell)):
                    if name not in documented:
                        missing.setdefault(name, []).append(path.stem)
    assert not missing, f"linked from chapters, not on book/api.md: {missing}"
