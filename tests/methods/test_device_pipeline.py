"""The device-resident training pipeline: batched augmentation, the loader's epoch plan, the
trainer's on-device accumulation (no read-back within an epoch), bf16 for the classifier only,
channels_last (exact resume with augmentation: tests/methods/test_data_and_training.py)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import built_method

import ccu
from ccu.data import load_dataset
from ccu.data.augment import (
    CIFAR_LIKE,
    DIGITS_8X8,
    MNIST_LIKE,
    SVHN_LIKE,
    Augmentation,
    crop_flip,
    crop_flip_params,
)
from ccu.data.batches import PairedLoader


@pytest.mark.parametrize("scheme", [MNIST_LIKE, SVHN_LIKE, CIFAR_LIKE, DIGITS_8X8])
def test_crop_flip_equals_torchvision_per_image(scheme):
    # imported here: 2 s of each pytest worker's collection otherwise
    from torchvision.transforms.v2 import functional as TF

    gen = torch.Generator().manual_seed(1)
    x = torch.rand(40, 3, 12, 12, generator=gen)
    offsets, _ = crop_flip_params(40, scheme, gen)
    flips = torch.rand(40, generator=gen) < 0.5  # flips on every scheme: the index arithmetic
    out = crop_flip(x, scheme, offsets, flips)
    for i in range(40):
        ref = TF.pad(x[i], [scheme.padding] * 4, padding_mode=scheme.padding_mode)
        ref = TF.crop(ref, int(offsets[i, 0]), int(offsets[i, 1]), 12, 12)
        if flips[i]:
            ref = TF.horizontal_flip(ref)
        assert torch.equal(out[i], ref), i
    assert int(offsets.min()) >= 0 and int(offsets.max()) <= 2 * scheme.padding
    assert int(offsets.max()) == 2 * scheme.padding  # the whole range is drawn


def test_crop_flip_params_are_seeded_and_flip_only_where_the_scheme_does():
    a = crop_flip_params(500, CIFAR_LIKE, torch.Generator().manual_seed(3))
    b = crop_flip_params(500, CIFAR_LIKE, torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert 150 < int(a[1].sum()) < 350  # about half flipped
    assert not bool(crop_flip_params(500, MNIST_LIKE, torch.Generator())[1].any())
    with pytest.raises(ValueError, match="padding_mode 'symmetric' is not supported"):
        Augmentation(padding=2, padding_mode="symmetric")


def _digits(n=300):
    return load_dataset("digits").subset(n)


def test_loader_plan_covers_every_point_and_is_reproducible():
    data = _digits()
    loader = PairedLoader(data, batch_size=64, seed=5, augment=True)
    plan = loader.plan()
    assert sorted(plan.idx_in.tolist()) == list(range(300))
    n_out = len(data.out_x)
    assert len(plan.idx_out) == 300 and len(set(plan.idx_out[: min(n_out, 300)].tolist())) == min(
        n_out, 300
    )
    state = loader.state_dict()
    first = [(x.clone(), y.clone(), z.clone()) for x, y, z in loader]
    loader.load_state_dict(state)
    again = list(loader)
    for (a, b, c), (d, e, f) in zip(first, again, strict=True):
        assert torch.equal(a, d) and torch.equal(b, e) and torch.equal(c, f)
    # the batches are the training images at the plan's indices, cropped by the plan's offsets
    loader.load_state_dict(state)
    plan = loader.plan()
    expected = crop_flip(
        data.train_x[plan.idx_in[:64]], DIGITS_8X8, plan.offsets[:64], plan.flips[:64]
    )
    assert torch.equal(first[0][0], expected)
    assert torch.equal(first[0][1], data.train_y[plan.idx_in[:64]])


def test_loader_channels_last_and_errors():
    data = load_dataset("digits").subset(100)
    x, _, z = next(iter(PairedLoader(data, 32, channels_last=True)))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert z.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        PairedLoader(data, 0)
    moons = load_dataset("moons")
    assert next(iter(PairedLoader(moons, 10, augment=True)))[0].shape == (10, 2)  # not images


class _ReadCounter:
    """Counts reads of tensor values back to the host made by ``ccu`` code."""

    NAMES = ("item", "tolist", "__float__", "__int__", "__bool__")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        root = str(Path(ccu.__file__).parent)
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def wrapper(t, *args, _original=original, _name=name):
                caller = sys._getframe(1).f_code
                if caller.co_filename.startswith(root):
                    self.calls.append(f"{_name} in {caller.co_name}")
                return _original(t, *args)

            monkeypatch.setattr(torch.Tensor, name, wrapper)


@pytest.mark.parametrize("kind", ["base", "ccu"])
def test_an_epoch_reads_from_the_device_once(kind, monkeypatch):
    data = _digits()
    settings = replace(ccu.train_settings("digits"), augment=True)
    torch.manual_seed(0)
    clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=16)
    model = clf if kind == "base" else ccu.init_ccu(clf, data.train_x, data.out_x, 10, 3)
    trainer = ccu.Trainer(2, settings, progress=False)
    counter = _ReadCounter(monkeypatch)
    epoch = ccu.Trainer._epoch
    reads_per_epoch = []

    def counted(self, *args):
        before = len(counter.calls)
        out = epoch(self, *args)
        reads_per_epoch.append(counter.calls[before:])
        return out

    monkeypatch.setattr(ccu.Trainer, "_epoch", counted)
    hist = trainer.fit(model, data)
    expected = ["tolist in _epoch"] * (2 if kind == "ccu" else 1)  # sums (and the gaps)
    assert reads_per_epoch == [expected, expected]
    assert len(hist.loss) == 2
    if kind == "ccu":
        steps = -(-300 // settings.batch_size)
        assert len(hist.constraint_gap) == 2 * steps and min(hist.constraint_gap) > 0


def test_epoch_means_are_those_of_the_steps():
    """With learning rate 0 the model is fixed: the epoch's loss and accuracy are the means over
    the loader's batches, recomputed by hand."""
    data = _digits()
    settings = replace(ccu.train_settings("digits"), lr=0.0, gmm_lr=0.0, weight_decay=0.0)
    torch.manual_seed(0)
    clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=16)
    model = ccu.init_ccu(clf, data.train_x, data.out_x, 10, 3)
    hist = ccu.Trainer(1, settings, seed=7, progress=False).fit(model, data)
    loader = PairedLoader(data, settings.batch_size, 7, settings.augment, True)
    loss = correct = 0.0
    with torch.no_grad():
        for x, y, z in loader:
            loss += float(ccu.ccu_loss(model, x, y, z).loss) * len(x)
            correct += float((model.logits(x).argmax(1) == y).sum())
    assert hist.loss[0] == pytest.approx(loss / 300, rel=1e-5)
    assert hist.accuracy[0] == pytest.approx(correct / 300, abs=1e-12)


