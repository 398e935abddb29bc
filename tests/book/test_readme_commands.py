"""The README's papermill command lines, run by bash as printed."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

papermill = pytest.importorskip("papermill")
from chapter_papermill import BOOK  # noqa: E402


def _readme_papermill_lines():
    """The README's papermill command lines (continuation lines joined), each with the other
    commands of its block before it (``mkdir -p _build/papermill``)."""
    text = (BOOK.parent / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines = [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
        runs = [ln for ln in lines if ln.startswith(".venv/bin/papermill ")]
        others = [ln for ln in lines if ln not in runs]
        out += [(ln, others) for ln in runs]
    return out


README_LINES = _readme_papermill_lines()


def test_the_readme_shows_json_and_yaml_parameters():
    assert len(README_LINES) >= 3
    joined = " ".join(line for line, _ in README_LINES)
    assert "-p overrides '{" in joined and "-p methods '[" in joined and " -y '" in joined


def _lost_a_port_race(done) -> bool:
    """Whether papermill's kernel died at its start because another process took one of its TCP
    ports first (jupyter_client picks free ports, lets them go, and the kernel binds them a
    moment later). The line runs as printed, so with papermill's default TCP transport, not
    ccu.book.kernels' IPC (what the other chapter tests and the book's build use): such a start
    is tried once more. A chapter that fails fails both times and is reported."""
    said = done.stderr
    return (
        done.returncode != 0
        and "Kernel died before replying to kernel_info" in said
        and "Address already in use" in said
    )


@pytest.mark.notebooks
@pytest.mark.parametrize("line, before", README_LINES, ids=lambda v: str(v).split()[4:5])
def test_the_readme_papermill_lines_run_as_printed(line, before, tmp_path):
    """Each README papermill line run by bash as printed, after the other lines of its block,
    in a folder laid out like the repository (its ``book/``, ``.venv/bin/papermill``)."""
    (tmp_path / "book").symlink_to(BOOK)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "papermill").symlink_to(Path(sys.executable).parent / "papermill")
    env = dict(os.environ, CCU_RESULTS=str(tmp_path / "results"))
    script = "\n".join(["set -e", *before, line])
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    if _lost_a_port_race(done):  # not the chapter's failure: jupyter_client's (see below)
        done = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
        )
    assert done.returncode == 0, done.stderr[-3000:]
    args = shlex.split(line)
    nb = json.loads((tmp_path / args[4]).read_text())
    said = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    if "-p plugins" in line:  # the plug-in's method trained beside the paper's, its code recorded
        (runs,) = (tmp_path / "results").glob("smoke*/digits/seed0")
        trained = sorted(p.parent.name for p in runs.glob("*/config.json"))
        assert trained == ["Base", "CCU", "Energy"]
        (code,) = json.loads((runs / "Energy" / "config.json").read_text())["plugin_code"]
        assert code["class"] == "Energy" and code["file"] == "energy.py"
        return
    epochs = re.search(r"epochs\W+(\d+)", line).group(1)
    # the profile is named after its overrides (e.g. smoke-e5-n500)
    assert re.search(rf"profile smoke[-\w]*: {epochs} epochs?\b", said), said[-500:]
    if "-p methods" in line:  # the JSON list reached the chapter: these two were trained
        (runs,) = (tmp_path / "results").glob("smoke*/digits/seed0")
        assert sorted(p.parent.name for p in runs.glob("*/config.json")) == ["Base", "CCU"]
