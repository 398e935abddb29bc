from dataclasses import replace

import pytest
import torch

import ccu
from ccu.data import get_spec, load_dataset
from ccu.data.batches import epoch_indices


@pytest.mark.parametrize("name", ["moons", "digits"])
def test_offline_datasets_load_deterministically(name):
    a, b = load_dataset(name, seed=3), load_dataset(name, seed=3)
    spec = get_spec(name)
    assert a.train_x.shape[1:] == spec.shape and a.out_x.shape[1:] == spec.shape
    assert set(a.train_y.unique().tolist()) == set(range(spec.num_classes))
    assert a.checksum() == b.checksum()
    assert torch.equal(a.out_x, b.out_x)
    if spec.value_range is not None:
        lo, hi = spec.value_range
        assert float(a.train_x.min()) >= lo and float(a.train_x.max()) <= hi
        assert float(a.out_x.min()) >= lo and float(a.out_x.max()) <= hi
    assert load_dataset(name, seed=4).checksum() != a.checksum()


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(
        ValueError, match="known datasets: cifar10, cifar10-jpeg, cifar10-offline, cifar100, digits"
    ):
        load_dataset("mnistt")


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile 'fast'"):
        ccu.get_profile("fast")
    assert ccu.get_profile("smoke", epochs=3).epochs == 3
    with pytest.raises(ValueError, match="cannot override \\['epoch'\\]"):
        ccu.get_profile("smoke", epoch=3)


def test_epoch_indices_drop_nothing():
    gen = torch.Generator().manual_seed(0)
    ins, outs = epoch_indices(10, 7, 4, gen)
    assert sorted(ins.tolist()) == list(range(10)) and len(outs) == len(ins)
    assert sorted(outs[:7].tolist()) == list(range(7))  # the first pass uses every out-sample


def _full_loss(model, data):
    with torch.no_grad():
        if isinstance(model, ccu.CCU):
            return float(ccu.ccu_loss(model, data.train_x, data.train_y, data.out_x[:600]).loss)
        return float(torch.nn.functional.cross_entropy(model(data.train_x), data.train_y))


@pytest.mark.parametrize("kind", ["base", "ccu"])
def test_training_on_digits(kind):
    torch.manual_seed(0)
    data = load_dataset("digits").subset(600)
    clf = ccu.make_classifier("mlp", data.spec.shape, data.num_classes, hidden=32)
    model = clf if kind == "base" else ccu.init_ccu(clf, data.train_x, data.out_x, 10, 5)
    before = _full_loss(model, data)
    hist = ccu.Trainer(10, ccu.train_settings("digits"), progress=False).fit(model, data)
    assert _full_loss(model, data) < before - 0.5
    assert len(hist.loss) == 10
    assert ccu.accuracy(model, data.test_x, data.test_y) > 0.8
    if kind == "ccu":
        assert len(hist.constraint_gap) == 10 * 5  # 600 points in batches of 128
        # theta >= 2 max sigma after every step: log-gap >= log 2
        assert min(hist.constraint_gap) >= 0.6931471805599453 - 1e-6