def test_bf16_runs_the_classifier_only(monkeypatch):
    data = _digits(200)
    torch.manual_seed(0)
    clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=16)
    model = ccu.init_ccu(clf, data.train_x, data.out_x, 10, 3)
    seen = {"logits": set(), "whitened": set(), "autocast_in_density": set()}
    clf.register_forward_hook(lambda m, i, out: seen["logits"].add(out.dtype))
    original = type(model.density_in).log_prob_whitened

    def spy(self, w):
        seen["whitened"].add(w.dtype)
        seen["autocast_in_density"].add(torch.is_autocast_enabled("cpu"))
        return original(self, w)

    monkeypatch.setattr(type(model.density_in), "log_prob_whitened", spy)
    hist = ccu.Trainer(2, ccu.train_settings("digits"), precision="bf16", progress=False).fit(
        model, data
    )
    assert seen["logits"] == {torch.bfloat16}
    assert seen["whitened"] == {torch.float32} and seen["autocast_in_density"] == {False}
    assert model.classifier_autocast is None  # evaluation and certificates run in float32
    assert model(data.test_x[:5]).dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(torch.tensor(hist.loss)))
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        ccu.Trainer(1, precision="fp8")


def test_bf16_and_channels_last_for_a_plain_classifier():
    data = _digits(200)
    torch.manual_seed(0)
    clf = ccu.make_classifier("lenet", data.spec.shape, 10)
    dtypes = set()
    clf.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    trainer = ccu.Trainer(1, ccu.train_settings("digits"), precision="bf16", channels_last=True)
    trainer.progress = False
    trainer.fit(clf, data)
    assert dtypes == {torch.bfloat16}
    conv = next(p for p in clf.parameters() if p.ndim == 4)
    assert conv.is_contiguous()  # back to the default format after training


def test_bad_training_data_is_refused_once_up_front():
    data = _digits(100)
    bad = replace(data, train_x=data.train_x.clone())
    bad.train_x[3, 0, 0, 0] = float("nan")
    clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=8)
    with pytest.raises(ValueError, match="digits training inputs contains 1 NaN"):
        ccu.Trainer(1, progress=False).fit(clf, bad)
    labels = replace(data, train_y=data.train_y.clone())
    labels.train_y[0] = 10
    with pytest.raises(ValueError, match=r"training labels must lie in \[0, 9\]"):
        ccu.Trainer(1, progress=False).fit(clf, labels)


def test_compile_trains_like_eager_and_is_undone():
    """``torch.compile`` of the classifier (inductor on the CPU needs a C++ compiler, as in CI):
    the same losses as eager, the same state-dict keys, and an eager module afterwards."""
    data = _digits(200)
    settings = ccu.train_settings("digits")
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=16)
        trainer = ccu.Trainer(2, settings, compile=compiled, progress=False)
        runs[compiled] = (trainer.fit(clf, data).loss, clf)
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-4)
    assert list(runs[True][1].state_dict()) == list(runs[False][1].state_dict())
    assert runs[True][1]._compiled_call_impl is None


