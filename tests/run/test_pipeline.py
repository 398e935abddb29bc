"""Metrics, the method interface, results on disk and the adversarial-noise evaluation."""

import json

import numpy as np
import pytest
import torch

import ccu
from ccu import report
from ccu.core import evaluate as ev
from ccu.data import load_dataset
from ccu.methods import get_method, ordered
from ccu.run import adversarial_noise as noise
from ccu.run import experiment


def test_metrics_against_hand_computation():
    s_in, s_out = [3.0, 2.0, 1.0], [2.0, 0.0]
    # pairs (in > out): 3>2, 3>0, 2>0, 1>0 = 4; tie 2=2 counts 1/2 for AUROC, 0 for strict
    assert ev.auroc(s_in, s_out) == pytest.approx(4.5 / 6)
    assert ev.strict_auc(s_in, s_out) == pytest.approx(4 / 6)
    assert ev.strict_auc([1.0, 1.0], [1.0]) == 0.0  # saturated scores are failures
    assert ev.auroc([1.0, 1.0], [1.0]) == 0.5
    # FPR@95: the 5% quantile of [0..99] is 4.95; out-scores >= it
    assert ev.fpr_at_95(np.arange(100.0), [4.0, 5.0, 50.0]) == pytest.approx(2 / 3)
    # AUPR-In: ranking in, in, out -> precision 1 at both in-points
    assert ev.aupr_in([3.0, 2.0], [1.0]) == pytest.approx(1.0)
    # AUPR-Out: out-set positive with negated scores; out ranked first -> 1
    assert ev.aupr_out([3.0, 2.0], [1.0]) == pytest.approx(1.0)
    # the in-point ranks first: precision 1/2 and 2/3 at the two out-points
    assert ev.aupr_out([1.0], [3.0, 2.0]) == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert ev.success_rate([0.5, 0.9, 0.2], [0.1, 0.5, 0.9]) == pytest.approx(2 / 3)  # median 0.5
    assert ev.classification_error([1, 2, 3], [1, 0, 3]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="NaN"):
        ev.auroc([np.nan], [1.0])
    with pytest.raises(ValueError, match="non-empty"):
        ev.auroc([], [1.0])


def test_method_registry_and_order():
    assert ordered(["CCU", "Base"]) == ["Base", "CCU"]
    with pytest.raises(ValueError, match="unknown method 'XYZ'"):
        get_method("XYZ")


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    data = load_dataset("digits").subset(800)
    runs = {
        m: experiment.run_method("digits", m, "smoke", data=data, root=root)
        for m in ("Base", "CCU")
    }
    for r in runs.values():
        r.method.progress = False
    return root, data, runs


def test_runs_write_results_and_separate_noise(digits_runs):
    root, data, runs = digits_runs
    for name, run in runs.items():
        d = root / "smoke" / "digits" / "seed0" / name
        for f in ("config.json", "model.pt", "scores.npz", "metrics.json", "checkpoint.pt"):
            assert (d / f).exists(), f
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["data_checksum"] == data.checksum() and cfg["ccu_version"] == ccu.__version__
        assert run.metrics["test_error"] < 0.2
        # sign check: every score ranks the in-distribution above easily separable noise
        assert run.metrics["ood"]["uniform"]["auroc"] > 0.5, name
        assert run.scores["test"].shape == (len(data.test_x),)


def test_rerun_loads_and_retrain_retrains(digits_runs):
    root, data, runs = digits_runs
    again = experiment.run_method("digits", "CCU", "smoke", data=data, root=root)
    assert again.loaded
    x = data.test_x[:50]
    torch.testing.assert_close(again.method.score(x), runs["CCU"].method.score(x))
    other_seed = experiment.run_method("digits", "Base", "smoke", seed=1, data=data, root=root)
    assert not other_seed.loaded  # a different config is not mistaken for the saved run


def test_saved_models_load_with_weights_only(digits_runs):
    root, data, runs = digits_runs
    state = torch.load(root / "smoke" / "digits" / "seed0" / "CCU" / "model.pt", weights_only=True)
    m = get_method("CCU")(data.spec, ccu.train_settings("digits"), ccu.get_profile("smoke"))
    m.load_state_dict(state)
    x = data.test_x[:20]
    torch.testing.assert_close(m.score(x), runs["CCU"].method.score(x))
    with pytest.raises(ValueError, match="not 'Base'"):
        get_method("Base")(
            data.spec, ccu.train_settings("digits"), ccu.get_profile("smoke")
        ).load_state_dict(state)


