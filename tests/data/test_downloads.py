"""The download paths of the sets no mirror holds here (SVHN, CIFAR-100, EMNIST), each served by a
local HTTP server in its official format, small: torchvision downloads and checks them, the
data layer reads them as the OOD sets do, and a download that fails its md5 is one line with
exit code 4 (it was reported as missing, exit 3)."""

import gzip
import hashlib
import http.server
import io
import pickle
import struct
import tarfile
import threading
import zipfile

import numpy as np
import pytest
import torchvision

from ccu.data import sources

N = 12


class _Files:
    """A local HTTP server for a few files: ``url(name)`` serves ``files[name]``."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.requests = files, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                name = self.path.lstrip("/")
                outer.requests.append(name)
                body = outer.files.get(name)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/{name}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served():
    servers = []

    def serve(files):
        servers.append(_Files(files))
        return servers[-1]

    yield serve
    for s in servers:
        s.close()


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _images(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def test_svhn_downloads_checks_and_reads_its_test_set(served, monkeypatch, tmp_path):
    from scipy.io import savemat

    x = _images((32, 32, 3, N), 0)  # SVHN's .mat layout: H, W, C, N; labels 1..10 (10 is 0)
    y = np.arange(1, N + 1, dtype=np.uint8).reshape(-1, 1) % 10 + 1
    buf = io.BytesIO()
    savemat(buf, {"X": x, "y": y})
    data = buf.getvalue()
    server = served({"test_32x32.mat": data})
    split = {"test": [server.url("test_32x32.mat"), "test_32x32.mat", _md5(data)]}
    monkeypatch.setattr(torchvision.datasets.SVHN, "split_list", split)
    got_x, got_y, source = sources.torchvision_dataset("svhn", "test", root=tmp_path / "a")
    assert got_x.shape == (N, 3, 32, 32) and got_x.dtype == np.float32
    assert np.array_equal(got_x[3], x[..., 3].transpose(2, 0, 1) / np.float32(255))
    assert np.array_equal(got_y, y.ravel() % 10) and "downloaded by torchvision" in source
    # the same again: read from the files now there, nothing downloaded (torchvision asks the
    # server twice a download: for redirects, then the file)
    asked = len(server.requests)
    sources.torchvision_dataset("svhn", "test", root=tmp_path / "a")
    assert asked and len(server.requests) == asked
    # a download whose md5 is wrong: corrupt (exit 4), naming what to delete
    split["test"][2] = "0" * 32
    with pytest.raises(sources.CorruptDataError, match="failed torchvision's md5 check"):
        sources.torchvision_dataset("svhn", "test", root=tmp_path / "b")


def test_cifar100_downloads_checks_and_reads_its_test_set(served, monkeypatch, tmp_path):
    parts = {}
    for split, seed in (("train", 1), ("test", 2)):
        pixels = _images((N, 3072), seed)
        parts[split] = (pixels, list(range(N)))
    members = {
        name: pickle.dumps({"data": px, "fine_labels": labels})
        for name, (px, labels) in parts.items()
    }
    members["meta"] = pickle.dumps({"fine_label_names": [f"class{i}" for i in range(100)]})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, body in members.items():
            info = tarfile.TarInfo(f"cifar-100-python/{name}")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    archive = buf.getvalue()
    server = served({"cifar-100-python.tar.gz": archive})
    cls = torchvision.datasets.CIFAR100
    monkeypatch.setattr(cls, "url", server.url("cifar-100-python.tar.gz"))
    monkeypatch.setattr(cls, "tgz_md5", _md5(archive))
    monkeypatch.setattr(cls, "train_list", [["train", _md5(members["train"])]])
    monkeypatch.setattr(cls, "test_list", [["test", _md5(members["test"])]])
    monkeypatch.setattr(cls, "meta", dict(cls.meta, md5=_md5(members["meta"])))
    x, y, _ = sources.torchvision_dataset("cifar100", "test", root=tmp_path / "a")
    pixels, labels = parts["test"]
    assert x.shape == (N, 3, 32, 32) and np.array_equal(y, labels)
    assert np.array_equal(x.reshape(N, -1), pixels / np.float32(255))
    monkeypatch.setattr(cls, "tgz_md5", "0" * 32)
    with pytest.raises(sources.CorruptDataError, match="failed torchvision's md5 check"):
        sources.torchvision_dataset("cifar100", "test", root=tmp_path / "b")


def _idx(array: np.ndarray) -> bytes:
    """The IDX format of the MNIST family: magic (0, 0, 8 = ubyte, ndim), sizes, bytes."""
    head = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    return head + array.astype(np.uint8).tobytes()


def test_emnist_letters_downloads_checks_and_reads_its_test_set(served, monkeypatch, tmp_path):
    images = _images((N, 28, 28), 3)
    labels = np.arange(N) % 26 + 1  # letters: 1..26
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for kind in ("train", "test"):
            for what, array in (("images-idx3", images), ("labels-idx1", labels)):
                zf.writestr(
                    f"gzip/emnist-letters-{kind}-{what}-ubyte.gz", gzip.compress(_idx(array))
                )
    archive = buf.getvalue()
    server = served({"gzip.zip": archive})
    cls = torchvision.datasets.EMNIST
    monkeypatch.setattr(cls, "url", server.url("gzip.zip"))
    monkeypatch.setattr(cls, "md5", _md5(archive))
    x, y, _ = sources.torchvision_dataset("emnist", "test", root=tmp_path / "a")
    assert x.shape == (N, 1, 28, 28) and set(server.requests) == {"gzip.zip"}
    # EMNIST's images are stored transposed and its letters labelled 1..26: read as MNIST's
    assert np.array_equal(x[:, 0], images.transpose(0, 2, 1) / np.float32(255))
    assert np.array_equal(y, labels - 1)
    monkeypatch.setattr(cls, "md5", "0" * 32)
    with pytest.raises(sources.CorruptDataError, match="failed torchvision's md5 check"):
        sources.torchvision_dataset("emnist", "test", root=tmp_path / "b")
