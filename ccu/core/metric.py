"""The paper's Mahalanobis-type metric ``d(x, y) = |C^{-1/2}(x - y)|`` (eq. (12)).

``C`` is the covariance of (augmented) in-distribution data with its eigenvalues floored at
``floor * max eigenvalue`` so that it has full rank. Distances are computed in *whitened*
coordinates ``w = Lambda^{-1/2} U^T x``: the whitened Euclidean norm equals the metric, and
squared distances between batches are a matrix product (``|a|^2 + |b|^2 - 2 a.b``), never an
``(N, K, D)`` tensor. Explained in the book chapter *Corollary 1 and the certified radius*.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ccu.core.validation import as_tensor, check_finite


class Mahalanobis(nn.Module):
    """Metric ``d(x, y) = |C^{-1/2}(x - y)|_2`` with ``C = U diag(eigenvalues) U^T``.

    Build it with :meth:`from_covariance` or :meth:`fit`; the constructor takes an already
    floored eigen-decomposition. The buffers move with ``.to(device)`` and ``.double()``.
    ``C`` is eq. (12) of the paper; chapter *Corollary 1 and the certified radius*
    (``book/corollary1.ipynb``).
    """

    def __init__(self, eigenvalues: torch.Tensor, eigenvectors: torch.Tensor):
        super().__init__()
        eigenvalues = torch.as_tensor(eigenvalues)
        eigenvectors = torch.as_tensor(eigenvectors)
        if eigenvalues.ndim != 1 or eigenvectors.shape != (eigenvalues.numel(),) * 2:
            raise ValueError(
                "Mahalanobis needs eigenvalues of shape (D,) and eigenvectors of shape (D, D); "
                f"got {tuple(eigenvalues.shape)} and {tuple(eigenvectors.shape)}."
            )
        check_finite(eigenvalues, "eigenvalues")
        check_finite(eigenvectors, "eigenvectors")
        if not bool((eigenvalues > 0).all()):
            raise ValueError(
                "Mahalanobis needs strictly positive eigenvalues (C must be positive definite); "
                "build it with Mahalanobis.from_covariance(C, floor=...) to floor them."
            )
        lam64 = eigenvalues.double()
        vec64 = eigenvectors.double()
        # Master copies in float64 (the bounds use them); float32 copies for the forward
        # pass are cached by _matrix so that a training step does not cast a D x D matrix.
        self.register_buffer("eigenvalues", lam64)
        self.register_buffer("eigenvectors", vec64)
        # W maps input space to whitened space: w = x @ W, W = U diag(lambda^{-1/2}).
        self.register_buffer("whitening", vec64 / lam64.sqrt())
        # W^{-1} = diag(lambda^{1/2}) U^T maps back: x = w @ W_inv.
        self.register_buffer("unwhitening", (vec64 * lam64.sqrt()).T.contiguous())
        self.register_buffer("log_det", lam64.log().sum())
        self._cache: dict = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_covariance(cls, C, floor: float = 1e-6) -> Mahalanobis:
        """Eq. (12): ``C = sum_i max(lambda_i, floor * max_j lambda_j) u_i u_i^T`` (chapter
        *Corollary 1 and the certified radius*, ``book/corollary1.ipynb``)."""
        C = as_tensor(C, "C", dtype=torch.float64)
        if C.ndim != 2 or C.shape[0] != C.shape[1]:
            raise ValueError(f"C must be a square (D, D) matrix; got shape {tuple(C.shape)}.")
        check_finite(C, "C")
        if not torch.allclose(C, C.T, rtol=1e-6, atol=1e-10 * float(C.abs().max()) + 1e-12):
            raise ValueError("C must be symmetric (a covariance matrix); got an asymmetric matrix.")
        if not (0 < floor <= 1):
            raise ValueError(f"floor must be in (0, 1]; got {floor}.")
        eigenvalues, eigenvectors = torch.linalg.eigh(C)
        top = float(eigenvalues.max())
        if top <= 0:
            raise ValueError(
                "C has no positive eigenvalue (all-constant data?); a metric cannot be built from it."
            )
        eigenvalues = eigenvalues.clamp_min(floor * top)
        return cls(eigenvalues, eigenvectors)

    @classmethod
    def fit(cls, x, floor: float = 1e-6) -> Mahalanobis:
        """Metric from the covariance of data ``x`` of shape (N, ...) (flattened to (N, D))."""
        x = as_tensor(x, "x", dtype=torch.float64)
        if x.ndim < 2 or x.shape[0] < 2:
            raise ValueError(f"fit needs at least 2 samples of shape (N, D); got {tuple(x.shape)}.")
        x = x.reshape(x.shape[0], -1)
        check_finite(x, "x")
        centred = x - x.mean(0, keepdim=True)
        C = centred.T @ centred / (x.shape[0] - 1)
        return cls.from_covariance(C, floor=floor)

    @classmethod
    def identity(cls, dim: int) -> Mahalanobis:
        """The Euclidean metric (``C = I``) in ``dim`` dimensions."""
        return cls(torch.ones(dim, dtype=torch.float64), torch.eye(dim, dtype=torch.float64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Loading copies into the buffers: drop the cached casts.
        self._cache = {}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        # ... and take the saved buffers' layout: eigh's eigenvectors are column-major, an
        # identity metric's are not, and a model rebuilt empty and loaded (a resumed run) must
        # save the same bytes as the fitted one (buffers are in no optimiser: safe to replace)
        for name, buf in self._buffers.items():
            saved = state_dict.get(prefix + name)
            if buf is not None and saved is not None and saved.shape == buf.shape:
                self._buffers[name] = torch.empty_like(saved, dtype=buf.dtype, device=buf.device)
                self._buffers[name].copy_(buf)

    # ------------------------------------------------------------------ maps
    @property
    def dim(self) -> int:
        return self.eigenvalues.numel()

    def _flat(self, x: torch.Tensor, name: str) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1)
        if x.shape[1] != self.dim:
            raise ValueError(
                f"{name} has {x.shape[1]} features per sample but the metric is {self.dim}-dimensional; "
                "pass inputs of the shape the metric was fitted on."
            )
        return x

    def whiten(self, x: torch.Tensor) -> torch.Tensor:
        """``w = Lambda^{-1/2} U^T x`` for each row; input (N, ...) flattened to (N, D)."""
        x = self._flat(x, "x")
        return x @ self._matrix("whitening", x)

    def unwhiten(self, w: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`whiten`: ``x = U Lambda^{1/2} w``."""
        w = self._flat(w, "w")
        return w @ self._matrix("unwhitening", w)

    def _matrix(self, name: str, like: torch.Tensor) -> torch.Tensor:
        master = getattr(self, name)
        if master.dtype == like.dtype and master.device == like.device:
            return master
        # A cast is reused only for the very master it was made from (held here, so that no
        # new buffer can take its address) at the same version (an in-place edit bumps it).
        if master.is_inference():  # no version counter to tell an edit: cast afresh
            return master.to(dtype=like.dtype, device=like.device)
        # a cast made in inference mode is an inference tensor: no graph may save it
        key = (name, like.dtype, like.device, torch.is_inference_mode_enabled())
        version = master._version
        held = self._cache.get(key)
        if held is None or held[0] is not master or held[1] != version:
            # casts of replaced masters go (they held the old buffers alive)
            self._cache = {k: v for k, v in self._cache.items() if v[0] is getattr(self, k[0])}
            held = (master, version, master.to(dtype=like.dtype, device=like.device))
            self._cache[key] = held
        return held[2]

    def distance(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Pairwise distances, (N, K), for x (N, D) and y (K, D)."""
        return squared_distances(self.whiten(x), self.whiten(y)).sqrt()

    def covariance(self) -> torch.Tensor:
        """The floored covariance ``C`` (float64)."""
        U = self.eigenvectors.double()
        return (U * self.eigenvalues.double()) @ U.T

    def same_as(self, other: Mahalanobis) -> bool:
        """True when both metrics define the same distance (identical whitening maps)."""
        if other is self:
            return True
        if not isinstance(other, Mahalanobis) or other.dim != self.dim:
            return False
        return bool(torch.equal(self.whitening.cpu(), other.whitening.cpu()))

    def extra_repr(self) -> str:
        lam = self.eigenvalues
        return (
            f"dim={self.dim}, eigenvalues in [{float(lam.min()):.3g}, {float(lam.max()):.3g}], "
            f"log_det={float(self.log_det):.4g}"
        )


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a_n - b_k|^2`` for a (N, D), b (K, D): in float64 from the differences themselves
    (:func:`exact_distances`), otherwise as ``|a|^2 + |b|^2 - 2 a.b`` (clamped at 0).

    The expansion is a matrix product instead of an (N, K, D) difference tensor: the only way
    to afford K = 100 centroids in D = 3072 for a batch in training (the benchmark measures the
    difference). It loses digits where ``|a|``, ``|b|`` are large next to ``|a - b|``;
    ``benchmarks/bench_log_density.py`` measures what that does in float32 on MNIST against
    direct differences and float64 (no reported number changes). The certificates are
    statements about the float64 model, whose forward pass must not stray from its bounds by
    more than rounding: in float64 the distances are therefore the direct ones, as the bounds
    take them (``torch.cdist`` without the matrix product, 2-10x the expansion's time on a
    CPU, no (N, K, D) tensor either).
    """
    if a.dtype == torch.float64 or b.dtype == torch.float64:
        return exact_distances(a, b).square()
    return expanded_squared_distances(a, b)


def expanded_squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a|^2 + |b|^2 - 2 a.b`` (clamped at 0), in any dtype: a matrix product, fast, whose
    rounding error is at most :func:`expansion_error` (a search for the nearest points that
    then checks its candidates exactly: :func:`ccu.core.bounds.nearest_training_point`)."""
    sq = (a * a).sum(1, keepdim=True) + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    return sq.clamp_min(0.0)


def expansion_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A bound on the rounding error of :func:`expanded_squared_distances` (N, K): each of
    ``|a|^2``, ``|b|^2`` and ``a.b`` is a sum of ``D`` products, off by at most ``gamma_D =
    D u / (1 - D u)`` of its absolute terms whatever the order of summation (Higham, *Accuracy
    and Stability of Numerical Algorithms*, eq. (3.5)), and ``2 |a.b| <= |a|^2 + |b|^2``; the
    last additions add a few ``u`` more. ``u`` is the dtype's unit roundoff."""
    d = a.shape[1]
    u = torch.finfo(a.dtype).eps / 2
    gamma = d * u / (1 - d * u)
    size = (a * a).sum(1, keepdim=True) + (b * b).sum(1)[None, :]
    return (2 * gamma + 4 * u) * size


def exact_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``|a_n - b_k|`` (N, K) from the differences themselves, not the expansion of
    :func:`squared_distances` (what the certificates use, in float64: no cancellation).
    ``torch.cdist`` in its direct mode does this without an (N, K, D) tensor."""
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def log_normaliser(log_variances: torch.Tensor, dim: int, log_det: torch.Tensor) -> torch.Tensor:
    """Log of the normaliser of ``N(mu, sigma^2 C)``: ``-(D/2) log(2 pi sigma^2) - (1/2) log det C``.

    The paper's alpha_k prints ``(det C)^{D/2}``; a normalised Gaussian has ``(det C)^{1/2}``
    (see the book's Corollary 1 chapter). We use the normalised form.
    """
    return -0.5 * dim * (math.log(2 * math.pi) + log_variances) - 0.5 * log_det