def test_adversarial_noise_table1(digits_runs):
    root, data, runs = digits_runs
    adv = noise.adversarial_noise(runs, data, "smoke", root=root)
    s = adv.summary
    assert s["ccu_bound_violations"] == 0 and s["ccu_points_outside_balls"] == 0
    assert s["n_certified"] + s["n_uncertified"] == s["n_centres"] == len(adv.radii)
    assert s["n_certified"] == int(adv.certified.sum()) > 0
    ok = adv.certified
    assert np.isnan(adv.bound[~ok]).all() and np.isfinite(adv.bound[ok]).all()
    worst_ccu = np.exp(adv.worst_score["CCU"])
    assert (worst_ccu <= adv.bound[ok] + 1e-6).all()
    assert adv.methods["Base"]["SR"] >= adv.methods["CCU"]["SR"]
    # CCU's attack leaves its centres (its float32 confidence is flat there; the surrogate climbs)
    assert adv.methods["CCU"]["max_distance_over_radius"] > 0.5
    base = adv.methods["Base"]  # the refinement only adds: SR up, AUC down, from the paper's
    assert base["refine_steps"] > 0 and base["SR"] >= base["sr_paper_attack"]
    assert base["AUC"] <= base["auc_paper_attack"]
    for name, r in adv.methods.items():
        x = adv.worst_x[name]
        assert len(x) == r["n_attacked"] == s["n_certified"]
        assert x.min() >= 0 and x.max() <= 1
        assert r["max_distance_over_radius"] <= 1.0
    # it returns what it saved
    again = noise.AdversarialResult.load(root / "smoke" / "digits" / "seed0" / "adversarial")
    assert again.summary == adv.summary and np.array_equal(again.radii, adv.radii, equal_nan=True)
    table = report.attack_table(again.summary, "digits")
    assert list(table.columns.get_level_values(0).unique()) == ["Base", "CCU"]
    for name, r in adv.methods.items():  # the paper's AUC (ties one half), the strict beside it
        test, worst = runs[name].scores["test"], adv.worst_score[name]
        assert r["auc_ties"] == "one half" and r["AUC"] == ev.auroc(test, worst)
        assert r["AUC_strict"] == ev.strict_auc(test, worst) <= r["AUC"]
    assert report.ties_as_failures(adv.summary) == [] and report.ties_note(adv.summary) == ""
    with pytest.raises(ValueError, match="needs a trained CCU run"):
        noise.adversarial_noise({"Base": runs["Base"]}, data, "smoke", root=root)


def test_table1s_auc_counts_ties_one_half_as_the_papers_code_does():
    """The paper's authors compute Table 1's AUC with scikit-learn's roc_auc_score of the
    log-confidences (``gen_attack_stats.py``): a tie counts one half. Float32 log-confidences
    saturate at exactly 0, so ties are common: counted as failures, OE's MNIST AUC was 0.5 %
    against the paper's 35.2 %. A row saved before is brought up to date from its scores."""
    test = np.array([0.0, 0.0, 0.0, -1.0])  # three saturated test images
    worst = np.array([0.0, -2.0])  # one saturated worst point
    # pairs: every test image beats -2 (4), the three saturated ones tie with 0 (3 x 1/2)
    assert ev.attack_auc(test, worst) == pytest.approx(5.5 / 8)
    assert ev.strict_auc(test, worst) == pytest.approx(4 / 8)
    old = {"TE": 0.1, "SR": 0.5, "AUC": 4 / 8}  # a row attacked before: the strict AUC
    new = noise.with_paper_auc(old, test, worst)
    assert new["AUC"] == pytest.approx(5.5 / 8) and new["AUC_strict"] == 4 / 8
    assert new["auc_ties"] == "one half" and old == {"TE": 0.1, "SR": 0.5, "AUC": 4 / 8}
    assert noise.with_paper_auc(new, test, worst[:1]) is new  # up to date: as it is
    t1 = {"methods": {"Base": old, "CCU": new}}
    assert report.ties_as_failures(t1) == ["Base"]
    assert report.ties_note(t1).startswith("AUC of Base: a tie")


def test_report_tables_use_the_paper_numbers():
    metrics = {
        "Base": {"ood": {"uniform": {"auroc": 0.5, "aupr_in": 0.6}}},
        "CCU": {"ood": {"uniform": {"auroc": 1.0, "aupr_in": 1.0}}},
    }
    t = report.ood_table(metrics, "mnist-offline", "auroc")
    assert t.loc["Uniform", ("CCU", "ours")] == 100.0
    paper = report.paper_table("table2_ood_auc")
    want = paper[
        (paper.in_dataset == "MNIST") & (paper.ood_dataset == "Uniform") & (paper.method == "CCU")
    ]
    assert t.loc["Uniform", ("CCU", "paper")] == float(want.value.iloc[0])
    row = report.p_stats_row(
        {"min_confidence": 0.5, "n_below_1.1_over_M": 4}, "mnist-offline", 2000
    )
    assert row.loc["ours", "% < 1.1/M"] == 0.2 and row.loc["paper", "min p(y|x) %"] == 33.08


def test_acet2_paper_numbers_come_from_the_appendix_tables():
    t1 = {"methods": {"ACET2": {"TE": 0.01, "SR": 0.5, "AUC": 0.5}}}
    t = report.attack_table(t1, "cifar10-offline")
    acet2 = report.paper_table("table_acet2_adversarial_noise")
    want = acet2[(acet2.dataset == "CIFAR10") & (acet2.metric == "SR")].ACET2.iloc[0]
    assert t.loc["SR", ("ACET2", "paper")] == float(want)
    metrics = {"ACET2": {"ood": {"noise": {"auroc": 0.9}}}}
    t = report.ood_table(metrics, "mnist-offline", "auroc")
    auc = report.paper_table("table_acet2_ood_auc")
    want = auc[(auc.in_dataset == "MNIST") & (auc.ood_dataset == "Noise")].ACET2.iloc[0]
    assert t.loc["Noise", ("ACET2", "paper")] == float(want)