@pytest.mark.parametrize("augment", [False, True])
def test_checkpoint_resume_gives_the_same_weights(tmp_path, augment):
    """Exact on the CPU, also with the device-side augmentation drawn from the loader's plan."""
    data = load_dataset("digits").subset(300)
    settings = replace(ccu.train_settings("digits"), augment=augment)

    def fresh():
        torch.manual_seed(0)
        clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=16)
        return ccu.init_ccu(clf, data.train_x, data.out_x, 10, 3)

    full = fresh()
    ccu.Trainer(4, settings, progress=False).fit(full, data)
    ckpt = tmp_path / "run" / "checkpoint.pt"
    part = fresh()
    ccu.Trainer(4, settings, progress=False).fit(part, data, checkpoint=ckpt)
    # a run killed right after its epoch-2 checkpoint
    ckpt.unlink()

    def die_after_epoch_2(done, epochs):
        if done == 2:
            raise KeyboardInterrupt

    killed = fresh()
    with pytest.raises(KeyboardInterrupt):
        ccu.Trainer(4, settings, progress=False).fit(
            killed, data, checkpoint=ckpt, on_epoch_end=die_after_epoch_2
        )
    assert torch.load(ckpt, weights_only=True)["epoch"] == 2
    resumed = fresh()
    hist = ccu.Trainer(4, settings, progress=False).fit(resumed, data, checkpoint=ckpt)
    assert len(hist.loss) == 4
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(full.state_dict().values(), part.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_on_epoch_end_is_called_once_per_epoch_after_its_checkpoint(tmp_path, with_checkpoint):
    """``Trainer.fit(on_epoch_end=...)`` gets ``(epochs done, epochs)`` after every epoch, when
    that epoch's checkpoint is on disk (`ccu run --stop-after` stops there); also without a
    checkpoint, and from where a resumed run starts."""
    data = load_dataset("digits").subset(200)
    ckpt = tmp_path / "checkpoint.pt" if with_checkpoint else None
    calls = []

    def on_epoch_end(done, epochs):
        saved = torch.load(ckpt, weights_only=True)["epoch"] if with_checkpoint else None
        calls.append((done, epochs, saved))

    def fit(epochs):
        torch.manual_seed(0)
        clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=8)
        trainer = ccu.Trainer(epochs, progress=False)
        return trainer.fit(clf, data, checkpoint=ckpt, on_epoch_end=on_epoch_end)

    hist = fit(3)
    saved = [1, 2, 3] if with_checkpoint else [None] * 3
    assert calls == [(k, 3, s) for k, s in zip([1, 2, 3], saved, strict=True)]
    assert len(hist.loss) == 3
    if with_checkpoint:  # a finished run found again: no epoch left, no call
        calls.clear()
        fit(3)
        assert calls == []


def test_bad_checkpoints(tmp_path):
    data = load_dataset("digits").subset(200)
    clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=8)
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="delete it to train from scratch"):
        ccu.Trainer(1, progress=False).fit(clf, data, checkpoint=ckpt)
    ckpt.unlink()
    ccu.Trainer(1, progress=False).fit(clf, data, checkpoint=ckpt)
    with pytest.raises(ValueError, match="1-epoch run"):
        ccu.Trainer(3, progress=False).fit(clf, data, checkpoint=ckpt)


def test_checkpoints_every_n_epochs_and_after_the_last_give_the_same_weights(tmp_path, monkeypatch):
    """``CCU_CHECKPOINT_EVERY=2`` (a GPU lease writes fewer checkpoints): saved after epochs 2,
    4 and 5 of 5, the same weights as a run saving after every epoch; a run killed after epoch
    3 resumes from epoch 2 and still ends with them."""
    data = load_dataset("digits").subset(200)
    saved = []

    def fit(every, ckpt, on_epoch_end=None):
        monkeypatch.setenv("CCU_CHECKPOINT_EVERY", str(every))
        torch.manual_seed(0)
        clf = ccu.make_classifier("mlp", data.spec.shape, 10, hidden=8)

        def note(done, epochs):
            saved.append(torch.load(ckpt, weights_only=True)["epoch"] if ckpt.exists() else 0)
            if on_epoch_end is not None:
                on_epoch_end(done, epochs)

        ccu.Trainer(5, progress=False).fit(clf, data, checkpoint=ckpt, on_epoch_end=note)
        return clf

    every = fit(1, tmp_path / "a" / "checkpoint.pt")
    saved.clear()
    sparse = fit(2, tmp_path / "b" / "checkpoint.pt")
    assert saved == [0, 2, 2, 4, 5]  # the checkpoint on disk after each epoch (0: none yet)
    for a, b in zip(every.state_dict().values(), sparse.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    def die_after_3(done, epochs):
        if done == 3:
            raise KeyboardInterrupt

    ckpt = tmp_path / "c" / "checkpoint.pt"
    with pytest.raises(KeyboardInterrupt):
        fit(2, ckpt, die_after_3)
    assert torch.load(ckpt, weights_only=True)["epoch"] == 2
    resumed = fit(2, ckpt)
    for a, b in zip(every.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
