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
from ccu.core.gmm import em_fit
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


def test_em_fit_refuses_sklearn_off_the_cpu_and_unknown_engines(digits):
    x = torch.as_tensor(digits[:50])
    metric = Mahalanobis.fit(x)
    for device, engine in (("meta", "sklearn"), ("cpu", "cuml")):
        with pytest.raises(ValueError, match="engine must be"):
            em_fit(x, metric, 0, 3, "spherical", 5, 1e-6, False, device=device, engine=engine)


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
