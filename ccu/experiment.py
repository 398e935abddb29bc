"""Runs with results on disk: train (or load) a method, score the test and OOD sets, attack.

Layout (ignored by git)::

    results/<profile>/<dataset>/<method>/config.json     resolved config, library version, data checksum
                                         checkpoint.pt   per-epoch training state (resume)
                                         model.pt        final weights (loaded with weights_only=True)
                                         scores.npz      per-sample scores on the test set and each OOD set
                                         metrics.json    test error, confidences, AUROC / AUPR / FPR@95
    results/<profile>/<dataset>/adversarial/...          certified radii, worst cases per method, Table 1

A re-run with the same config loads instead of retraining unless ``retrain=True``. In-distribution
scores are computed once per model and reused for every OOD set.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import ccu
from ccu import evaluate as ev
from ccu.attacks import AttackResult
from ccu.config import Profile, get_profile, train_settings
from ccu.data import Dataset, load_dataset, load_ood, uniform_noise
from ccu.methods import get_method

RESULTS_ROOT = Path(os.environ.get("CCU_RESULTS", Path(__file__).resolve().parents[1] / "results"))


def results_dir(profile: str, dataset: str, method: str, root=None) -> Path:
    return Path(root or RESULTS_ROOT) / profile / dataset / method


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default))
    os.replace(tmp, path)


@dataclass
class RunResult:
    """A trained method with its per-sample scores and metrics."""

    method: ccu.methods.Method
    config: dict
    scores: dict[str, np.ndarray]  # "test", "test_confidence", "test_prediction", "<ood>"...
    metrics: dict
    directory: Path
    loaded: bool


def _config(dataset: str, method: str, profile, settings, seed: int, data: Dataset) -> dict:
    return {
        "dataset": dataset,
        "method": method,
        "profile": profile.as_dict(),
        "settings": asdict(settings),
        "seed": seed,
        "ccu_version": ccu.__version__,
        "torch_version": torch.__version__,
        "data_checksum": data.checksum(),
        "dataset_description": data.spec.description,
        "data_sources": data.info,  # in-data files, out-distribution files and count
        "out_distribution": data.out_description,
        "ood_sets": list(data.spec.ood_sets),
    }


def _same(a: dict, b: dict) -> bool:
    keys = ("dataset", "method", "profile", "settings", "seed", "data_checksum", "ccu_version")
    return all(json.dumps(a.get(k), default=str) == json.dumps(b.get(k), default=str) for k in keys)


def run_method(
    dataset: str,
    method: str,
    profile: str | Profile = "smoke",
    seed: int = 0,
    device: str = "cpu",
    data: Dataset | None = None,
    retrain: bool = False,
    root=None,
    ood_seed: int = 1,
) -> RunResult:
    """Train ``method`` on ``dataset`` (or load the saved run) and score the test and OOD sets.

    ``profile`` is a profile name or a :class:`ccu.Profile` (e.g. ``get_profile("smoke", epochs=3)``);
    a saved run is reused only when its recorded config (profile fields included) is the same.
    """
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    settings = train_settings(dataset)
    if data is None:
        data = load_dataset(dataset, seed=seed).subset(prof.n_train)
    cls = get_method(method)
    m = cls(data.spec, settings, prof, seed=seed, device=device)
    out = results_dir(prof.name, dataset, method, root)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(_config(dataset, method, prof, settings, seed, data), network=m.network_kind())
    files = [out / n for n in ("config.json", "model.pt", "scores.npz", "metrics.json")]
    stale = False
    if not retrain and all(f.exists() for f in files):
        saved = json.loads(files[0].read_text())
        if _same(saved, config):
            try:
                m.load_state_dict(torch.load(files[1], map_location=device, weights_only=True))
            except (RuntimeError, ValueError, KeyError) as exc:
                warnings.warn(
                    f"{files[1]} does not fit {method} ({exc}); retraining.", stacklevel=2
                )
                stale = True
            else:
                with np.load(files[2]) as z:
                    scores = {k: z[k] for k in z.files}
                return RunResult(m, saved, scores, json.loads(files[3].read_text()), out, True)
    if retrain or stale:
        for f in [*files, out / "checkpoint.pt"]:
            f.unlink(missing_ok=True)
    # A checkpoint is resumed only by the configuration that wrote it (recorded when training
    # starts); any other configuration starts from scratch.
    pending = out / "config.pending.json"
    if pending.exists() and not _same(json.loads(pending.read_text()), config):
        for f in out.glob("*checkpoint.pt"):
            f.unlink()
    elif not pending.exists():
        for f in out.glob("*checkpoint.pt"):
            f.unlink()
    _write_json(pending, config)
    start = time.perf_counter()
    if cls.needs_base:  # ODIN, Maha: post-hoc methods on top of the trained Base
        base = run_method(
            dataset, "Base", prof, seed, device, data=data, root=root, ood_seed=ood_seed
        )
        m.build_from_base(base.method, data)
    else:
        m.build(data)
    history = m.fit(data, checkpoint=out / "checkpoint.pt")
    config["train_seconds"] = time.perf_counter() - start
    config["history"] = {"loss": history.loss, "accuracy": history.accuracy}
    torch.save(m.state_dict(), out / "model.pt")
    scores, metrics = score_sets(m, data, ood_seed)
    config["wall_seconds"] = time.perf_counter() - start
    np.savez(out / "scores.npz", **scores)
    _write_json(out / "metrics.json", metrics)
    _write_json(out / "config.json", config)
    return RunResult(m, config, scores, metrics, out, False)


def score_sets(method, data: Dataset, ood_seed: int = 1):
    """Per-sample scores on the test set (once) and every OOD set of the dataset; metrics."""
    test = method.evaluate(data.test_x)
    scores = {
        "test": test["score"].numpy(),
        "test_confidence": test["confidence"].numpy(),
        "test_prediction": test["prediction"].numpy(),
    }
    metrics = {
        "test_error": ev.classification_error(test["prediction"].numpy(), data.test_y.numpy()),
        "n_test": len(data.test_y),
        "mean_max_confidence": float(test["confidence"].mean()),
        "min_confidence": float(test["confidence"].min()),
        "n_below_1.1_over_M": int((test["confidence"] < 1.1 / data.num_classes).sum()),
        "ood": {},
    }
    for name in data.spec.ood_sets:
        try:
            x, source = load_ood(name, data, seed=ood_seed, with_source=True)
        except ccu.data.DataNotFoundError as exc:
            metrics["ood"][name] = {"skipped": str(exc).splitlines()[0]}
            continue
        res = method.evaluate(x)
        scores[name] = res["score"].numpy()
        scores[f"{name}_confidence"] = res["confidence"].numpy()
        metrics["ood"][name] = ev.ood_metrics(scores["test"], scores[name])
        metrics["ood"][name]["mean_max_confidence"] = float(res["confidence"].mean())
        metrics.setdefault("ood_sources", {})[name] = dict(source, n=len(x))
    return scores, metrics


def attack_method(method, seeds, radii, metric, steps, restarts, seed=0):
    """The adversarial-noise attack on one method: PGD in each ball on ``method.score``.

    If the method offers an ``attack_surrogate`` (a smoother function, e.g. the score without
    a signed-gradient pre-processing), the balls are attacked on it too and, per seed, the point
    with the higher *true* score is kept. Returns the ``AttackResult`` (scores are true scores)
    and the number of seeds the surrogate won."""
    attack = dict(metric=metric, steps=steps, restarts=restarts, seed=seed)
    x0, rad = seeds.to(method.device), radii.to(method.device, torch.float32)
    res = ccu.ball_attack(method.score, x0, rad, **attack)
    surrogate = method.attack_surrogate()
    if surrogate is None:
        return res, 0
    alt = ccu.ball_attack(surrogate, x0, rad, **attack)
    alt_score = torch.cat([method.score(b).detach() for b in alt.x.split(500)])
    take = alt_score > res.score
    res = AttackResult(
        torch.where(take.view(-1, *[1] * (alt.x.ndim - 1)), alt.x, res.x),
        torch.where(take, alt_score, res.score),
        torch.where(take.to(alt.distance.device), alt.distance, res.distance),
        res.history,
    )
    return res, int(take.sum())


def adversarial_noise(
    runs: dict[str, RunResult],
    data: Dataset,
    profile: str | Profile = "smoke",
    seed: int = 0,
    root=None,
    level: float = 1.1,
) -> dict:
    """Table 1: certify balls around uniform noise with CCU, attack every method inside them.

    Needs a ``"CCU"`` run (its metric and certified radii define the balls). Returns and saves
    per method: TE, SR, AUC (strict: ties are failures), the worst scores and points; and the
    radii, the certified AUC (if every ball attained its bound) and the appendix checks.
    """
    if "CCU" not in runs:
        raise ValueError("adversarial noise needs a trained CCU run: its certified balls.")
    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    model = runs["CCU"].method.model
    seeds = uniform_noise(prof.n_seeds, data.spec.shape, seed + 1000)
    radii = ccu.certified_radius(model, seeds, level=level).cpu()
    bound = ccu.confidence_bound(model, seeds, radii).cpu()
    out = {"n_seeds": prof.n_seeds, "level": level, "radii": radii.numpy(), "bound": bound.numpy()}
    everything = torch.cat([data.train_x, data.test_x])
    nearest, _ = ccu.nearest_training_point(model.metric, seeds.reshape(len(seeds), -1), everything)
    nearest = nearest.cpu()
    out["images_inside_balls"] = int((nearest <= radii).sum())
    ccu_conf = runs["CCU"].scores["test_confidence"]
    out["certified_auc"] = ev.strict_auc(ccu_conf, bound.numpy())
    per_method = {}
    for name, run in runs.items():
        m = run.method
        m.model.eval()
        start = time.perf_counter()
        res, won_by_surrogate = attack_method(
            m, seeds, radii, model.metric, prof.attack_steps, prof.attack_restarts, seed
        )
        worst = res.score.detach().cpu().numpy()
        test_scores = run.scores["test"]
        per_method[name] = {
            "TE": run.metrics["test_error"],
            "SR": ev.success_rate(worst, test_scores),
            "AUC": ev.strict_auc(test_scores, worst),
            "attack_seconds": time.perf_counter() - start,
            "worst_score": worst,
            "worst_x": res.x.detach().cpu().numpy(),
            "max_distance_over_radius": float((res.distance.cpu() / radii.clamp_min(1e-30)).max()),
            "seeds_won_by_surrogate": won_by_surrogate,
        }
    out["methods"] = per_method
    if "CCU" in per_method:  # the certificate: the attack can never beat the bound
        worst_conf = np.exp(per_method["CCU"]["worst_score"])
        out["ccu_bound_violations"] = int((worst_conf > bound.numpy() + 1e-6).sum())
    d = Path(root or RESULTS_ROOT) / prof.name / data.name / "adversarial"
    d.mkdir(parents=True, exist_ok=True)
    np.savez(
        d / "adversarial.npz",
        seeds=seeds.numpy(),
        radii=radii.numpy(),
        bound=bound.numpy(),
        **{f"{k}_worst_x": v["worst_x"] for k, v in per_method.items()},
        **{f"{k}_worst_score": v["worst_score"] for k, v in per_method.items()},
    )
    summary = {k: v for k, v in out.items() if k not in ("radii", "bound", "methods")}
    summary["median_radius"] = float(np.median(out["radii"]))
    summary["methods"] = {
        k: {kk: vv for kk, vv in v.items() if kk not in ("worst_score", "worst_x")}
        for k, v in per_method.items()
    }
    _write_json(d / "table1.json", summary)
    return out
