"""The data layer: offline mirrors, torchvision code path, OOD sets, integrity and errors."""

import gzip
import shutil

import numpy as np
import pytest
import torch

import ccu.data as D
from ccu.data import cifar10, sources

SHARED = sources.REPO_ROOT.parent / "shared" / "data"
needs_mirror = pytest.mark.skipif(
    not (SHARED / "mnist").is_dir(),
    reason=f"offline mirror not found at {SHARED} (CI has it; see data/README.md)",
)


@needs_mirror
@pytest.mark.parametrize(
    "name, n_train, n_test, shape",
    [("mnist-offline", 8000, 2000, (1, 28, 28)), ("cifar10-offline", 10000, 10000, (3, 32, 32))],
)
def test_offline_mirrors_load(name, n_train, n_test, shape):
    a = D.load_dataset(name, seed=0)
    assert a.train_x.shape == (n_train, *shape) and a.test_x.shape == (n_test, *shape)
    assert a.out_x.shape[1:] == shape
    for t in (a.train_x, a.test_x, a.out_x):
        assert float(t.min()) >= 0.0 and float(t.max()) <= 1.0
    counts = torch.bincount(a.train_y, minlength=10)
    assert len(counts) == 10 and int(counts.min()) > 0.08 * n_train  # stratified
    assert D.load_dataset(name, seed=0).checksum() == a.checksum()
    for ood in a.spec.ood_sets:
        x = D.load_ood(ood, a, seed=1, n=300)
        assert x.shape[1:] == shape and x.dtype == torch.float32
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
        assert torch.equal(x, D.load_ood(ood, a, seed=1, n=300))


@needs_mirror
def test_mnist_offline_split_is_seeded_and_disjoint():
    a, b = D.load_dataset("mnist-offline", seed=0), D.load_dataset("mnist-offline", seed=1)
    assert a.checksum() != b.checksum()
    train = {bytes(x.numpy().tobytes()) for x in a.train_x[:500]}
    assert not train & {bytes(x.numpy().tobytes()) for x in a.test_x}


@needs_mirror
def test_torchvision_mnist_reader_offline(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix in ("train", "t10k"):
        for kind, src in (("images-idx3", "t10k-images-idx3"), ("labels-idx1", "t10k-labels-idx1")):
            data = gzip.decompress((SHARED / "mnist" / f"{src}-ubyte.gz").read_bytes())
            (raw / f"{prefix}-{kind}-ubyte").write_bytes(data)
    x, y = sources.torchvision_arrays("mnist", "test", root=tmp_path, download=False)
    images, labels = sources.mnist_test_mirror()
    assert x.shape == (10000, 1, 28, 28)
    np.testing.assert_array_equal(x[:, 0], images.numpy() / np.float32(255.0))
    np.testing.assert_array_equal(y, labels.numpy())


def test_missing_torchvision_data_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "REPO_ROOT", tmp_path / "repo")  # no mirror to unpack
    monkeypatch.delenv("CCU_OFFLINE_DATA", raising=False)
    with pytest.raises(D.DataNotFoundError, match="Expected files") as err:
        sources.torchvision_arrays("fmnist", "train", root=tmp_path, download=False)
    assert str(tmp_path) in str(err.value)


def test_missing_mirror_lists_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.delenv("CCU_OFFLINE_DATA", raising=False)
    with pytest.raises(D.DataNotFoundError, match="Looked in") as err:
        D.load_dataset("mnist-offline", root=tmp_path / "empty")
    assert str(tmp_path / "empty") in str(err.value)


@needs_mirror
def test_corrupt_or_truncated_mirror_is_refused(tmp_path):
    (tmp_path / "cifar10").mkdir()
    src = SHARED / "cifar10" / "test.npz"
    dst = tmp_path / "cifar10" / "test.npz"
    dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(D.CorruptDataError, match="corrupt or truncated"):
        cifar10.mirror_npz("test", root=tmp_path)
    shutil.copy(src, dst)
    assert cifar10.mirror_npz("test", root=tmp_path)[0].shape == (10000, 32, 32, 3)


def test_bad_names_and_roots(tmp_path):
    with pytest.raises(ValueError, match="known datasets"):
        D.load_dataset("svhm")
    with pytest.raises(ValueError, match="unknown OOD set"):
        D.load_ood("lsun", D.load_dataset("moons"))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        sources.data_root(not_a_dir)
    with pytest.raises(D.DataNotFoundError, match="ImageFolder"):
        D.load_ood("lsun_cr", D.load_dataset("digits"), root=tmp_path)


