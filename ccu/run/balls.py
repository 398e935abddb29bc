"""CCU's certified balls around uniform noise (Table 1 of the paper), as a record and a file.

The adversarial-noise experiment (:mod:`ccu.run.adversarial_noise`) attacks every method inside the
balls ``d(x, x_k) <= R_k`` that CCU certifies around uniform-noise centres ``x_k`` (Corollary 1,
eq. (11); the radius by bisection on eqs. (24)-(25)). What an attack needs of CCU is only these
balls: the centres, the float64 radii and the metric ``d`` of eq. (12). :class:`Balls` holds
them, so that one step certifies the balls once, right after CCU is trained
(:func:`certify_balls`, ``ccu balls``), and any method is attacked against the saved balls in
another process, on another day, without CCU's model (``ccu attack --method M``).

Files, in a run's ``adversarial/`` folder (:mod:`ccu.store.results`) and in a reference-results
folder (:mod:`ccu.store.reference_results`):

* ``balls.npz``: ``centres`` (float32), ``radii`` and ``bound`` (float64; NaN: uncertified, no
  ball), the metric's ``eigenvalues`` and ``eigenvectors`` (float64: the metric is rebuilt
  exactly, :class:`ccu.Mahalanobis`);
* ``balls.json`` (written last, the marker): the summary of Table 1 that depends on the balls
  alone (:data:`ccu.store.records.N_CERTIFIED`, :data:`ccu.store.records.MEDIAN_RADIUS`, ...), the balls'
  key (what an attack's key is built from), the sha256 of ``balls.npz`` and the ball method's
  files (the CCU run that certified them).

Chapter *Adversarial noise: Table 1, Figures 2 and 3* (``book/adversarial_noise.ipynb``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ccu.core import evaluate as ev
from ccu.core.bounds import (
    certified_mask,
    certified_radius,
    confidence_bound,
    float64_confidence,
    images_inside_balls,
)
from ccu.core.metric import Mahalanobis
from ccu.data import Dataset, uniform_noise
from ccu.data.sources import sha256
from ccu.store import results as store
from ccu.store.records import (
    BALL_RUN_FILES,
    BALLS_ARRAYS_SHA256,
    BALLS_FROM,
    BALLS_KEY,
    CENTRE_SEED_OFFSET,
    CERTIFIED_AUC,
    CONFIDENCE_IN,
    CONFIDENCE_IN_FLOAT64,
    IMAGES_INSIDE_BALLS,
    LEVEL,
    MEDIAN_RADIUS,
    N_CENTRES,
    N_CERTIFIED,
    N_UNCERTIFIED,
)


def digest(*parts) -> str:
    """sha256 over arrays (their bytes) and JSON values: the attack's keys."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.tobytes() if isinstance(p, np.ndarray) else json.dumps(p, default=str).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Balls:
    """The certified balls of one (dataset, profile, seed): ``centres`` (N, ...), ``radii`` and
    ``bound`` (float64, NaN where a centre is uncertified), the ``metric`` they are balls of,
    ``summary`` (the ball-only part of ``table1.json``), ``key`` (identifies the balls: an
    attack made in other balls is never reused) and ``ball_run_files`` (the sha256 of the
    certifying run's files: balls of a retrained CCU are certified anew)."""

    centres: torch.Tensor
    radii: torch.Tensor
    bound: torch.Tensor
    metric: Mahalanobis
    summary: dict
    key: str
    ball_run_files: dict

    @property
    def ok(self) -> torch.Tensor:
        """Which centres have a certified ball (:func:`ccu.certified_mask`)."""
        return certified_mask(self.radii)

    @property
    def level(self) -> float:
        return self.summary[LEVEL]

    def save(self, directory: Path) -> None:
        """``balls.npz``, then ``balls.json`` (the marker) in ``directory``, atomically."""
        directory = Path(directory)
        arrays = directory / store.BALLS_ARRAYS
        store.write_npz(
            arrays,
            centres=self.centres.numpy(),
            radii=self.radii.numpy(),
            bound=self.bound.numpy(),
            eigenvalues=self.metric.eigenvalues.cpu().numpy(),
            eigenvectors=self.metric.eigenvectors.cpu().numpy(),
        )
        record = dict(self.summary)
        record.update(
            {
                BALLS_KEY: self.key,
                BALLS_ARRAYS_SHA256: sha256(arrays),
                BALL_RUN_FILES: self.ball_run_files,
            }
        )
        store.write_json(directory / store.BALLS, record)

    @classmethod
    def exists(cls, directory: Path) -> bool:
        return (Path(directory) / store.BALLS).exists()

    @classmethod
    def load(cls, directory: Path) -> Balls:
        """The balls saved in ``directory``; :class:`ccu.store.results.CorruptResultError` when a
        file is missing, altered or does not hold what it should."""
        directory = Path(directory)
        record = store.read_json(directory / store.BALLS)
        arrays = directory / store.BALLS_ARRAYS
        if not arrays.exists() or sha256(arrays) != record.get(BALLS_ARRAYS_SHA256):
            raise store.CorruptResultError(
                f"{arrays} is missing or not the one {directory / store.BALLS} vouches for; "
                f"delete both and certify the balls again (`ccu balls`)."
            )
        a = store.read_npz(arrays)
        try:
            metric = Mahalanobis(
                torch.from_numpy(a["eigenvalues"]), torch.from_numpy(a["eigenvectors"])
            )
            summary = {
                k: v
                for k, v in record.items()
                if k not in (BALLS_KEY, BALLS_ARRAYS_SHA256, BALL_RUN_FILES)
            }
            return cls(
                torch.from_numpy(a["centres"]),
                torch.from_numpy(a["radii"]),
                torch.from_numpy(a["bound"]),
                metric,
                summary,
                record[BALLS_KEY],
                record[BALL_RUN_FILES],
            )
        except (KeyError, ValueError) as exc:
            raise store.CorruptResultError(
                f"{directory / store.BALLS} or {arrays} lacks {exc}; delete both and certify "
                "the balls again (`ccu balls`)."
            ) from exc


