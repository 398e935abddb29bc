"""The attack and the methods' scoring in chunks sized to the device (issue 11).

Chunking must not change a deterministic result: bit for bit for a score whose arithmetic per
input does not depend on the batch size, to the last bits for networks (BLAS picks kernels by
batch size). The GPU's memory probe is exercised through its arithmetic (no GPU in CI).
"""

import contextlib

import pytest
import torch
from helpers import floored_metric, random_ccu, random_metric

import ccu
from ccu.core import attacks
from ccu.data import load_dataset
from ccu.methods import get_method
from ccu.methods.base import EVAL_BATCH_CPU
from ccu.run import adversarial_noise


def _equal(a, b):
    for name in ("x", "score", "distance", "history"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("include_seed", [True, False])
def test_chunked_attack_is_bit_identical_for_a_rowwise_score(include_seed):
    gen = torch.Generator().manual_seed(4)
    metric = random_metric(gen, 6, spread=3.0)
    w = torch.randn(6, generator=gen, dtype=torch.float64)
    x0 = torch.rand(10, 6, generator=gen, dtype=torch.float64)
    R = 10 ** (2 * torch.rand(10, generator=gen, dtype=torch.float64) - 1)

    def attack(batch_size):
        return ccu.ball_attack(
            lambda x: (torch.sin(5 * x) * w).sum(1), x0, R, metric, steps=30, restarts=3,
            include_seed=include_seed, seed=2, batch_size=batch_size,
        )  # fmt: skip

    whole = attack(None)  # the CPU default takes all 30 iterates at once
    assert float((whole.history[-1] - whole.history[0]).min()) > 0  # the attack did climb
    for bs in (1, 4, 7, 29, 30, 1000):  # uneven last chunks, exactly one chunk, more than all
        _equal(whole, attack(bs))


def test_chunked_attack_on_a_ccu_model():
    model = random_ccu(0, d=3, classifier="mlp")
    gen = torch.Generator().manual_seed(1)
    x0 = torch.rand(6, 3, generator=gen, dtype=torch.float64)
    r = 2 * torch.rand(6, generator=gen, dtype=torch.float64)
    score = ccu.confidence_score(model)
    kw = dict(steps=25, restarts=4, box=None)
    whole = ccu.ball_attack(score, x0, r, model.metric, **kw)
    for bs in (1, 5):
        part = ccu.ball_attack(score, x0, r, model.metric, batch_size=bs, **kw)
        torch.testing.assert_close(part.score, whole.score, rtol=0, atol=1e-12)
        torch.testing.assert_close(part.history, whole.history, rtol=0, atol=1e-12)
        torch.testing.assert_close(part.x, whole.x, rtol=0, atol=1e-6)
        assert bool((part.distance <= r).all())


def test_chunked_attack_on_a_lenet():
    torch.manual_seed(0)
    net = ccu.LeNet(10, 1, 8).eval()
    metric = floored_metric(0, 64, floor=1e-3)
    x0 = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    score = ccu.confidence_score(lambda z: torch.log_softmax(net(z), 1))
    whole = ccu.ball_attack(score, x0, 2.0, metric, steps=10, restarts=4)
    assert float((whole.history[-1] - whole.history[0]).min()) > 0
    for bs in (3, 8):
        part = ccu.ball_attack(score, x0, 2.0, metric, steps=10, restarts=4, batch_size=bs)
        assert part.x.shape == x0.shape
        torch.testing.assert_close(part.score, whole.score, rtol=0, atol=1e-5)
        torch.testing.assert_close(part.history, whole.history, rtol=0, atol=1e-5)
        torch.testing.assert_close(part.x, whole.x, rtol=0, atol=1e-4)


def test_chunks_never_exceed_the_batch_size():
    sizes = []

    def score(x):
        sizes.append(len(x))
        return x.sum(1)

    metric = ccu.Mahalanobis.identity(4)
    ccu.ball_attack(score, torch.rand(5, 4), 0.3, metric, steps=2, restarts=3, batch_size=4)
    assert max(sizes) == 4 and sum(sizes) == 3 * 15  # 15 iterates at the start and per step
    with pytest.raises(ValueError, match="batch_size"):
        ccu.ball_attack(score, torch.rand(5, 4), 0.3, metric, batch_size=0)
    x0 = torch.rand(5, 4, generator=torch.Generator().manual_seed(0))
    double = [  # a float64 score of float32 points keeps its dtype in chunks
        ccu.ball_attack(lambda x: x.double().sum(1), x0, 0.3, metric, steps=3, batch_size=bs)
        for bs in (None, 4)
    ]
    assert double[1].score.dtype == torch.float64
    _equal(*double)


def test_batch_size_arithmetic():
    # 1 GiB free, half usable, 1 MiB fixed: (512 - 1) MiB / 3 MiB per input = 170 -> 128
    gib, mib = 2**30, 2**20
    assert attacks.batch_from_memory(gib, 3 * mib, mib, 10_000) == 128
    assert attacks.batch_from_memory(gib, 3 * mib, mib, 10_000, multiple=1) == 170
    assert attacks.batch_from_memory(gib, 3 * mib, mib, 100) == 100  # capped at the total
    assert attacks.batch_from_memory(gib, 3 * mib, mib, 10_000, fraction=0.25) == 64
    assert attacks.batch_from_memory(mib, 3 * mib, 0, 50) == 1  # never less than one input
    assert attacks.batch_from_memory(gib, 3 * mib, 2 * gib, 50) == 1  # fixed cost beyond free
    with pytest.raises(ValueError):
        attacks.batch_from_memory(gib, 1, 0, 0)
    # two probes: 16 inputs peak at 40 MiB, 32 at 72 MiB -> 2 MiB per input, 8 MiB fixed
    assert attacks.memory_model(40 * mib, 72 * mib, 16, 32) == (2 * mib, 8 * mib)
    # no growth (allocator rounding): the larger probe's average, nothing fixed
    assert attacks.memory_model(64 * mib, 64 * mib, 16, 32) == (2 * mib, 0.0)
    with pytest.raises(ValueError):
        attacks.memory_model(1, 2, 32, 16)


def test_cpu_chunk_is_sized_by_the_bytes_autograd_saves_and_draws_nothing():
    """On the CPU the chunk comes from the bytes autograd saves an iterate (a fixed budget, the
    same on every machine): a score that saves 64 kB an iterate gets 2 GiB / 1.5 / 64 kB = 21,845
    -> the cap, one that saves 4 MB gets 357 -> 320; a stochastic score draws the same numbers
    after the probe as without it. (Before: 2,048 whatever the network: MCD's seven VGG13 passes
    save 16 MB an iterate, 33 GB a chunk, and a CPU run was killed for memory.)"""
    wide = torch.nn.Linear(16, 1)

    def saving(width):
        def score(x):  # ReLU saves its output: width floats an iterate
            h = torch.relu(x.flatten(1)[:, :1].expand(-1, width) * 1.0)
            return wide(h[:, :16]).squeeze(1) + h.mean(1)

        return score

    example = torch.rand(3, 1, 4, 4)
    assert attacks.attack_batch_size(saving(16_000), example, 10_000) == attacks.CPU_ATTACK_BATCH
    assert attacks.attack_batch_size(saving(1_000_000), example, 10_000) == 320
    assert attacks.attack_batch_size(saving(1_000_000), example, 300) == 300  # capped at total
    assert attacks.attack_batch_size(saving(16), example, 10, cpu_default=4) == 4
    assert attacks.probe_batch_size(saving(16), example, 10, cpu_default=4) == 4
    noisy = ccu.confidence_score(
        lambda z: torch.log_softmax(torch.dropout(z.flatten(1)[:, :5], 0.5, True), 1)
    )
    torch.manual_seed(0)
    attacks.attack_batch_size(noisy, example, 10_000)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))