def test_run_method_records_the_precision_and_does_not_mix_them(tmp_path):
    from ccu.run.experiment import run_method
    from ccu.store.results import ResultConflictError

    prof = ccu.get_profile("smoke", epochs=1, n_train=200)
    bf16 = run_method("digits", "Base", prof, root=tmp_path, precision="bf16")
    assert bf16.config["precision"] == "bf16" and not bf16.loaded
    assert bf16.config["trainer_options"] == {
        "precision": "bf16",
        "channels_last": False,
        "compile": False,
    }
    again = run_method("digits", "Base", prof, root=tmp_path, precision="bf16")
    assert again.loaded
    # a bf16 run is neither reused for float32 nor replaced by it: refused, the bf16 run kept
    with pytest.raises(ResultConflictError, match="precision: 'bf16' here, 'float32' asked"):
        run_method("digits", "Base", prof, root=tmp_path)
    fp32 = run_method("digits", "Base", prof, root=tmp_path / "fp32")
    assert not fp32.loaded and fp32.config["precision"] == "float32"
    assert run_method("digits", "Base", prof, root=tmp_path, precision="bf16").loaded
    from ccu.methods import get_method

    spec, settings = load_dataset("digits").spec, ccu.train_settings("digits")
    assert get_method("GAN")(spec, settings, prof, precision="bf16").trainer_options == {
        "precision": "float32",
        "channels_last": False,
        "compile": False,
    }  # GAN has its own epoch step
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        get_method("Base")(spec, settings, prof, precision="half")


@pytest.mark.parametrize("killed_after", [1, 2])
def test_gan_resumes_exactly_from_its_epoch_checkpoint(tmp_path, killed_after):
    """GAN shares the trainer's epoch loop (ccu.methods.training.run_epochs): it checkpoints every epoch,
    calls ``on_epoch_end`` after the checkpoint, and killed there (what `ccu run --stop-after`
    does) and run again, it ends with the weights of an uninterrupted run."""
    data = _digits(200)
    prof = ccu.get_profile("smoke", epochs=3, n_train=200)

    def fresh():
        return built_method("GAN", data, prof)

    full = fresh()
    full.fit(data)
    ckpt = tmp_path / "checkpoint.pt"
    calls = []

    def die_after_epoch(done, epochs):
        calls.append((done, epochs, torch.load(ckpt, weights_only=True)["epoch"]))
        if done == killed_after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fresh().fit(data, checkpoint=ckpt, on_epoch_end=die_after_epoch)
    assert calls == [(k, 3, k) for k in range(1, killed_after + 1)]  # after each checkpoint
    state = torch.load(ckpt, weights_only=True)
    assert state["epoch"] == killed_after
    assert set(state["optimizers"]) == {"classifier", "generator", "discriminator"}
    assert "noise" in state
    resumed = fresh()
    calls.clear()
    hist = resumed.fit(data, checkpoint=ckpt, on_epoch_end=die_after_epoch)
    assert len(hist.loss) == 3 and [c[0] for c in calls] == list(range(killed_after + 1, 4))
    for a, b in zip(
        full.model.state_dict().values(), resumed.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_recorded_gpu_name_is_the_named_devices(monkeypatch):
    """``trained.json`` and ``table1.json`` name the GPU the run used: ``cuda:1``'s, not the
    current device's."""
    from ccu.run.steps import device_name

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: asked.append(d) or "GPU")
    assert device_name("cpu") == "cpu" and asked == []
    assert device_name("cuda:1") == "GPU" and asked[-1] == torch.device("cuda:1")
    assert device_name("cuda") == "GPU" and asked[-1] == torch.device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a lent one)")
@pytest.mark.parametrize("method", ["Base", "GAN"])
def test_a_run_resumes_from_its_checkpoint_on_a_gpu(tmp_path, method):
    """A checkpoint loaded with ``map_location="cuda"`` holds the loader's (and GAN's noise)
    generator state on the GPU; ``set_state`` takes a CPU ByteTensor (the first paper run on an
    H100 stopped with a TypeError when it resumed)."""
    from ccu.methods import get_method

    data = _digits(200)
    prof = ccu.get_profile("smoke", epochs=2, n_train=200)

    def fresh():
        m = get_method(method)(data.spec, ccu.train_settings("digits"), prof, device="cuda")
        m.progress = False
        m.build(data)
        return m

    ckpt = tmp_path / "checkpoint.pt"

    def stop_after_first(done, epochs):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fresh().fit(data, checkpoint=ckpt, on_epoch_end=stop_after_first)
    done = []
    hist = fresh().fit(data, checkpoint=ckpt, on_epoch_end=lambda d, e: done.append(d))
    assert done == [2] and len(hist.loss) == 2
