"""tools/pack_data.py: exactly the mirror files a run needs, in parts that fit a device call;
gathered again on the device; and the library hooks it rests on (mirror_sandbox, one IDX split
read from a mirror holding only its files)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ccu.data import download, sources

REPO = sources.REPO_ROOT
SHARED = REPO.parent / "shared" / "data"
MNIST_RUN = {  # what a run of `mnist` reads: its own files, Fashion-MNIST test, the JPEG copy
    "mnist/train-images-idx3-ubyte.gz",
    "mnist/train-labels-idx1-ubyte.gz",
    "mnist/t10k-images-idx3-ubyte.gz",
    "mnist/t10k-labels-idx1-ubyte.gz",
    "fashion-mnist/t10k-images-idx3-ubyte.gz",
    "fashion-mnist/t10k-labels-idx1-ubyte.gz",
    "cifar10/cifar10-jpeg.tar.gz",
}
needs_shared = pytest.mark.skipif(
    not all((SHARED / f).is_file() for f in sources.MIRROR_FILES if "tiny" not in f),
    reason=f"the offline mirrors are not in {SHARED} (CI has them; see data/README.md)",
)


@pytest.fixture(scope="module")
def pack_data():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import pack_data
    finally:
        sys.path.pop(0)
    return pack_data


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Decoded archives, shared by the module's packs."""
    return tmp_path_factory.mktemp("cache")


def _repo(path):
    """A small git checkout with .devdata/ ignored, as the project has it."""
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".gitignore").write_text("/.devdata/\n")
    (path / "code.py").write_text("x = 1\n" * 500)
    subprocess.run(["git", "add", ".gitignore", "code.py"], cwd=path, check=True)
    (path / "notes.txt").write_text("untracked, not ignored: travels too\n")
    return path


def _sha(path):
    return sources.sha256(path)


@needs_shared
def test_mnist_packs_exactly_the_files_its_run_reads(pack_data, cache, tmp_path):
    repo = _repo(tmp_path / "repo")
    m = pack_data.pack("mnist", repo / ".devdata", 56, SHARED, cache, repo=repo, log=lambda s: 0)
    # Fashion-MNIST's training files and cifar10/test.npz are left out: the run's data loads
    # bit-identical without them
    assert {e["file"] for e in m["files"]} == MNIST_RUN
    assert m["parts"] == 1 and m["carry"] == [".devdata/mnist/part-1"]
    part = repo / ".devdata" / "mnist" / "part-1"
    for e in m["files"]:
        f = part / e["file"]
        assert f.stat().st_size == e["bytes"] == (SHARED / e["file"]).stat().st_size
        assert _sha(f) == e["sha256"] == sources.MIRROR_FILES[e["file"]]
    assert json.loads((part / "MANIFEST.json").read_text()) == m
    assert m["total_bytes"] == sum(e["bytes"] for e in m["files"])
    assert m["project_bytes"] == {"tracked": 3000 + 11, "untracked": 36}
    assert m["run_parts"]["ood:emnist"]["not_available"].startswith("EMNIST letters")
    assert "fashion-mnist/t10k-images-idx3-ubyte.gz" in m["run_parts"]["ood:fmnist"]["files"]
    assert m["run_parts"]["ood:grcifar10"]["files"] == ["cifar10/cifar10-jpeg.tar.gz"]
    assert m["run_parts"]["ood:uniform"]["files"] == []
    # nothing of it travels with the project
    tracked = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True)
    assert b".devdata" not in tracked.stdout

    # on the device: the part gathers into one folder, checked against the manifest
    stash = tmp_path / "stash"
    assert pack_data.gather(repo / ".devdata" / "mnist", stash, log=lambda s: 0) == 0
    assert {str(p.relative_to(stash)) for p in stash.rglob("*.gz")} == MNIST_RUN
    lines = []
    (stash / "mnist" / "train-labels-idx1-ubyte.gz").unlink()
    assert pack_data.gather(tmp_path / "nothing", stash, log=lines.append) == 3
    assert '[".devdata/mnist/part-1"]' in lines[-1]
    (stash / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"broken")
    assert pack_data.gather(tmp_path / "nothing", stash, log=lines.append) == 4
    assert "t10k-labels" in lines[-1]


@needs_shared
def test_a_pack_over_the_limit_splits_into_parts_or_fails_clearly(pack_data, cache, tmp_path):
    repo = _repo(tmp_path / "repo")
    quiet = dict(source=SHARED, cache=cache, repo=repo, log=lambda s: 0)
    # mnist-offline: the MNIST test set, CIFAR-10 train_10k (out-distribution) and test.npz
    m = pack_data.pack("mnist-offline", repo / ".devdata", 40, **quiet)
    assert m["parts"] == 2 and len(m["carry"]) == 2 and m["total_bytes"] > 40 << 20
    for k in (1, 2):
        part = repo / ".devdata" / "mnist-offline" / f"part-{k}"
        size = sum(f.stat().st_size for f in part.rglob("*.*") if f.name != "MANIFEST.json")
        assert 0 < size + sum(m["project_bytes"].values()) <= 40 << 20
    stash = tmp_path / "stash"
    lines = []
    assert pack_data.gather(repo / ".devdata" / "mnist-offline", stash, log=lines.append) == 0
    with pytest.raises(pack_data.PackError, match="2 device calls .* more than --max-parts 1"):
        pack_data.pack("mnist-offline", repo / ".devdata", 40, max_parts=1, **quiet)
    with pytest.raises(pack_data.PackError, match=r"cifar10/train_10k.npz alone \(27.1 MiB\)"):
        pack_data.pack("mnist-offline", repo / ".devdata", 20, **quiet)
    with pytest.raises(pack_data.PackError, match="the project alone .* leaves nothing"):
        pack_data.pack("mnist-offline", repo / ".devdata", 0.001, **quiet)
    with pytest.raises(pack_data.PackError, match="not ignored by git"):
        pack_data.pack("mnist-offline", repo / "packed", 56, **quiet)
    with pytest.raises(pack_data.PackError, match="above the device's 64 MiB"):
        pack_data.pack("mnist-offline", repo / ".devdata", 100, **quiet)


