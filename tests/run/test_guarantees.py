"""Certificates around OOD test sets and the guaranteed AUC (:mod:`ccu.run.guarantees`): the numbers
against their definitions on a random model, and the CLI step on a tiny saved run."""

import json
import math

import numpy as np
import pytest
import torch
from helpers import random_ccu

import ccu
from ccu import cli
from ccu.core import evaluate as ev
from ccu.core import guarantees as certificates
from ccu.core import lp
from ccu.report import guarantees as shown
from ccu.run import guarantees, steps
from ccu.store import results as store
from ccu.store.records import RunSpec

TINY = {"epochs": 1, "n_train": 300, "n_centres": 4, "attack_steps": 2, "attack_restarts": 1}


def test_certify_sets_follows_the_definitions():
    model = random_ccu(2, d=4)
    gen = torch.Generator().manual_seed(0)
    near = model.density_in.means.detach()[:2] + 0.01  # not certified
    far = 30 + 5 * torch.randn(6, 4, generator=gen, dtype=torch.float64)
    conf_in = np.array([0.9, 0.95, 0.3, 0.26])
    sets = {"test": near, "far": torch.cat([near, far])}
    out = guarantees.certify_sets(model, sets, conf_in, eps_inf=(0.0, 0.5), eps_2=(1.0,))
    t, f = out["sets"]["test"], out["sets"]["far"]
    assert "certified_auc" not in t and t["n_certified"] == 0 and t["radius"]["q50"] is None
    radius = ccu.certified_radius(model, sets["far"])
    ok = ccu.certified_mask(radius)
    assert f["n_certified"] == int(ok.sum()) == 6 and f["share_certified"] == 0.75
    assert f["radius"]["q50"] == pytest.approx(float(radius[ok].median().double()), rel=1e-9) or (
        f["radius"]["q50"] == pytest.approx(float(radius[ok].quantile(0.5)))
    )
    k2, kinf = lp.lp_norm_factor(model.metric, 2), lp.lp_norm_factor(model.metric)
    assert f["inner_l2_radius"]["max"] == pytest.approx(float(radius[ok].max()) / k2)
    assert f["inner_linf_radius"]["min"] == pytest.approx(float(radius[ok].min()) / kinf)
    bound = torch.ones(8, dtype=torch.float64)
    bound[ok] = ccu.confidence_bound(model, sets["far"][ok], radius[ok])
    assert f["certified_auc"] == pytest.approx(ev.strict_auc(conf_in, bound.numpy()))
    # uncertified points fail: 2 of 8 OOD points lose against every in-point
    assert f["certified_auc"] <= 6 / 8
    b = ccu.lp_confidence_bound(model, sets["far"], 0.5).numpy()
    assert f["gauc_inf"]["0.5"]["gauc"] == pytest.approx(lp.guaranteed_auc(conf_in, b, "half"))
    assert f["gauc_inf"]["0.5"]["gauc_strict"] == pytest.approx(ev.strict_auc(conf_in, b))
    assert "clean_auc_strict" not in f  # given confidences: not the float64 model's, no clean AUC
    own = guarantees.certify_sets(model, sets, None, eps_inf=(0.5,), eps_2=(1.0,))
    conf64 = ccu.core.bounds.float64_confidence(model, sets["test"]).numpy()
    clean = ccu.core.bounds.float64_confidence(model, sets["far"]).numpy()
    assert own["sets"]["far"]["clean_auc_strict"] == pytest.approx(ev.strict_auc(conf64, clean))
    b2 = ccu.lp_confidence_bound(model, sets["far"], 1.0, p=2).numpy()
    assert f["gauc_2"]["1"]["gauc"] == pytest.approx(lp.guaranteed_auc(conf_in, b2, "half"))
    assert out["kappa_inf"]["lower"] <= out["kappa_inf"]["upper"]
    assert out["kappa_2"] == pytest.approx(1 / math.sqrt(float(model.metric.eigenvalues.min())))
    rows = shown.summary_rows(dict(out, field_eps_inf=0.5))
    assert [r["set"] for r in rows] == ["test", "far"] and rows[1]["gauc_field_eps"] is not None


def test_the_field_eps_of_good_and_prood():
    assert certificates.kind((1, 28, 28)) == "grey" and certificates.kind((3, 32, 32)) == "colour"
    assert certificates.FIELD_EPS == {"grey": 0.3, "colour": 0.01}
    for k, eps in certificates.FIELD_EPS.items():
        assert eps in certificates.LINF_SWEEP[k]
    # GOOD's Table 1 takes 0.03 on SVHN (0.01 on CIFAR-10): in the colour sweep too
    assert certificates.field_eps("colour", "SVHN") == 0.03
    assert certificates.field_eps("colour", "CIFAR10") == 0.01
    assert certificates.FIELD_EPS_DATASET["SVHN"] in certificates.LINF_SWEEP["colour"]


