"""The mixtures' fit on a torch device (:mod:`ccu.core.em_device`) is scikit-learn's fit: the
same k-means labels, the same EM iterations, the same parameters to float roundoff. Checked
here on the CPU (the torch engine), and on CUDA where a GPU is lent."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SkGMM

from ccu.core import em_device
from ccu.core.gmm import em_engine, em_fit
from ccu.core.initialisation import init_ccu
from ccu.core.metric import Mahalanobis


def _blobs(seed: int, n: int = 400, d: int = 6, k: int = 7) -> np.ndarray:
    r = np.random.RandomState(seed)
    centres = r.randn(k, d) * 4
    return centres[r.randint(k, size=n)] + r.randn(n, d) * r.uniform(0.3, 2.0)


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    return load_digits().data.astype(np.float64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [3, 20, 60])
def test_kmeans_labels_are_sklearns(seed, k):
    x = _blobs(seed)
    want = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x).labels_
    got = em_device.kmeans_labels(torch.as_tensor(x), k, seed).numpy()
    np.testing.assert_array_equal(got, want)


def test_kmeans_labels_on_near_duplicates_are_sklearns():
    """Points on a grid with 1e-3 of noise: k-means++ picks among near-equal candidates, so a
    last-bit difference in the centred data (torch's mean instead of numpy's) changed 6 of
    300 of these clusterings before the data was centred as KMeans centres it."""
    for seed in range(60):
        r = np.random.RandomState(seed)
        x = np.round(r.randn(40, 3) * 2) / 2 + r.randn(40, 3) * 1e-3
        k = r.randint(5, 30)
        want = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x).labels_
        got = em_device.kmeans_labels(torch.as_tensor(x), k, seed).numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}, k {k}")


def test_an_empty_cluster_takes_the_farthest_point_out_of_its_cluster():
    """scikit-learn's relocation: cluster 2 lost its points; the point farthest from its own
    centre (x = 10, in cluster 1) becomes cluster 2, and cluster 1's mean is taken without it."""
    x = torch.tensor([[0.0], [1.0], [4.0], [5.0], [10.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1])
    old = torch.tensor([[0.5], [4.0], [100.0]], dtype=torch.float64)
    new = em_device._cluster_means(x, labels, old)
    assert new.flatten().tolist() == [0.5, 4.5, 10.0]


@pytest.mark.parametrize("covariance_type", ["spherical", "diag"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_em_is_sklearns(digits, covariance_type, seed):
    k = 20
    sk = SkGMM(
        n_components=k, covariance_type=covariance_type, max_iter=100, reg_covar=1e-6,
        random_state=seed, init_params="kmeans",
    ).fit(digits)  # fmt: skip
    x = torch.as_tensor(digits)
    fit = em_device.em(x, em_device.kmeans_labels(x, k, seed), k, covariance_type)
    assert (fit.n_iter, fit.converged) == (sk.n_iter_, sk.converged_)
    np.testing.assert_allclose(fit.means.numpy(), sk.means_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(fit.variances.numpy(), sk.covariances_, rtol=1e-9)
    np.testing.assert_allclose(fit.weights.numpy(), sk.weights_, rtol=1e-9)


def test_em_refuses_another_covariance():
    x = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="'spherical' or 'diag'"):
        em_device.em(x, torch.tensor([0, 0, 1, 1]), 2, "full")


def _both_engines(x, metric, seed, k, covariance_type, max_iter, device="cpu"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sk = em_fit(x, metric, seed, k, covariance_type, max_iter, 1e-6, False)
        torch_fit = em_fit(
            x, metric, seed, k, covariance_type, max_iter, 1e-6, False, device=device,
            engine="torch",
        )  # fmt: skip
    return sk, torch_fit, [w for w in caught if issubclass(w.category, ConvergenceWarning)]


@pytest.mark.parametrize("covariance_type", ["spherical", "diag"])
def test_em_fit_engines_agree_in_the_whitened_space(digits, covariance_type):
    x = torch.as_tensor(digits)
    metric = Mahalanobis.fit(x)
    sk, fit, _ = _both_engines(x, metric, 3, 30, covariance_type, 100)
    for a, b in zip(sk, fit, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-8)


def test_em_fit_warns_as_sklearn_when_em_stops_unconverged(digits):
    x = torch.as_tensor(digits)
    *_, caught = _both_engines(x, Mahalanobis.fit(x), 0, 10, "spherical", 2)
    assert len(caught) == 2  # scikit-learn's, then the torch engine's


def _assert_sklearns_fit_on(digits, device):
    """em_fit on ``device`` by itself gives scikit-learn's fit on the CPU, exactly."""
    x = torch.as_tensor(digits[:200])
    metric = Mahalanobis.fit(x)
    want = em_fit(x, metric, 0, 3, "spherical", 5, 1e-6, False)
    got = em_fit(x, metric, 0, 3, "spherical", 5, 1e-6, False, device=device)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_em_fit_runs_torch_on_cuda_only_and_sklearn_elsewhere(digits, monkeypatch):
    """The torch engine for eq. (4)'s and the diagonal covariances on CUDA; scikit-learn on
    the CPU for any other device (MPS has no float64: CCU built there before, and still does)
    and any other covariance type (a family of one's own); an unknown engine is refused."""
    import ccu.core.gmm as gmm

    _assert_sklearns_fit_on(digits, "meta")
    x = torch.as_tensor(digits[:200])
    metric = Mahalanobis.fit(x)
    em_fit(x, metric, 0, 3, "full", 5, 1e-6, False, device="cuda")  # scikit-learn's, here
    with pytest.raises(ValueError, match="engine must be"):
        em_fit(x, metric, 0, 3, "spherical", 5, 1e-6, False, engine="cuml")

    class TorchEngine(Exception):
        pass

    def whitened_on(x, metric, n_components, device=None):
        raise TorchEngine(str(device))

    monkeypatch.setattr(gmm, "_whitened_data", whitened_on)
    monkeypatch.setattr(em_device, "agrees_with_sklearn", lambda device, cov: True)
    for covariance_type in em_device.COVARIANCE_TYPES:
        with pytest.raises(TorchEngine, match="cuda"):
            em_fit(x, metric, 0, 3, covariance_type, 5, 1e-6, False, device="cuda")


@pytest.fixture
def no_checks_made():
    """The device checks of this process forgotten before and after (em_device.CHECKED)."""
    em_device.CHECKED.clear()
    yield
    em_device.CHECKED.clear()


def test_a_device_whose_fit_fails_the_check_leaves_it_to_sklearn(
    digits, monkeypatch, no_checks_made
):
    """Checked on the device before it is trusted: a device whose k-means and EM do not give
    scikit-learn's fit on the check problem (here: EM's means off by 1e-6), or raise there,
    is not used; em_fit fits with scikit-learn on the CPU instead, and says so once. A device
    out of memory for now is asked again next time, not written off."""
    assert em_device.agrees_with_sklearn("cpu", "spherical")
    real_em, real_kmeans = em_device.em, em_device.kmeans_labels

    def em_off(*args, **kwargs):
        fit = real_em(*args, **kwargs)
        return em_device.MixtureFit(
            fit.means + 1e-6, fit.variances, fit.weights, fit.n_iter, fit.converged
        )

    monkeypatch.setattr(em_device, "em", em_off)
    with pytest.warns(RuntimeWarning, match="scikit-learn fits them on the CPU instead"):
        assert not em_device.agrees_with_sklearn("cpu", "diag")
    assert em_device.CHECKED[("cpu", "diag")] is False  # once: not checked again
    monkeypatch.setattr(em_device, "em", real_em)

    def raising(error):
        def kmeans(*args, **kwargs):
            raise error("no such kernel")

        return kmeans

    for error, kept in ((RuntimeError, True), (torch.cuda.OutOfMemoryError, False)):
        em_device.CHECKED.clear()
        monkeypatch.setattr(em_device, "kmeans_labels", raising(error))
        with pytest.warns(RuntimeWarning, match=error.__name__):
            assert not em_device.agrees_with_sklearn("cpu", "spherical")
        assert (("cpu", "spherical") in em_device.CHECKED) is kept
    monkeypatch.setattr(em_device, "kmeans_labels", real_kmeans)
    # em_fit on a device that failed: scikit-learn's fit, on the CPU (CUDA is never touched)
    em_device.CHECKED[("cuda", "spherical")] = False
    _assert_sklearns_fit_on(digits, "cuda")


def test_an_empty_cluster_keeps_the_biggest_clusters_centre():
    """scikit-learn's _average_centers: a cluster left empty takes the biggest cluster's centre,
    averaged in index order (checked against scikit-learn 1.9.1's Lloyd step)."""
    # no point farther than 0 from its centre: nothing to move; cluster 0, before the biggest
    # (2), gets its sum (4), not its mean
    x = torch.tensor([[2.0], [2.0], [5.0]], dtype=torch.float64)
    old = torch.tensor([[9.0], [5.0], [2.0]], dtype=torch.float64)
    got = em_device._cluster_means(x, torch.tensor([2, 2, 1]), old)
    assert got.flatten().tolist() == [4.0, 5.0, 2.0]
    # cluster 1's one point moves to the empty cluster 2, which drains cluster 1: after the
    # biggest (0), it gets its mean
    x = torch.tensor([[0.0], [1.0], [10.0]], dtype=torch.float64)
    old = torch.tensor([[0.5], [4.0], [50.0]], dtype=torch.float64)
    got = em_device._cluster_means(x, torch.tensor([0, 0, 1]), old)
    assert got.flatten().tolist() == [0.5, 0.5, 10.0]


def test_ccu_fits_its_mixtures_on_its_own_device(monkeypatch):
    """CCUMethod hands init_ccu the device it trains on (so the GPU runs k-means and EM)."""
    import ccu.methods.ccu_method as ccu_method
    from ccu.methods import get_method
    from ccu.run.config import get_profile, train_settings
    from ccu.run.experiment import run_data

    class Handed(Exception):
        pass

    def init_ccu_seen(*args, **kwargs):
        raise Handed(str(kwargs.get("device")))

    monkeypatch.setattr(ccu_method, "init_ccu", init_ccu_seen)
    prof = get_profile("smoke", "digits", epochs=1, n_train=100)
    data = run_data("digits", prof, 0)
    method = get_method("CCU")(data.spec, train_settings("digits"), prof, seed=0, device="cuda")
    with pytest.raises(Handed, match="cuda"):
        method.fit_initial(torch.nn.Linear(64, 10), data)


def test_init_ccu_hands_the_device_only_to_fits_that_name_it(digits):
    """A family whose ``fit`` names ``device`` gets CCU's; one without is called as before."""
    seen = {}

    from ccu.core.gmm import GaussianMixture

    class Recording(GaussianMixture):
        @classmethod
        def fit(cls, x, metric, seed=0, n_components=100, device=None):
            seen.setdefault("device", []).append(device)
            return GaussianMixture.fit(x, metric, seed=seed, n_components=n_components)

    class Plain(GaussianMixture):
        @classmethod
        def fit(cls, x, metric, seed=0, n_components=100):
            seen.setdefault("plain", []).append(True)
            return GaussianMixture.fit(x, metric, seed=seed, n_components=n_components)

    x = torch.as_tensor(digits[:300], dtype=torch.float32)
    out = torch.rand(300, 64)
    clf = torch.nn.Linear(64, 10)
    init_ccu(clf, x, out, 10, n_components=4, density=Recording, device="cpu")
    init_ccu(clf, x, out, 10, n_components=4, density=Plain, device="cpu")
    assert seen == {"device": ["cpu", "cpu"], "plain": [True, True]}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a lease's check)")
@pytest.mark.parametrize("covariance_type", ["spherical", "diag"])
def test_em_fit_on_cuda_is_sklearns(digits, covariance_type):
    x = torch.as_tensor(digits)
    metric = Mahalanobis.fit(x)
    sk, fit, _ = _both_engines(x, metric, 3, 30, covariance_type, 100, device="cuda")
    for a, b in zip(sk, fit, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-8)
    # and em_fit picks the GPU's engine by itself there: its check passes
    assert em_engine("cuda", covariance_type) == "torch"