def test_noise_set_properties():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20, 3, 16, 16, generator=gen)
    noise, shuffled, sigmas = D.noise_set(x, seed=3, return_details=True)
    for i in range(len(x)):  # permutation: same pixel histogram as the source image
        torch.testing.assert_close(
            shuffled[i].flatten().sort().values, x[i].flatten().sort().values
        )
        assert float(noise[i].min()) == 0.0 and float(noise[i].max()) == pytest.approx(1.0)
    lo, hi = D.ood_test_sets.NOISE_SIGMA_RANGE
    assert bool(((sigmas >= lo) & (sigmas <= hi)).all())
    assert torch.equal(noise, D.noise_set(x, seed=3))
    assert not torch.equal(noise, D.noise_set(x, seed=4))
    with pytest.raises(ValueError, match="images"):
        D.noise_set(torch.rand(3, 4), seed=0)


def test_uniform_and_grey_resized():
    u = D.uniform_noise(5, (1, 28, 28), seed=2)
    assert torch.equal(u, D.uniform_noise(5, (1, 28, 28), seed=2))
    g = D.grey_resized(torch.rand(4, 3, 32, 32), 28)
    assert g.shape == (4, 1, 28, 28) and float(g.min()) >= 0 and float(g.max()) <= 1


def _is_shift(aug, src, pad):
    """aug equals src shifted by at most ``pad`` pixels (zero fill), or mirrored."""
    for flip in (False, True):
        s = src.flip(-1) if flip else src
        padded = torch.nn.functional.pad(s, (pad, pad, pad, pad))
        h, w = src.shape[-2:]
        for dy in range(2 * pad + 1):
            for dx in range(2 * pad + 1):
                if torch.equal(padded[..., dy : dy + h, dx : dx + w], aug):
                    return True
    return False


def test_augmentation_is_a_padded_crop_and_seeded():
    from ccu.data import get_spec
    from ccu.data.augment import augment, augmented_sample

    mnist = get_spec("mnist-offline").augmentation
    x = torch.rand(6, 1, 28, 28)
    a = augment(x, mnist, seed=0)
    assert torch.equal(a, augment(x, mnist, seed=0))
    assert all(_is_shift(a[i], x[i], 2) for i in range(6))
    assert not torch.equal(a, x)
    s = augmented_sample(x, 15, mnist, seed=1)
    assert s.shape == (15, 1, 28, 28)
    c = torch.rand(3, 3, 32, 32)
    ac = augment(c, get_spec("cifar10-offline").augmentation, seed=0)
    assert ac.shape == c.shape and float(ac.min()) >= 0 and float(ac.max()) <= 1
    pts = torch.rand(4, 2)
    assert get_spec("moons").augmentation is None  # no augmentation for 2-D toy data
    assert torch.equal(augment(pts, None, 0), pts) and torch.equal(augment(pts, mnist, 0), pts)
    with pytest.raises(TypeError, match="get_spec\\('mnist-offline'\\).augmentation"):
        augment(x, "mnist-offline", 0)  # a scheme, not a dataset name


def test_tiny_images_reader_roundtrip(tmp_path):
    from ccu.data import out_distributions

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(50, 32, 32, 3), dtype=np.uint8)
    # the binary stores each (32, 32, 3) image in Fortran order
    (tmp_path / out_distributions.TINY_IMAGES_FILE).write_bytes(
        b"".join(im.flatten(order="F").tobytes() for im in images)
    )
    with pytest.raises(D.CorruptDataError, match="79302017"):
        out_distributions.tiny_images(5, 0, root=tmp_path)
    got = out_distributions.tiny_images(10, 0, root=tmp_path, strict_size=False, exclude=[0, 1, 2])
    assert got.shape == (10, 32, 32, 3)
    matches = [int(np.flatnonzero((images == g).all(axis=(1, 2, 3)))[0]) for g in got]
    assert len(set(matches)) == 10 and min(matches) >= 3  # distinct, exclusions respected
    again = out_distributions.tiny_images(
        10, 0, root=tmp_path, strict_size=False, exclude=[0, 1, 2]
    )
    np.testing.assert_array_equal(got, again)
    with (tmp_path / out_distributions.TINY_IMAGES_FILE).open("ab") as f:
        f.write(b"\x00" * 100)  # truncated / trailing bytes
    with pytest.raises(D.CorruptDataError, match="not a multiple"):
        out_distributions.tiny_images(5, 0, root=tmp_path, strict_size=False)