@pytest.mark.parametrize("p", [2, math.inf])
def test_the_sweeps_bounds_are_the_lp_bound_of_their_own_norm(p):
    """Points a few units from the in-means, where the bound lies strictly between 1/M and 1
    (far out every bound is 1/M, and a kappa of the wrong norm went unnoticed)."""
    model = random_ccu(4, d=5)
    gen = torch.Generator().manual_seed(0)
    means = model.density_in.whitened_means.detach().double() @ model.metric.unwhitening
    x = means[:1] + 0.7 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    eps_values = [0.05, 0.2]
    swept = certificates.lp_bounds(model, x, eps_values, p)
    for eps in eps_values:
        want = ccu.lp_confidence_bound(model, x, eps, p).cpu().numpy()
        assert np.array_equal(swept[eps], want)
        inside = (want > 1 / model.num_classes + 1e-6) & (want < 1 - 1e-6)
        assert inside.sum() >= 2  # the bounds tell the norms apart here
    other = certificates.lp_bounds(model, x, eps_values, 2 if p == math.inf else math.inf)
    assert not np.array_equal(other[0.2], swept[0.2])


def test_evaluate_guarantees_writes_and_reference_copies(tmp_path, capsys):
    res, ref = tmp_path / "results", tmp_path / "ref"
    common = ["--profile", "smoke", "--overrides", json.dumps(TINY), "--results", str(res)]
    common += ["--device", "cpu", "--no-progress"]
    argv = ["run", "--dataset", "digits", "--method", "Base", "CCU", "--reference-out", str(ref)]
    assert cli.main([*argv, *common]) == cli.EXIT_OK
    from ccu.run.config import get_profile

    prof = get_profile("smoke", **TINY)  # the runs live under the overridden profile's names
    d = store.method_dir(prof, "digits", "CCU", res, 0)
    g = json.loads((d / "guarantees.json").read_text())
    assert g["method"] == "CCU" and g["dataset"] == "digits" and g["field_eps_inf"] == 0.3
    assert set(g["sets"]) >= {"test", "uniform"}
    assert not (store.method_dir(prof, "digits", "Base", res, 0) / "guarantees.json").exists()
    copied = json.loads((ref / prof.label / "digits" / "CCU.guarantees.json").read_text())
    assert copied == g
    capsys.readouterr()
    step = ["--dataset", "digits", "--seed", "0", *common]
    assert cli.main(["evaluate", *step, "--method", "CCU", "--guarantees"]) == cli.EXIT_OK
    assert "share_certified" in capsys.readouterr().out
    assert cli.main(["evaluate", *step, "--method", "Base", "--guarantees"]) == cli.EXIT_USAGE


def test_the_committed_field_table_puts_ours_beside_good():
    """The committed MNIST guarantees (profiles cpu and paper) beside GOOD's Table 1 at the same eps; the
    committed CSV is what :func:`ccu.report.guarantees.field_table` gives (nothing typed by hand)."""
    import pandas as pd

    from ccu import report

    t = shown.field_table()
    assert set(t.eps_inf) == {0.3}
    ours = t[t.source.str.startswith("ours")]
    assert set(ours.ood_set) >= {"FMNIST", "GrCIFAR10", "Uniform"}
    half = ours.GAUC.notna()  # ties 1/2: only where float64 confidences were compared
    assert (ours.GAUC_strict[half] <= ours.GAUC[half] + 1e-9).all()  # ties lose in the strict
    assert ours.GAUC_strict.notna().all()
    good80 = t[(t.method == "GOOD80") & (t.ood_set == "FMNIST")].iloc[0]
    # GOOD counts its clean AUC and its GAUC with ties lost (auroc_conservative)
    assert (
        good80.GAUC_strict == 55.5 and good80.AUC_strict == 99.8 and "2007.08473" in good80.source
    )
    assert pd.isna(good80.GAUC) and pd.isna(good80.AUC)
    # GOOD's own CCU baseline (its published Table 1): GAUC 0 on every set at eps 0.3
    good_ccu = t[t.source.str.startswith("GOOD") & (t.method == "CCU")].set_index("ood_set")
    assert set(good_ccu.index) == {"FMNIST", "EMNIST", "GrCIFAR10", "Uniform"}
    assert (good_ccu.GAUC_strict == 0.0).all() and good_ccu.AUC_strict["EMNIST"] == 92.9
    assert (good_ccu.network == "CCU as GOOD trained it").all()
    csv = report.REFERENCE_RESULTS / "cpu" / "mnist" / "gauc_vs_good.csv"
    saved = pd.read_csv(csv)
    assert len(saved) == len(t) and list(saved.method) == list(t.method)
    assert (saved.GAUC.isna() == t.GAUC.isna()).all()
    assert (saved.AUC_strict.isna() == t.AUC_strict.isna()).all()
    assert ((saved.AUC_strict - t.AUC_strict).abs().fillna(0) < 0.01).all()
    assert ((saved.GAUC - t.GAUC).abs().fillna(0) < 0.01).all()
    assert ((saved.GAUC_strict - t.GAUC_strict).abs().fillna(0) < 0.01).all()
    display = shown.field_display(t)  # GOOD's GAUC (ties lose) never in the ties-1/2 column
    good_row = display[(display.method == "GOOD80") & (display.ood_set == "FMNIST")].iloc[0]
    assert np.isnan(good_row["GAUC, ties 1/2"]) and good_row["GAUC, ties lose"] == 55.5
    assert np.isnan(good_row["AUC, ties 1/2"]) and good_row["AUC, ties lose"] == 99.8
    words = report.legend(display)  # the field's AUC is against OOD sets, not adversarial noise
    assert "against the OOD set" in words and "GAUC:" in words and "adversarial" not in words
    ours_shown = display[display.source.str.startswith("ours")]
    assert (ours_shown["GAUC, ties lose"] == ours.GAUC_strict).all()
    g = shown.committed_guarantees()["CCU mnist (cpu)"]
    assert g["field_eps_inf"] == 0.3 and "/work" not in json.dumps(g)


