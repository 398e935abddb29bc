"""CCU's initial fit, made once on a CPU and carried to a GPU call.

Building CCU (section "Experiments", paragraph CCU: the metric C of eq. (12) and the EM fits
of both mixtures) ran scikit-learn's k-means and EM on the CPU wherever the model then trained:
on the full MNIST ~140 s of a 2-core working machine and about as long inside a GPU lease, a
quarter of CCU's share of a 10-minute call (lease of 2026-11-27: CCU's whole training, build
included, 525 s in four lanes). On CUDA they now run on the GPU (:mod:`ccu.core.em_device`),
and what stays on the CPU is ~10 s on MNIST; a carried fit saves that and the GPU's part. Its result depends only on the data, the seed, the
profile and the fitting code, so ``python tools/lease.py prepare`` fits it here, before the
lease, and the call carries the file (~15 MB on MNIST); :meth:`ccu.methods.ccu_method.CCUMethod.build`
loads it instead of fitting when ``CCU_INIT_DIR`` holds one whose :func:`init_key` matches,
and fits as always otherwise (another dataset decode, code or setting: another key).

The key hashes everything the fit reads: the training and out-distribution tensors, the
covariance sample's settings, the profile's number of components, the seed, the density family
and the source of the fitting code. The classifier is not part of the file: it is drawn from
the seed on the device as without one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path

import numpy as np
import torch

#: where the build looks for carried initial fits (``tools/lease_run.sh`` sets it)
INIT_DIR_ENV = "CCU_INIT_DIR"
#: the largest out-distribution sample the out-mixture is fitted on (:func:`ccu.init_ccu`)
MAX_OUT = 20000


def _tensor_sha(x: torch.Tensor) -> str:
    return hashlib.sha256(np.ascontiguousarray(x.detach().cpu().numpy()).tobytes()).hexdigest()


def _code_sha(family) -> str:
    """The source of the code the fit runs: the build, the metric, the covariance sample, the
    mixtures' EM (:func:`ccu.core.gmm.em_fit`, for every family built on it) and the density
    family's module (a change in any is another key)."""
    from ccu.core import gmm, initialisation, metric
    from ccu.data import augment

    h = hashlib.sha256()
    for obj in (initialisation, metric, augment, gmm, inspect.getmodule(family) or family):
        h.update(inspect.getsource(obj).encode())
    return h.hexdigest()


def init_inputs(method, data) -> dict:
    """Everything the initial fit of ``method`` (a CCU method) on ``data`` depends on."""
    from ccu.core.density import get_density_family
    from ccu.data.augment import covariance_size

    family = get_density_family(method.density)
    settings = method.settings
    return {
        "dataset": data.spec.name,
        "train_sha256": _tensor_sha(data.train_x),
        "out_sha256": _tensor_sha(data.out_x),
        "augment": bool(settings.augment),
        # the number used: the dataset's (as before the profile's cap), else the capped one
        "n_covariance": settings.n_covariance
        if method.profile.n_covariance is None
        else covariance_size(settings, len(data.train_x), method.profile.n_covariance),
        "augmentation": repr(data.spec.augmentation),
        "eigen_floor": settings.eigen_floor,
        "lam": settings.lam,
        "n_components": method.profile.n_components,
        "max_out": MAX_OUT,
        "seed": method.seed,
        "density_family": method.density,
        "code_sha256": _code_sha(family),
    }


def init_key(inputs: dict) -> str:
    """The file name's key: sha256 of the inputs (:func:`init_inputs`) as sorted JSON."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]


def init_path(folder: Path, key: str) -> Path:
    return Path(folder) / f"ccu-init-{key}.pt"


def densities_state(model) -> dict[str, torch.Tensor]:
    """The fitted part of a CCU model's state: everything but the classifier's weights. The
    two densities share one metric (three 784 x 784 float64 matrices on MNIST): no copies, so
    that ``torch.save`` writes it once (~15 MB on MNIST, not 29)."""
    return {
        k: v.detach().cpu()
        for k, v in model.state_dict().items()
        if not k.startswith("classifier.")
    }


def save_init(folder: Path, inputs: dict, densities: dict, model) -> Path:
    """Write the initial fit of ``model`` (just built from ``inputs``), atomically."""
    path = init_path(folder, init_key(inputs))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"inputs": inputs, "densities": densities, "state": densities_state(model)}, tmp)
    os.replace(tmp, path)
    return path


def find_init(inputs: dict, folder: str | Path | None = None) -> dict | None:
    """The carried initial fit for ``inputs`` in ``folder`` (default: ``$CCU_INIT_DIR``), or
    None when there is none with that key (the build then fits as always)."""
    folder = folder if folder is not None else os.environ.get(INIT_DIR_ENV)
    if not folder:
        return None
    path = init_path(Path(folder), init_key(inputs))
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("inputs") != inputs:  # a key collision or a hand-renamed file: not this fit
        return None
    saved["path"] = path
    return saved