def test_a_checkpoint_of_another_configuration_is_not_resumed(tmp_path):
    data = load_dataset("digits").subset(200)
    two = ccu.get_profile("smoke", epochs=2)
    three = ccu.get_profile("smoke", epochs=3)
    experiment.run_method("digits", "Base", two, data=data, root=tmp_path)
    # a different configuration must start over, not resume (or choke on) the old checkpoint
    run = experiment.run_method("digits", "Base", three, data=data, root=tmp_path)
    assert not run.loaded and len(run.config["history"]["loss"]) == 3


def test_the_run_record_travels_whole_from_the_cli_to_the_trainer(tmp_path, monkeypatch):
    """``ccu train`` builds one :class:`ccu.store.records.RunSpec`; the steps hand that very object to
    :func:`ccu.run.experiment.run_spec`, which hands Base's run of a post-hoc method the same
    record with its method changed (:meth:`RunSpec.with_method`): nothing splits it into loose
    arguments and rebuilds it on the way (the issue: 9 arguments, then 14 parameters)."""
    from ccu import cli
    from ccu.run import steps

    seen = []
    real = experiment.run_spec

    def spy(spec, *args, **kwargs):
        seen.append(spec)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(experiment, "run_spec", spy)
    made = []
    real_train_one = steps.train_one
    monkeypatch.setattr(steps, "train_one", lambda spec, *a, **k: made.append(spec)
                        or real_train_one(spec, *a, **k))  # fmt: skip
    # the dataset's registry record is looked up twice: to scale the profile to its network
    # (before any data is loaded), and to load the data, whose record then goes along (the
    # trainer reads data.spec.settings); it was looked up 3 times (4 on smoke) by name
    from ccu.data import registry
    from ccu.run import config

    lookups = []
    real_spec = registry.get_spec

    def spec_spy(name):
        lookups.append(name)
        return real_spec(name)

    monkeypatch.setattr(registry, "get_spec", spec_spy)
    monkeypatch.setattr(config, "get_spec", spec_spy)
    argv = ["train", "--dataset", "digits", "--method", "ODIN", "--profile", "smoke",
            "--overrides", '{"epochs": 1}', "--results", str(tmp_path), "--device", "cpu",
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    assert len(made) == 1 and seen[0] is made[0]  # the CLI's record itself, not a copy
    assert [s.method for s in seen] == ["ODIN", "Base"]
    assert seen[1] == made[0].with_method("Base")
    assert lookups == ["digits", "digits"]  # the profile's scale, then the data (once for both)


def test_a_noisy_scores_worst_points_are_scored_once_more():
    """MCD's score draws new dropout masks at every call: the attack's best of ~restarts x
    steps draws was ~4 standard deviations above what one draw at the same point gives (the
    test images get one draw). The points are now scored once more, as the paper's authors
    score the final point."""

    class Noise:  # a score that is pure noise, the same at every point
        device, stochastic_score = torch.device("cpu"), True

        def score(self, x):
            return torch.randn(len(x), dtype=x.dtype) + 0 * x.reshape(len(x), -1).sum(1)

        def attack_surrogate(self):
            return None

    metric = ccu.Mahalanobis.identity(4)
    centres = torch.full((40, 4), 0.5)
    radii = torch.full((40,), 0.1, dtype=torch.float64)
    res, _ = noise.attack_method(Noise(), centres, radii, metric, steps=30, restarts=5)
    assert abs(float(res.score.mean())) < 0.6  # one draw each: mean 0, sd 1/sqrt(40)
    Noise.stochastic_score = False  # as before: the best of 155 draws per centre
    biased, _ = noise.attack_method(Noise(), centres, radii, metric, steps=30, restarts=5)
    assert float(biased.score.mean()) > 2.0
    assert get_method("MCD").stochastic_score and not get_method("Base").stochastic_score


def test_a_noisy_score_keeps_one_draw_where_the_refinement_left_the_point():
    class Noisy:  # the pixel sum, noisy: the refinement moves some centres, not others
        device, stochastic_score = torch.device("cpu"), True

        def score(self, x):
            flat = x.reshape(len(x), -1)
            return flat.sum(1) + 0.05 * torch.randn(len(x), dtype=x.dtype)

        def attack_surrogate(self):
            return None

    metric = ccu.Mahalanobis.identity(4)
    centres = torch.cat([torch.full((20, 4), 0.5), torch.ones(20, 4)])  # the last at the top
    radii = torch.full((40,), 0.3, dtype=torch.float64)
    res, _ = noise.attack_method(Noisy(), centres, radii, metric, 5, 2, refine_steps=5)
    same = (res.x_unrefined == res.x).flatten(1).all(dim=1)
    assert bool(same.any()) and not bool(same.all())
    torch.testing.assert_close(res.score[same], res.score_unrefined[same], rtol=0, atol=0)