def test_a_ccu_family_gets_its_own_guarantees(tmp_path):
    """CCU-<family> (here the diagonal mixtures) is certified by its own densities."""
    from ccu.data import load_dataset
    from ccu.run import experiment
    from ccu.run.config import get_profile

    prof = get_profile("smoke", **TINY)
    data = load_dataset("digits", seed=0).subset(prof.n_train)
    run = experiment.run_method("digits", "CCU-diag", prof, 0, "cpu", data=data, root=tmp_path)
    g = guarantees.run_guarantees(run, data)
    assert g["method"] == "CCU-diag" and (run.directory / "guarantees.json").exists()
    assert g["sets"]["uniform"]["share_certified"] > 0.5
    assert steps.guarantees_one(RunSpec("digits", "Base", prof, 0, "cpu"), tmp_path) is None


def test_the_gauc_compares_the_bounds_with_the_float64_models_confidences():
    """The bounds are about the float64 model. Compared with float32 confidences, which round
    1 - 1e-9 up to 1, the trivial bound 1 tied with them and the GAUC with ties one half gave
    half a success for no guarantee (25 % at GOOD's eps in the committed MNIST run, where every
    bound was 1). The float64 model's confidences lose to the bound 1."""
    from helpers import SaturatedClassifier

    metric = ccu.Mahalanobis.identity(2)
    gin = ccu.GaussianMixture(torch.zeros(1, 2), torch.tensor([0.0]), torch.zeros(1), metric)
    gout = ccu.GaussianMixture(
        torch.zeros(1, 2), torch.tensor([2 * math.log(2.0)]), torch.zeros(1), metric
    )
    model = ccu.CCU(SaturatedClassifier(10, scale=200.0), gin, gout, 10, lam=4e-9).double()
    test = 0.01 * torch.randn(5, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    conf64 = ccu.core.bounds.float64_confidence(model, test)
    assert bool((conf64 < 1).all()) and bool((conf64.float() == 1).all())  # float32 rounds up
    out = guarantees.certify_sets(model, {"test": test, "ood": test.clone()}, None, eps_inf=(10.0,))
    bound = ccu.lp_confidence_bound(model, test, 10.0).numpy()
    assert (bound == 1.0).all()  # nothing is guaranteed in these balls
    assert lp.guaranteed_auc(conf64.float().double().numpy(), bound, "half") == 0.5  # the old way
    assert out["sets"]["ood"]["gauc_inf"]["10"]["gauc"] == 0.0
    assert out["confidence_in"] == "float64 model"
    # a file from before (no confidence_in) shows no ties-1/2 GAUC; the strict one stands
    rows = shown.summary_rows(dict(out, field_eps_inf=10.0))
    assert rows[1]["gauc_field_eps"] == out["sets"]["ood"]["gauc_inf"]["10"]["gauc_strict"]
    assert shown.ties_half_shown(out) and not shown.ties_half_shown({"sets": {}})


def test_the_certificate_tables_legend_defines_its_own_aucs():
    """Its AUCs are about OOD points' balls (certified AUC, GAUC), not Table 1's adversarial
    noise: the legend under it says so."""
    import json

    from ccu import report

    path = report.REFERENCE_RESULTS / "cpu" / "mnist" / "CCU.guarantees.json"
    table = shown.certificate_table(json.loads(path.read_text()))
    words = report.legend(table)
    assert "certified AUC: the in-distribution" in words and "GAUC: " in words
    assert "adversarial noise" not in words