def test_300k_reader_and_out_choice(tmp_path, monkeypatch):
    import hashlib

    from ccu.data import out_distributions

    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(40, 32, 32, 3), dtype=np.uint8)
    path = tmp_path / out_distributions.RANDOM_300K_FILE
    np.save(path, images)
    monkeypatch.setattr(
        out_distributions, "RANDOM_300K_MD5", hashlib.md5(path.read_bytes()).hexdigest()
    )
    got = out_distributions.random_300k(8, 3, root=tmp_path)
    assert got.shape == (8, 32, 32, 3)
    grey = out_distributions.as_images(got, (1, 28, 28))
    assert grey.shape == (8, 1, 28, 28) and float(grey.max()) <= 1.0
    altered = images.copy()
    altered[0, 0, 0, 0] ^= 1  # the right shape, one pixel off: taken before (no md5 check)
    np.save(path, altered)
    with pytest.raises(D.CorruptDataError, match="truncated or altered"):
        out_distributions.random_300k(8, 3, root=tmp_path)
    np.save(path, images[..., 0])  # a file given by its path is not the checked one: its shape is
    with pytest.raises(D.CorruptDataError, match="expected uint8"):
        out_distributions.random_300k(8, 3, path=path)
    with pytest.raises(D.DataNotFoundError, match="tiny_images.bin"):
        out_distributions.tiny_images(8, 0, root=tmp_path / "nothing")
    moons = D.load_dataset("moons", out="uniform", n_out=100)
    assert moons.out_x.shape == (100, 2) and "uniform" in moons.out_description
    with pytest.raises(ValueError, match="unknown out-distribution"):
        D.load_dataset("moons", out="tiny")
    with pytest.raises(ValueError, match="do not fit"):
        D.load_dataset("digits", out="300k", out_path=tmp_path / out_distributions.RANDOM_300K_FILE)


@needs_mirror
def test_300k_as_out_distribution_for_mnist_offline(tmp_path, monkeypatch):
    import hashlib

    from ccu.data import out_distributions

    images = np.random.default_rng(2).integers(0, 256, size=(64, 32, 32, 3), dtype=np.uint8)
    path = tmp_path / out_distributions.RANDOM_300K_FILE
    np.save(path, images)
    monkeypatch.setattr(
        out_distributions, "RANDOM_300K_MD5", hashlib.md5(path.read_bytes()).hexdigest()
    )
    d = D.load_dataset("mnist-offline", out="300k", n_out=32, root=tmp_path)
    assert d.out_x.shape == (32, 1, 28, 28) and d.info["out"] == "300k"


@needs_mirror
def test_torchvision_emnist_reader_offline(tmp_path):
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    images = gzip.decompress((SHARED / "mnist" / "t10k-images-idx3-ubyte.gz").read_bytes())
    labels = bytearray(
        gzip.decompress((SHARED / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes())
    )
    labels[8:] = bytes(b % 10 + 1 for b in labels[8:])  # letters are labelled 1..26
    for split in ("train", "test"):
        (raw / f"emnist-letters-{split}-images-idx3-ubyte").write_bytes(images)
        (raw / f"emnist-letters-{split}-labels-idx1-ubyte").write_bytes(bytes(labels))
    x, y = sources.torchvision_arrays("emnist", "test", root=tmp_path, download=False)
    mnist, mlabels = sources.mnist_test_mirror()
    assert int(y.min()) == 0  # shifted to start at 0
    np.testing.assert_array_equal(y, mlabels.numpy() % 10)
    # EMNIST files store images transposed; the reader transposes them back
    np.testing.assert_array_equal(x[:, 0], mnist.numpy().transpose(0, 2, 1) / np.float32(255.0))


def test_paired_loader_and_covariance_sample():
    import ccu
    from ccu.data.augment import covariance_sample
    from ccu.data.batches import PairedLoader

    data = D.load_dataset("digits").subset(300)
    loader = PairedLoader(data, batch_size=64, seed=0, augment=True)
    batches = list(loader)
    assert len(batches) == len(loader) == 5
    assert all(x.shape[0] == z.shape[0] == y.shape[0] for x, y, z in batches)
    assert sum(len(y) for _, y, _ in batches) == 300
    state = loader.state_dict()
    first = [x for x, _, _ in loader]
    loader.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(first, [x for x, _, _ in loader], strict=True))
    no_out = PairedLoader(data, batch_size=64, with_out=False)
    assert all(z.shape[0] == 0 for _, _, z in no_out)
    settings = ccu.TrainSettings(augment=True, n_covariance=500)
    assert covariance_sample(data, settings).shape == (500, 1, 8, 8)
    assert covariance_sample(data, ccu.TrainSettings(augment=False)) is data.train_x
    # the profile's cap (n_covariance): the first images of the uncapped sample's draw, not more
    capped = covariance_sample(data, settings, cap=200)
    assert capped.shape == (200, 1, 8, 8)
    assert covariance_sample(data, settings, cap=10_000).shape == (500, 1, 8, 8)
    assert covariance_sample(data, ccu.TrainSettings(augment=True), cap=64).shape[0] == 64


