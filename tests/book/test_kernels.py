"""Chapters executed side by side (the book's build, the chapter tests) on kernels that talk over
IPC (ccu.book.kernels), and a chapter whose kernel cannot start reported as that chapter's
failure by tools/execute_chapters.py."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: what the kernel says of its own connection: the transport and where its sockets are
SAYS = "import ipykernel.connect as c, json\ninfo = json.loads(c.get_connection_info())\n"
SAYS += "print(info['transport'], info['ip'])"


def _notebook(path: Path, kernel: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SAYS)])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.notebooks
def test_the_books_chapters_run_on_ipc_kernels_and_a_dead_kernel_fails_its_chapter(tmp_path):
    pytest.importorskip("jupyter_cache")
    good = _notebook(tmp_path / "good.ipynb", "python3")
    dead = _notebook(tmp_path / "dead.ipynb", "no-such-kernel")
    cache = tmp_path / "cache"
    run = subprocess.run(
        [sys.executable, "tools/execute_chapters.py", "--cache", str(cache), "--jobs", "1",
         str(good), str(dead)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    # the chapter whose kernel never started is named and counted, the tool does not crash
    assert f"{dead} failed" in run.stderr and "no-such-kernel" in run.stderr
    assert "1 executed, 1 failed" in run.stdout
    from jupyter_cache import get_cache

    (record,) = get_cache(str(cache)).list_cache_records()
    said = get_cache(str(cache)).get_cache_bundle(record.pk).nb.cells[0].outputs[0]["text"]
    transport, sockets = said.split()
    assert transport == "ipc"  # no TCP port to lose to another kernel starting at once
    assert Path(sockets).name and "ccu-kernels-" in sockets
    assert not Path(sockets).parent.exists()  # the sockets' folder went with the tool