def test_the_command_line_reports_errors_with_exit_code_2(pack_data, tmp_path, capsys):
    assert pack_data.main(["--dataset", "nope", "--dest", str(tmp_path)]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err
    assert pack_data.main(["--dataset", "mnist", "--limit-mib", "0.001"]) == 2
    assert "leaves nothing of the 0.001 MiB" in capsys.readouterr().err
    assert pack_data.main(["--gather", str(tmp_path / "x"), "--into", str(tmp_path / "y")]) == 3
    assert "no packed data" in capsys.readouterr().out


def test_the_project_is_measured_as_git_ls_files_du(pack_data):
    shell = subprocess.run(
        "git ls-files -z | xargs -0 du -cb", shell=True, cwd=REPO, capture_output=True, text=True
    )
    totals = [int(x.split()[0]) for x in shell.stdout.splitlines() if x.endswith("total")]
    measured = pack_data.project_bytes(REPO)
    assert measured["tracked"] == sum(totals) > 0 and measured["untracked"] >= 0


def test_parts_are_first_fit_decreasing(pack_data):
    sizes = {"a": 50, "b": 30, "c": 20, "d": 15, "e": 5}
    assert pack_data.split_into_parts(sizes, 60) == [["a", "e"], ["b", "c"], ["d"]]
    with pytest.raises(pack_data.PackError, match="a alone"):
        pack_data.split_into_parts(sizes, 40)


# ----------------------------------------------------------------------------- library hooks
@needs_shared
def test_one_idx_split_reads_from_a_mirror_holding_only_its_files(tmp_path):
    mirror = tmp_path / "mirror" / "fashion-mnist"
    mirror.mkdir(parents=True)
    for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        os.symlink(SHARED / "fashion-mnist" / f, mirror / f)
    with sources.mirror_sandbox([mirror.parent]) as found:
        x, y, source = sources.torchvision_dataset("fmnist", "test", root=tmp_path / "only-test")
        with pytest.raises(sources.DataNotFoundError, match="download=False"):
            sources.torchvision_dataset("fmnist", "train", root=tmp_path / "only-test")
    assert set(found) == {f"fashion-mnist/{f}" for f in os.listdir(mirror)}
    assert "(the official t10k files)" in source
    # the same arrays as torchvision's class reads from all four files
    x4, y4, source4 = sources.torchvision_dataset("fmnist", "test", root=tmp_path / "all")
    assert "read by torchvision.datasets.FashionMNIST" in source4
    assert x.dtype == x4.dtype == np.float32 and np.array_equal(x, x4) and np.array_equal(y, y4)


def test_the_sandbox_searches_only_its_folders_and_downloads_nothing(tmp_path):
    assert sources.downloads_allowed()
    with sources.mirror_sandbox([tmp_path / "mirror"]):
        assert sources.mirror_dirs(tmp_path / "root") == [tmp_path / "root", tmp_path / "mirror"]
        assert not sources.downloads_allowed()
        with pytest.raises(sources.DataNotFoundError):
            sources.find_mirror_file("mnist/t10k-images-idx3-ubyte.gz", tmp_path / "root")
        with pytest.raises(sources.DataNotFoundError, match="download=False"):
            sources.torchvision_dataset("svhn", "test", root=tmp_path / "root")
        with pytest.raises(sources.DataNotFoundError, match="downloads are off"):
            download.download("http://127.0.0.1:9/f", tmp_path / "f", "0" * 32)
    assert sources.downloads_allowed()


def test_gather_and_pack_refuse_bad_folders_and_a_corrupt_manifest_in_one_line(
    pack_data, tmp_path, capsys
):
    """A damaged MANIFEST.json gave a traceback; a file given as a folder too."""
    pack_main = pack_data.main

    parts = tmp_path / "parts" / "part-1"
    parts.mkdir(parents=True)
    for text in ("{", "{}", '{"files": [{"file": "x"}], "dataset": "d", "carry": []}'):
        (parts / "MANIFEST.json").write_text(text)
        into = tmp_path / f"into{len(text)}"
        assert pack_main(["--gather", str(parts.parent), "--into", str(into)]) == 4
        assert "MANIFEST.json is corrupt" in capsys.readouterr().out
    afile = tmp_path / "afile"
    afile.write_text("")
    assert pack_main(["--gather", str(parts.parent), "--into", str(afile)]) == 2
    assert pack_main(["--dataset", "digits", "--dest", str(afile)]) == 2
    assert "is a file" in capsys.readouterr().err