def test_image_folder_ood_sets(tmp_path):
    from PIL import Image

    folder = tmp_path / "LSUN_CR" / "classroom"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    digits = D.load_dataset("digits")
    x = D.load_ood("lsun_cr", digits, root=tmp_path)
    assert x.shape == (3, 1, 8, 8) and float(x.min()) >= 0 and float(x.max()) <= 1


def test_no_noise_a_method_trains_on_is_an_ood_test_image_or_a_balls_centre():
    """The Uniform OOD set draws with its seed plainly (1), the balls' centres with seed + 1000;
    the training out-distributions' noise and ACET2's draw from streams of their own (before
    0.7.0 the digits out-set held all 397 Uniform test images, ACET2's batch 1 the first 128)."""
    from ccu.data.images import uniform_noise
    from ccu.methods import trained

    data = D.load_dataset("digits", seed=0)
    uniform = D.load_ood("uniform", data, seed=1)

    def shared(a, b):
        rows = {tuple(r) for r in a.flatten(1).numpy().round(7).tolist()}
        return sum(tuple(r) in rows for r in b.flatten(1).numpy().round(7).tolist())

    assert shared(data.out_x, uniform) == 0
    centres = uniform_noise(200, data.spec.shape, 1000)
    acet2 = trained._ACETObjective(1.0, 0.3, 0, True, 0, (0.0, 1.0))
    z = torch.zeros(128, *data.spec.shape)
    for _ in range(3):
        noise = acet2.prepare_out(z)
        assert shared(noise, uniform) == shared(noise, centres) == 0
    other = trained._ACETObjective(1.0, 0.3, 0, True, 1, (0.0, 1.0))  # another seed, other noise
    assert not torch.equal(other.prepare_out(z), trained._ACETObjective(
        1.0, 0.3, 0, True, 0, (0.0, 1.0)).prepare_out(z))  # fmt: skip


def test_an_ood_set_is_a_seeded_draw_from_a_file_stored_class_by_class(monkeypatch):
    """CIFAR-10's test files hold their images class by class: their first 2,000 were airplanes
    and automobiles only (the GrCIFAR10 column of a 2,000-image test set)."""
    from types import SimpleNamespace

    from ccu.data import ood_test_sets

    labels = torch.arange(10).repeat_interleave(100)  # 1,000 images, class by class
    x = labels[:, None, None, None].float().expand(-1, 3, 32, 32) / 9
    monkeypatch.setattr(
        ood_test_sets, "_cifar10_test", lambda root: SimpleNamespace(x=x, source="s")
    )
    data = SimpleNamespace(
        test_x=torch.zeros(200, 3, 32, 32), spec=SimpleNamespace(shape=(3, 32, 32))
    )
    got = D.load_ood("cifar10", data, seed=1)
    classes = set((got[:, 0, 0, 0] * 9).round().long().tolist())
    assert len(got) == 200 and len(classes) == 10
    assert torch.equal(got, D.load_ood("cifar10", data, seed=1))  # the same draw again
    assert not torch.equal(got, D.load_ood("cifar10", data, seed=2))
    grey = D.load_ood("grcifar10", SimpleNamespace(
        test_x=torch.zeros(200, 1, 28, 28), spec=SimpleNamespace(shape=(1, 28, 28))), seed=1)  # fmt: skip
    assert len(set((grey[:, 0, 0, 0] * 9).round().long().tolist())) == 10


def test_an_image_folder_without_images_or_with_a_broken_one_is_one_line(tmp_path):
    from PIL import Image

    from ccu.data import ood_test_sets

    folder = tmp_path / "LSUN_CR"
    folder.mkdir()
    with pytest.raises(sources.DataNotFoundError, match="holds no images"):
        ood_test_sets.image_folder("lsun_cr", (3, 32, 32), tmp_path)
    (folder / "classroom").mkdir()
    Image.new("RGB", (40, 40), (10, 20, 30)).save(folder / "classroom" / "a.jpg")
    assert ood_test_sets.image_folder("lsun_cr", (3, 32, 32), tmp_path).shape == (1, 3, 32, 32)
    whole = (folder / "classroom" / "a.jpg").read_bytes()
    (folder / "classroom" / "b.jpg").write_bytes(whole[: len(whole) // 2])  # truncated
    with pytest.raises(sources.CorruptDataError, match="cannot be read"):
        ood_test_sets.image_folder("lsun_cr", (3, 32, 32), tmp_path)