def test_cpu_chunk_of_a_score_with_an_inner_pass_is_the_same_every_time():
    """ODIN's and Maha's scores run an inner backward pass (their input pre-processing) and
    free it before the outer graph is built: the allocator then reuses its addresses, and
    counting saved storages by address alone counted them again, or not, by chance (1,152 to
    2,048 iterates from run to run: the cap, ResNet18's out-of-memory again). Every storage is
    kept alive while the probe runs: the same, conservative count every time."""
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 100_000), torch.nn.ReLU(), torch.nn.Linear(100_000, 1)
    )

    def preprocessed(x):
        with torch.enable_grad():
            inner = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(net(inner).sum(), inner)
        return net(x + 0.01 * g.sign()).squeeze(1)

    example = torch.rand(1, 4)
    chunks = {attacks.attack_batch_size(preprocessed, example, 100_000) for _ in range(6)}
    # 400 kB an iterate for each pass's ReLU: 2 GiB / 1.5 / 800 kB = 1,789 -> 1,728
    assert chunks == {1728}


def test_gpu_probe_path_with_a_simulated_device(monkeypatch):
    """The CUDA branch with the device's memory calls replaced: probes of 16 and 32 inputs
    peaking at 8 MiB + 2 MiB per input; 900 MiB free and 100 MiB cached by the allocator."""
    mib = 2**20
    probed = []

    def fake_peak(fn, z):
        fn(z)  # the score and its gradient really run on the probe
        probed.append(tuple(z.shape))
        return 8 * mib + 2 * mib * len(z)

    monkeypatch.setattr(attacks, "_on_cuda", lambda t: True)
    monkeypatch.setattr(attacks, "_peak_bytes", fake_peak)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (900 * mib, 2**40))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 150 * mib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 50 * mib)
    monkeypatch.setattr(torch.random, "fork_rng", lambda *a, **k: contextlib.nullcontext())
    example = torch.rand(3, 1, 4, 4)
    score = ccu.confidence_score(lambda z: torch.log_softmax(z.flatten(1)[:, :5], 1))
    # (0.5 * 1000 MiB - 8 MiB) / 2 MiB = 246 -> 192 (a multiple of 64)
    assert attacks.attack_batch_size(score, example, 10_000, reserve_bytes=0) == 192
    assert probed == [(16, 16), (32, 16)]  # flat copies of the example
    assert attacks.attack_batch_size(score, example, 100, reserve_bytes=0) == 100
    # the attack's state is reserved by default: 12 x 2 10^5 iterates x 64 B = 146.5 MiB less,
    # (500 - 8 - 146.5) / 2 = 172 -> 128
    assert attacks.attack_batch_size(score, example, 200_000) == 128


