"""The full-size datasets from the offline mirrors, their archives, cache, OOD sets and the
300K download (served by the test itself: no network)."""

import gzip
import hashlib
import http.server
import io
import tarfile
import threading
import warnings

import numpy as np
import pytest
import torch

import ccu
import ccu.data as D
from ccu import report
from ccu.data import archives, cifar10, download, out_distributions, sources

SHARED = sources.REPO_ROOT.parent / "shared" / "data"
needs = {
    name: pytest.mark.skipif(
        not (SHARED / rel).is_file(),
        reason=f"offline mirror {rel} not found in {SHARED} (CI has it; see data/README.md)",
    )
    for name, rel in {
        "mnist": "mnist/train-images-idx3-ubyte.gz",
        "fmnist": "fashion-mnist/train-images-idx3-ubyte.gz",
        "cifar": archives.CIFAR10_JPEG_FILE,
        "tiny": archives.TINY_IMAGENET_FILES["train150"],
    }.items()
}


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    """One data root for the session: mirrors are unpacked and decoded once."""
    return tmp_path_factory.mktemp("data-root")


def _no_mirrors(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.delenv("CCU_OFFLINE_DATA", raising=False)


def _in_range(*tensors):
    return all(float(t.min()) >= 0.0 and float(t.max()) <= 1.0 for t in tensors)


# ----------------------------------------------------------------------------- MNIST, FMNIST
@needs["mnist"]
@needs["fmnist"]
@needs["cifar"]
@pytest.mark.parametrize("name, other", [("mnist", "fmnist"), ("fmnist", "mnist")])
def test_mnist_and_fmnist_full_size_through_torchvision(root, name, other):
    d = D.load_dataset(name, seed=0, root=root)
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert d.out_x.shape == (50000, 1, 28, 28) and _in_range(d.train_x, d.test_x, d.out_x)
    for y, n in ((d.train_y, 60000), (d.test_y, 10000)):
        counts = torch.bincount(y, minlength=10)
        assert len(counts) == 10 and int(counts.min()) > 0.08 * n and int(counts.max()) < 0.12 * n
    # torchvision's own reader read the official files, unpacked byte for byte from the mirror
    folder, mirror = sources.IDX_MIRRORS[name]
    for f in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        staged = (root / folder / "raw" / f).read_bytes()
        assert staged == gzip.decompress((SHARED / mirror / f"{f}.gz").read_bytes())
    assert "offline mirror" in d.info["source"] and f"datasets.{folder}" in d.info["source"]
    assert "CIFAR-10 training images" in d.out_description and d.info["n_out"] == 50000
    assert "JPEG copy" in d.info["out_source"]
    x, src = D.load_ood(other, d, seed=1, n=500, root=root, with_source=True)
    assert x.shape == (500, 1, 28, 28) and "offline mirror" in src["source"]
    assert set(d.spec.ood_sets) == {other, "emnist", "grcifar10", "noise", "uniform"}
    # the training out-distribution (CIFAR-10 train) shares no image with GrCIFAR10 (test)
    gr = D.load_ood("grcifar10", d, seed=1, root=root)
    assert gr.shape == (10000, 1, 28, 28)
    assert not {r.numpy().tobytes() for r in gr} & {r.numpy().tobytes() for r in d.out_x}


@needs["mnist"]
def test_mnist_labels_match_the_test_mirror(root):
    x, y, _ = sources.torchvision_dataset("mnist", "test", root=root, download=False)
    images, labels = sources.mnist_test_mirror()
    np.testing.assert_array_equal(x[:, 0], images.numpy() / np.float32(255.0))
    np.testing.assert_array_equal(y, labels.numpy())


@needs["mnist"]
def test_truncated_or_altered_idx_files_are_refused(tmp_path):
    good = (SHARED / "mnist" / "train-labels-idx1-ubyte.gz").read_bytes()
    (tmp_path / "mnist").mkdir()
    bad = tmp_path / "mnist" / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(good[: len(good) // 2])  # the data root's copy is found before the mirror
    with pytest.raises(D.CorruptDataError, match="corrupt or truncated"):
        sources.torchvision_dataset("mnist", "train", root=tmp_path, download=False)
    altered = bytearray(good)
    altered[100] ^= 0xFF
    bad.write_bytes(bytes(altered))
    with pytest.raises(D.CorruptDataError, match="train-labels-idx1-ubyte.gz"):
        sources.torchvision_dataset("mnist", "train", root=tmp_path, download=False)
    # a truncated file already in torchvision's layout is caught by torchvision's parser
    raw = tmp_path / "MNIST" / "raw"
    bad.unlink()
    sources.stage_idx_mirror("mnist", tmp_path)
    labels = raw / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:30000])
    with pytest.raises(D.CorruptDataError, match="truncated or corrupt"):
        sources.torchvision_dataset("mnist", "train", root=tmp_path, download=False)


def test_missing_full_size_data_lists_where_it_looked(tmp_path, monkeypatch):
    _no_mirrors(monkeypatch, tmp_path)
    with pytest.raises(D.DataNotFoundError, match="Looked in") as err:
        D.load_dataset("cifar10-jpeg", root=tmp_path / "empty")
    assert str(tmp_path / "empty" / archives.CIFAR10_JPEG_FILE) in str(err.value)
    with pytest.raises(D.DataNotFoundError, match="MNIST/raw"):
        sources.torchvision_dataset("mnist", "train", root=tmp_path / "empty", download=False)
    with pytest.raises(D.DataNotFoundError, match="cifar-10-batches-py") as err:
        out_distributions.grey_natural_out((1, 28, 28), root=tmp_path / "empty")
    assert "tiny-imagenet" in str(err.value) and "out='uniform'" in str(err.value)
    digits = D.load_dataset("digits")
    with pytest.raises(D.DataNotFoundError, match="Imagenet-") as err:
        D.load_ood("imagenet-", digits, root=tmp_path / "empty")
    assert "tiny-imagenet-200_test_unlabeled" in str(err.value)


# ----------------------------------------------------------------------------- CIFAR-10 (JPEG)
@needs["cifar"]
@needs["tiny"]
def test_cifar10_jpeg_full_size_with_tiny_imagenet(root):
    d = D.load_dataset("cifar10-jpeg", seed=0, root=root)
    assert d.train_x.shape == (50000, 3, 32, 32) and d.test_x.shape == (10000, 3, 32, 32)
    assert torch.equal(torch.bincount(d.train_y), torch.full((10,), 5000))
    assert torch.equal(torch.bincount(d.test_y), torch.full((10,), 1000))
    assert torch.bincount(d.train_y[:1000], minlength=10).min() > 60  # shuffled: subsets stratify
    assert _in_range(d.train_x, d.test_x, d.out_x)
    assert 39_000 < len(d.out_x) <= 40_000 and d.out_x.shape[1:] == (3, 32, 32)
    assert "Tiny ImageNet" in d.out_description and d.info["n_out"] == len(d.out_x)
    assert "JPEG" in d.spec.description and "JPEG" in d.info["source"]
    assert d.spec.paper_name == "CIFAR10" and ccu.train_settings("cifar10-jpeg").lr == 0.1
    x, src = D.load_ood("imagenet-", d, seed=1, root=root, with_source=True)
    assert x.shape == (10000, 3, 32, 32) and _in_range(x)
    assert "Tiny ImageNet" in src["label"] and "standing in" in src["source"]
    # the out-distribution (Tiny ImageNet train + val) shares no image with Imagenet- (test)
    assert not {r.numpy().tobytes() for r in x} & {r.numpy().tobytes() for r in d.out_x}
    # grey for 28x28 tasks; n_out is a seeded sample
    grey = D.load_dataset("mnist", root=root, out="tiny-imagenet", n_out=300)
    assert grey.out_x.shape == (300, 1, 28, 28) and "300 of" in grey.out_description


@needs["cifar"]
def test_cifar10_jpeg_decoding_matches_the_npz_mirrors():
    """The first images of each class decoded from the tar are the mirror's train_10k images
    (both decoded from the same JPEG files), in the same order."""
    a = archives.decode_cifar10_jpeg_tar(SHARED / archives.CIFAR10_JPEG_FILE, per_class=5)
    assert a["train_x"].shape == (50, 3, 32, 32) and a["test_x"].shape == (50, 3, 32, 32)
    x10, y10 = cifar10.mirror_npz("train_10k")
    idx = np.concatenate([np.flatnonzero(y10 == c)[:5] for c in range(10)])
    np.testing.assert_array_equal(a["train_y"], y10[idx])
    diff = np.abs(a["train_x"].astype(int) - x10[idx].transpose(0, 3, 1, 2).astype(int))
    assert diff.max() <= 1  # JPEG decoders may differ by one grey level


@needs["cifar"]
def test_truncated_or_altered_cifar_tar_is_refused(tmp_path):
    good = (SHARED / archives.CIFAR10_JPEG_FILE).read_bytes()
    dst = tmp_path / archives.CIFAR10_JPEG_FILE
    dst.parent.mkdir()
    dst.write_bytes(good[: len(good) // 3])
    with pytest.raises(D.CorruptDataError, match="corrupt or truncated"):
        archives.cifar10_jpeg(root=tmp_path)
    altered = bytearray(good)
    altered[len(good) // 2] ^= 0x01
    dst.write_bytes(bytes(altered))
    with pytest.raises(D.CorruptDataError, match="cifar10-jpeg.tar.gz"):
        D.load_dataset("cifar10-jpeg", root=tmp_path)
    assert not (tmp_path / archives.CACHE_FOLDER).exists() or not list(
        (tmp_path / archives.CACHE_FOLDER).glob("*.npz")
    )


def _jpeg(rng, size=32):
    from torchvision.io import encode_jpeg

    img = torch.from_numpy(rng.integers(0, 256, (3, size, size), dtype=np.uint8))
    return encode_jpeg(img, quality=90).numpy().tobytes()


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tf:
        for name, blob in members:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))


def test_jpeg_tar_decoder_order_and_corruption(tmp_path):
    rng = np.random.default_rng(0)
    members = [
        (f"{split}/{cls}/{k:04d}.jpg", _jpeg(rng))
        for split in ("test", "train")
        for cls in ("truck", "airplane", "cat")
        for k in (1, 0)
    ]
    path = tmp_path / "small.tar.gz"
    _tar(path, members)
    a = archives.decode_cifar10_jpeg_tar(path)
    assert a["train_x"].shape == (6, 3, 32, 32) and a["train_x"].dtype == np.uint8
    np.testing.assert_array_equal(a["train_y"], [0, 0, 3, 3, 9, 9])  # by class, then index
    from torchvision.io import decode_jpeg

    first = decode_jpeg(
        torch.frombuffer(bytearray(dict(members)["train/airplane/0000.jpg"]), dtype=torch.uint8)
    )
    np.testing.assert_array_equal(a["train_x"][0], first.numpy())
    path.write_bytes(path.read_bytes()[:-200])  # truncated gzip stream
    with pytest.raises(D.CorruptDataError, match="not a readable tar"):
        archives.decode_cifar10_jpeg_tar(path)
    broken = list(members)
    broken[0] = (broken[0][0], broken[0][1][:40] + b"\x00" * 40)
    _tar(path, broken)
    with pytest.raises(D.CorruptDataError, match="could not be decoded"):
        archives.decode_cifar10_jpeg_tar(path)
    _tar(path, [*members, ("train/unicorn/0000.jpg", _jpeg(rng))])
    with pytest.raises(D.CorruptDataError, match="unicorn"):
        archives.decode_cifar10_jpeg_tar(path)
    _tar(path, [("tiny-imagenet-200/val/images/val_3.JPEG", _jpeg(rng, 64))])
    tiny = archives.decode_tiny_imagenet_tar(path, "val", size=32)["x"]
    assert tiny.shape == (1, 3, 32, 32)


def test_decoded_arrays_are_cached_once_and_rebuilt_when_broken(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return {"x": np.arange(12, dtype=np.uint8).reshape(3, 4)}

    path = tmp_path / "cache" / "thing.npz"
    a = archives.cached_arrays(path, build)
    b = archives.cached_arrays(path, build)
    assert len(calls) == 1 and np.array_equal(a["x"], b["x"])
    path.write_bytes(path.read_bytes()[:50])
    with pytest.warns(UserWarning, match="rebuilding"):
        c = archives.cached_arrays(path, build)
    assert len(calls) == 2 and np.array_equal(c["x"], a["x"])

    def check(arrays):
        if arrays["x"].shape != (3, 4):
            raise D.CorruptDataError("wrong shape")

    np.savez(path, x=np.zeros((2, 2), dtype=np.uint8))  # a stale cache of another shape
    with pytest.warns(UserWarning, match="rebuilding"):
        archives.cached_arrays(path, build, check)
    assert len(calls) == 3


# ----------------------------------------------------------------------------- 300K download
class _Server:
    """A local HTTP server for one file, with Range support that can be switched off."""

    def __init__(self, payload: bytes, ranges: bool = True):
        self.payload, self.ranges, self.requests = payload, ranges, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                outer.requests.append(self.headers.get("Range"))
                start = 0
                rng = self.headers.get("Range")
                if rng and outer.ranges:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(outer.payload):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                else:
                    self.send_response(200)
                body = outer.payload[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/300K_random_images.npy"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _npy_bytes(n=24):
    images = np.random.default_rng(5).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    np.save(buf, images)
    return images, buf.getvalue()


@needs["mnist"]
def test_300k_download_verifies_resumes_and_feeds_load_dataset(tmp_path, monkeypatch):
    images, payload = _npy_bytes()
    md5 = hashlib.md5(payload).hexdigest()
    server = _Server(payload)
    try:
        monkeypatch.setattr(out_distributions, "RANDOM_300K_URL", server.url)
        monkeypatch.setattr(out_distributions, "RANDOM_300K_MD5", md5)
        # an interrupted earlier attempt left the first 1,000 bytes: only the rest is fetched
        part = tmp_path / (out_distributions.RANDOM_300K_FILE + ".partial")
        part.write_bytes(payload[:1000])
        d = D.load_dataset("mnist-offline", out="300k", n_out=10, root=tmp_path)
        assert server.requests == ["bytes=1000-"] and not part.exists()
        assert (tmp_path / out_distributions.RANDOM_300K_FILE).read_bytes() == payload
        assert d.out_x.shape == (10, 1, 28, 28) and "300K random images" in d.out_description
        assert d.info["out"] == "300k" and d.info["n_out"] == 10
        got = out_distributions.random_300k(10, 0, root=tmp_path)
        again = out_distributions.random_300k(10, 0, root=tmp_path)  # no second download
        assert len(server.requests) == 1 and np.array_equal(got, again)
        assert all((images == g).all(axis=(1, 2, 3)).any() for g in got)
    finally:
        server.close()


def test_300k_download_errors_and_a_server_without_ranges(tmp_path):
    _, payload = _npy_bytes()
    md5 = hashlib.md5(payload).hexdigest()
    server = _Server(payload, ranges=False)
    try:
        dest = tmp_path / "a" / out_distributions.RANDOM_300K_FILE
        part = dest.with_name(dest.name + ".partial")
        dest.parent.mkdir()
        part.write_bytes(b"garbage that must not survive")
        assert download.download(server.url, dest, md5) == dest  # 200, not 206: starts over
        assert dest.read_bytes() == payload
        other = tmp_path / "b" / out_distributions.RANDOM_300K_FILE
        with pytest.raises(D.CorruptDataError, match="md5"):
            download.download(server.url, other, "0" * 32)
        assert not other.exists() and not other.with_name(other.name + ".partial").exists()
        dest.write_bytes(payload[:-10])  # a truncated file in place is refused, not reused
        with pytest.raises(D.CorruptDataError, match="truncated or altered"):
            download.download(server.url, dest, md5)
    finally:
        server.close()
    with pytest.raises(D.DataNotFoundError, match="could not be downloaded"):
        download.download(server.url, tmp_path / "c" / "x.npy", md5, timeout=5)


# ----------------------------------------------------------------------------- one record
def test_every_record_is_complete_and_read_everywhere():
    from ccu.data.augment import Augmentation

    D.check_registry()
    for name, spec in D.REGISTRY.items():
        assert ccu.train_settings(name) is spec.settings
        assert set(spec.ood_sets) <= set(D.OOD_SETS)
        assert spec.augmentation is None or isinstance(spec.augmentation, Augmentation)
        if spec.paper_name:
            assert report.PAPER_DATASET[name] == spec.paper_name
    for name, ood in D.OOD_SETS.items():
        assert report.PAPER_OOD[name] == ood.paper_name
    assert set(report.paper_table("table2_ood_auc").ood_dataset) <= set(report.PAPER_OOD.values())
    with pytest.raises(ValueError, match="known datasets"):
        ccu.train_settings("mnistt")
    broken = dict(D.REGISTRY)
    broken["mnist"] = D.DatasetSpec(**{**vars(D.REGISTRY["mnist"]), "ood_sets": ("emnistt",)})
    with pytest.raises(ValueError, match="unknown OOD sets"):
        D.check_registry(broken)


def test_ood_table_labels_stand_ins_and_missing_columns():
    metrics = {
        "CCU": {
            "ood": {
                "imagenet-": {"auroc": 0.9},
                "svhn": {"skipped": "SVHN (test) is not in data"},
                "uniform": {"auroc": 1.0},
            },
            "ood_sources": {"imagenet-": {"label": "Imagenet- (Tiny ImageNet test)"}},
        }
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = report.ood_table(metrics, "cifar10-jpeg")
    rows = set(t.index)
    assert rows == {"Imagenet- (Tiny ImageNet test)", "SVHN (not available)", "Uniform"}
    assert np.isnan(t.loc["SVHN (not available)", ("CCU", "ours")])
    assert t.loc["SVHN (not available)", ("CCU", "paper")] > 90  # the paper's value is shown
    assert t.loc["Imagenet- (Tiny ImageNet test)", ("CCU", "ours")] == 90.0


def test_a_download_waits_for_another_of_the_same_file_and_a_cut_transfer_is_one_line(tmp_path):
    """Two processes downloading one file: the second found the first's ``.partial`` renamed
    under it (a traceback); now it waits for the first (a file lock) and checks its file. A
    transfer cut before its Content-Length escaped as ``IncompleteRead``."""
    import threading

    from filelock import FileLock

    _, payload = _npy_bytes()
    md5 = hashlib.md5(payload).hexdigest()
    server = _Server(payload)
    try:
        dest = tmp_path / "a" / out_distributions.RANDOM_300K_FILE
        dest.parent.mkdir()
        got = []
        with FileLock(str(dest) + ".lock"):  # another process is downloading it
            other = threading.Thread(
                target=lambda: got.append(download.download(server.url, dest, md5))
            )
            other.start()
            dest.write_bytes(payload)  # ... and finishes
        other.join()
        assert got == [dest] and server.requests == []  # it took the other's file
    finally:
        server.close()

    class Cut(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[:100])  # and the connection closes

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Cut)
    threading.Thread(target=httpd.handle_request, daemon=True).start()
    dest = tmp_path / "b" / out_distributions.RANDOM_300K_FILE
    try:
        with pytest.raises(D.DataNotFoundError, match="resumes from it"):
            download.download(f"http://127.0.0.1:{httpd.server_port}/x.npy", dest, md5)
    finally:
        httpd.server_close()
    assert dest.with_name(dest.name + ".partial").read_bytes() == payload[:100]
