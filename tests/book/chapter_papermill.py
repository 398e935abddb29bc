"""Running a chapter through papermill, as the README does, for the chapter tests
(``test_notebooks.py``, ``test_readme_commands.py``, ``test_chapter_runs.py``,
``test_resnet_chapters.py``: files of their own, so that pytest-xdist runs them side by side)."""

import json
from pathlib import Path

import papermill

from ccu.book.kernels import IPCKernelManager

BOOK = Path(__file__).resolve().parents[2] / "book"
CHAPTERS = sorted(p.stem for p in BOOK.glob("*.ipynb"))


def run_chapter(tmp_path, chapter, **params):
    out = tmp_path / f"{chapter}.ipynb"
    papermill.execute_notebook(
        str(BOOK / f"{chapter}.ipynb"),
        str(out),
        parameters=params,
        cwd=str(BOOK),
        kernel_name="python3",
        progress_bar=False,
        kernel_manager_class=IPCKernelManager,  # never races other kernels for ports
    )
    return json.loads(out.read_text())


def glued(nb):
    """Values glued by myst-nb in an executed notebook: {name: text/plain}."""
    found = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("scrapbook", {})
            if meta.get("name"):
                found[meta["name"]] = out["data"].get(meta["mime_prefix"] + "text/plain")
    return found
