import numpy as np
import pytest
import torch

import ccu


def _cov(d, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    return a @ a.T + 0.1 * np.eye(d)


def test_distance_matches_definition():
    C = _cov(5)
    m = ccu.Mahalanobis.from_covariance(C)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(7, 5)), rng.normal(size=(4, 5))
    Ci = np.linalg.inv(C)
    want = np.array([[np.sqrt((a - b) @ Ci @ (a - b)) for b in y] for a in x])
    got = m.distance(torch.tensor(x), torch.tensor(y)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-8)
    assert float(m.log_det) == pytest.approx(np.linalg.slogdet(C)[1], rel=1e-10)


def test_whiten_unwhiten_roundtrip():
    m = ccu.Mahalanobis.from_covariance(_cov(6))
    x = torch.randn(10, 6, dtype=torch.float64)
    torch.testing.assert_close(m.unwhiten(m.whiten(x)), x)
    # float32 inputs use a cached float32 copy of the map
    assert m.whiten(x.float()).dtype == torch.float32


def test_eigenvalue_floor():
    C = np.diag([4.0, 1.0, 1e-9, 0.0])
    m = ccu.Mahalanobis.from_covariance(C, floor=1e-6)
    lam = np.sort(m.eigenvalues.numpy())
    np.testing.assert_allclose(lam, [4e-6, 4e-6, 1.0, 4.0])
    np.testing.assert_allclose(m.covariance().numpy(), np.diag([4.0, 1.0, 4e-6, 4e-6]), atol=1e-12)


def test_fit_uses_sample_covariance():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3)) @ np.diag([1.0, 2.0, 3.0])
    m = ccu.Mahalanobis.fit(torch.tensor(x))
    np.testing.assert_allclose(m.covariance().numpy(), np.cov(x, rowvar=False), rtol=1e-8)
    # images are flattened
    m2 = ccu.Mahalanobis.fit(torch.rand(50, 1, 2, 2))
    assert m2.dim == 4


@pytest.mark.parametrize(
    "C, msg",
    [
        (np.ones((3, 2)), "square"),
        (np.array([[1.0, 2.0], [0.0, 1.0]]), "symmetric"),
        (np.array([[np.nan, 0.0], [0.0, 1.0]]), "NaN"),
        (np.zeros((2, 2)), "no positive eigenvalue"),
    ],
)
def test_from_covariance_errors(C, msg):
    with pytest.raises(ValueError, match=msg):
        ccu.Mahalanobis.from_covariance(C)


def test_dimension_mismatch_error():
    m = ccu.Mahalanobis.identity(4)
    with pytest.raises(ValueError, match="4-dimensional"):
        m.whiten(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="at least 2 samples"):
        ccu.Mahalanobis.fit(torch.zeros(1, 3))