# ----------------------------------------------------------------------------- methods
@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits").subset(60)


def _method(name, data, model=None, **kw):
    m = get_method(name)(data.spec, ccu.train_settings("digits"), ccu.get_profile("smoke", **kw))
    if model is None:
        m.build(data)
    else:
        m.model = model
    m.model.eval()
    return m


def _two_pass_evaluate(method, x, batch_size=EVAL_BATCH_CPU):
    """The earlier evaluate: log_probs and score called separately."""
    out = {"score": [], "confidence": [], "prediction": []}
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size]
            lp = method.log_probs(xb)
            out["score"].append(method.score(xb))
            out["confidence"].append(lp.max(dim=1).values.exp())
            out["prediction"].append(lp.argmax(dim=1))
    return {k: torch.cat(v) for k, v in out.items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def test_single_pass_evaluate_matches_two_passes(digits):
    x = torch.rand(23, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    base = _method("Base", digits)
    _same(base.evaluate(x), _two_pass_evaluate(base, x))
    _same(base.evaluate(x, batch_size=5), _two_pass_evaluate(base, x, 5))
    ccu_m = _method("CCU", digits, model=random_ccu(1, d=64, classifier="mlp").float())
    _same(ccu_m.evaluate(x), _two_pass_evaluate(ccu_m, x))
    # methods overriding the score: ODIN (one pre-processing for both), Maha (default path)
    odin = _method("ODIN", digits, model=base.model)
    odin.temperature, odin.eps = 10.0, 0.002
    _same(odin.evaluate(x), _two_pass_evaluate(odin, x))
    maha = get_method("Maha")(digits.spec, ccu.train_settings("digits"), ccu.get_profile("smoke"))
    maha.build_from_base(base, digits)
    maha.eps = 0.001
    _same(maha.evaluate(x), _two_pass_evaluate(maha, x))
    assert base.evaluate(x[:0])["prediction"].shape == (0,)
    with pytest.raises(ValueError, match="batch_size"):
        base.evaluate(x, batch_size=0)


def test_evaluate_calls_one_pass_per_chunk(digits):
    base = _method("Base", digits)
    calls = []
    log_probs = base.log_probs
    base.log_probs = lambda xb: calls.append(len(xb)) or log_probs(xb)
    base.evaluate(torch.rand(12, 1, 8, 8), batch_size=5)
    assert calls == [5, 5, 2]


def test_mcd_passes_are_one_batched_forward(digits):
    torch.manual_seed(0)
    mcd = _method("MCD", digits)
    x = torch.rand(9, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    calls = []
    hook = mcd.model.register_forward_hook(lambda mod, inp, out: calls.append(len(inp[0])))
    passes = mcd._passes(x)
    hook.remove()
    assert calls == [7 * 9]  # one forward over the seven copies
    assert passes.shape == (7, 9, 10)
    torch.testing.assert_close(passes.sum(2), torch.ones(7, 9))
    assert not torch.allclose(passes[0], passes[1])  # each copy draws its own dropout masks
    assert not mcd.model.training and all(
        not m.training for m in mcd.model.modules() if isinstance(m, torch.nn.Dropout)
    )
    # log-probs and score come from the same seven passes
    torch.manual_seed(5)
    lp, score = mcd.log_probs_and_score(x)
    torch.manual_seed(5)
    again = mcd._passes(x)
    torch.testing.assert_close(lp, again.mean(0).clamp_min(1e-30).log())
    torch.testing.assert_close(score, -again.var(0).sum(1))


def test_mcd_without_dropout_matches_the_loop_of_passes(digits):
    torch.manual_seed(0)
    mcd = _method("MCD", digits)
    for m in mcd.model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = torch.rand(9, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        loop = torch.stack([torch.softmax(mcd.model(x), 1) for _ in range(mcd.passes)])
        torch.testing.assert_close(mcd._passes(x), loop, rtol=1e-6, atol=1e-7)
        got = mcd.evaluate(x)
    torch.testing.assert_close(got["score"], -loop.var(0).sum(1), rtol=0, atol=1e-9)
    torch.testing.assert_close(got["confidence"], loop.mean(0).max(1).values)
    assert torch.equal(got["prediction"], loop.mean(0).argmax(1))


def test_attack_method_passes_the_batch_size_through(digits):
    torch.manual_seed(0)
    base = _method("Base", digits)
    odin = _method("ODIN", digits, model=base.model)
    odin.temperature, odin.eps = 10.0, 0.002
    seeds = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    radii = torch.full((4,), 2.0, dtype=torch.float64)
    metric = floored_metric(1, 64, floor=1e-3)
    sizes = []
    score = odin.score
    odin.score = lambda x: sizes.append(len(x)) or score(x)
    a, won_a = adversarial_noise.attack_method(odin, seeds, radii, metric, 5, 3, batch_size=5)
    assert max(sizes) == 5  # the attack and the judging of the surrogate's points
    b, won_b = adversarial_noise.attack_method(odin, seeds, radii, metric, 5, 3)
    assert won_a == won_b
    torch.testing.assert_close(a.score, b.score, rtol=0, atol=1e-5)
    torch.testing.assert_close(a.x, b.x, rtol=0, atol=1e-4)