def certify_balls(
    name: str, model, data: Dataset, n_centres: int, seed: int = 0, level: float = 1.1,
    ball_run_files: dict | None = None,
) -> Balls:  # fmt: skip
    """Table 1's balls: ``n_centres`` uniform-noise centres (seeded with ``seed + 1000``), the
    certified radius of each under ``model`` (a certifying :class:`ccu.CCU`, ``name`` its
    method) at ``level / M`` (NaN: uncertified, the bound at ``R = 0`` is above the level), the
    bound over each ball, the training and test images inside the balls and the certified AUC
    (the float64 model's confidences on the test set, :func:`ccu.core.bounds.float64_confidence`,
    against the guaranteed bounds, which are float64 statements too; an uncertified centre
    counts as a failure). ``ball_run_files``: the sha256 of the certifying run's files (its
    config's ``files``), part of the key."""
    from ccu.run.experiment import median

    centres = uniform_noise(n_centres, data.spec.shape, seed + CENTRE_SEED_OFFSET)
    radii = certified_radius(model, centres, level=level).cpu()
    ok = certified_mask(radii)
    bound = torch.full_like(radii, float("nan"))
    if bool(ok.any()):
        bound[ok] = confidence_bound(model, centres[ok], radii[ok]).cpu()
    everything = torch.cat([data.train_x, data.test_x])
    inside = images_inside_balls(model.metric, centres, radii, everything)[0]
    guaranteed = torch.where(ok, bound, 1.0).numpy()  # no ball: no guarantee
    summary = {
        BALLS_FROM: name,
        N_CENTRES: n_centres,
        N_CERTIFIED: int(ok.sum()),
        N_UNCERTIFIED: int((~ok).sum()),
        LEVEL: level,
        IMAGES_INSIDE_BALLS: int(inside.sum()),
        CERTIFIED_AUC: ev.strict_auc(
            float64_confidence(model, data.test_x).cpu().numpy(), guaranteed
        ),
        CONFIDENCE_IN: CONFIDENCE_IN_FLOAT64,  # what the certified AUC compared (0.7.0 on)
        MEDIAN_RADIUS: median(radii[ok]) if bool(ok.any()) else float("nan"),
    }
    key = digest(centres.numpy(), radii.numpy(), level, ball_run_files)
    metric = model.metric
    own = Mahalanobis(metric.eigenvalues.detach().cpu(), metric.eigenvectors.detach().cpu())
    return Balls(centres, radii, bound, own, summary, key, ball_run_files or {})
