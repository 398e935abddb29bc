"""Input checks shared by the library: every error says what is wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch

#: inside :func:`trusted_inputs` the per-batch finiteness check is skipped (see there)
_TRUSTED: ContextVar[bool] = ContextVar("ccu_trusted_inputs", default=False)


@contextmanager
def trusted_inputs() -> Iterator[None]:
    """Skip the finiteness check of :func:`check_batch` inside the block (shape checks stay).

    The check reads a flag back from the device, which stalls a GPU on every step. Hot loops
    (the trainer, the attack) check their data once up front and then run inside this block;
    their batches are gathered from, or stepped within, data already checked."""
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def as_tensor(x, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Convert array-likes to a tensor, with a clear error for things that are not numeric."""
    if isinstance(x, torch.Tensor):
        return x if dtype is None else x.to(dtype)
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - numpy raises many types
        raise TypeError(f"{name} must be a tensor or array; got {type(x).__name__}.") from exc
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"{name} must be numeric; got an array of dtype {arr.dtype}.")
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t if dtype is None else t.to(dtype)


def inputs_trusted() -> bool:
    """True inside :func:`trusted_inputs`."""
    return _TRUSTED.get()


def check_labels(y: torch.Tensor, num_classes: int, name: str = "labels") -> torch.Tensor:
    """Raise ``ValueError`` unless ``y`` holds integer class indices in ``[0, num_classes)``."""
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ValueError(f"{name} must be integer class indices; got dtype {y.dtype}.")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(
            f"{name} must lie in [0, {num_classes - 1}]; got values from {int(y.min())} to "
            f"{int(y.max())}."
        )
    return y


def check_finite(x: torch.Tensor, name: str) -> torch.Tensor:
    """Raise ``ValueError`` if ``x`` holds NaN or infinite values."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(torch.isinf(x).sum())
        raise ValueError(
            f"{name} contains {n_nan} NaN and {n_inf} infinite values; "
            "clean or re-scale the input (images are expected in [0, 1])."
        )
    return x


def check_batch(x: torch.Tensor, dim: int, name: str = "x") -> torch.Tensor:
    """Flatten a batch to (N, dim), checking the feature count and finiteness (finiteness not
    inside :func:`trusted_inputs`)."""
    if not isinstance(x, torch.Tensor):
        x = as_tensor(x, name, dtype=torch.get_default_dtype())
    if x.ndim == 0:
        raise ValueError(f"{name} must be a batch of shape (N, ...); got a scalar.")
    if x.ndim == 1:
        raise ValueError(
            f"{name} must be a batch of shape (N, {dim}) or (N, C, H, W); got shape "
            f"{tuple(x.shape)}. For a single point use x[None]."
        )
    if x.shape[0] == 0:
        raise ValueError(
            f"{name} is an empty batch (shape {tuple(x.shape)}): pass at least one sample."
        )
    flat = x.reshape(x.shape[0], -1)
    if flat.shape[1] != dim:
        raise ValueError(
            f"{name} has {flat.shape[1]} features per sample (shape {tuple(x.shape)}) but the "
            f"model is {dim}-dimensional; inputs and model must come from the same dataset."
        )
    if not _TRUSTED.get():
        check_finite(flat, name)
    return flat
