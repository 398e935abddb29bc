"""Tables over seeds (mean ± sd) built from a results directory written by hand."""

import math
import shutil

import pytest

from ccu.report import aggregate
from ccu.store import results as store


def _write_seed(root, seed, sr_base, auroc_ccu, min_conf):
    for method, te in (("Base", 0.02), ("CCU", 0.03)):
        d = store.method_dir("smoke", "mnist-offline", method, root, seed)
        auroc = 0.6 if method == "Base" else auroc_ccu
        metrics = {
            "test_error": te,
            "n_test": 200,
            "min_confidence": min_conf,
            "n_below_1.1_over_M": 2 * (seed + 1),
            "ood": {
                "uniform": {"auroc": auroc, "aupr_in": auroc},
                "grcifar10": {"skipped": "no data"},
            },
        }
        store.write_json(d / "metrics.json", metrics)
        store.write_json(d / "config.json", {"method": method})
    table1 = {
        "n_certified": 10 + seed,
        "median_radius": 1.0,
        "certified_auc": 0.5,
        "methods": {
            "Base": {"TE": 0.02, "SR": sr_base, "AUC": 0.5},
            "CCU": {"TE": 0.03, "SR": 0.0, "AUC": 1.0},
        },
    }
    store.write_json(
        store.adversarial_dir("smoke", "mnist-offline", root, seed) / "table1.json", table1
    )


def test_mean_and_sample_sd_over_seeds(tmp_path):
    _write_seed(tmp_path, 0, 0.2, 0.9, 0.1)
    _write_seed(tmp_path, 3, 0.4, 1.0, 0.2)
    assert aggregate.seeds_present("smoke", "mnist-offline", tmp_path) == [0, 3]
    tables = aggregate.build_tables("smoke", "mnist-offline", tmp_path)
    t1 = tables["table1"].set_index(["method", "key"])
    row = t1.loc[("Base", "SR")]
    assert row["mean"] == pytest.approx(30.0)
    assert row["sd"] == pytest.approx(math.sqrt(2) * 10)  # ddof=1: |40 - 20| / sqrt(2)
    assert row["n"] == 2
    assert t1.loc[("CCU", "SR")]["sd"] == 0.0
    assert t1.loc[("Base", "SR")]["paper"] == pytest.approx(100.0)  # the paper's MNIST Base SR
    t2 = tables["table2_auroc"].set_index(["method", "key"])
    assert t2.loc[("CCU", "Uniform")]["mean"] == pytest.approx(95.0)
    assert ("CCU", "GrCIFAR10") not in t2.index  # skipped in every seed: no row
    p = tables["p_stats"].set_index("key")
    assert p.loc["# < 1.1/M", "mean"] == pytest.approx(5.0)  # 2 and 8
    assert p.loc["min p(y|x) %", "mean"] == pytest.approx(15.0)
    shown = aggregate.wide(tables["table1"])
    assert shown.loc["SR", ("Base", "ours (mean ± sd)")] == "30.0 ± 14.1"
    written, _ = aggregate.write_tables("smoke", "mnist-offline", tmp_path)
    md = (store.tables_dir("smoke", "mnist-offline", tmp_path) / "tables.md").read_text()
    assert "30.0 ± 14.1" in md and "seeds [0, 3]" in md
    assert "min p(y\\|x) %" in md  # escaped: the row keeps its columns
    for line in md.splitlines():
        if line.startswith("| min p"):
            assert line.replace("\\|", "").count("|") == 4
    assert {p.name for p in written} >= {"table1.csv", "table2_auroc.csv", "tables.md"}


def test_one_seed_has_no_sd_and_missing_results_are_explained(tmp_path):
    _write_seed(tmp_path, 0, 0.2, 0.9, 0.1)
    tables = aggregate.build_tables("smoke", "mnist-offline", tmp_path, seeds=[0])
    row = tables["table1"].set_index(["method", "key"]).loc[("Base", "SR")]
    assert row["n"] == 1 and math.isnan(row["sd"])
    assert aggregate.format_mean_sd(row["mean"], row["sd"]) == "20.0"
    assert aggregate.format_mean_sd(float("nan"), float("nan")) == "–"
    with pytest.raises(aggregate.NoResultsError, match="seed 5"):
        aggregate.build_tables("smoke", "mnist-offline", tmp_path, seeds=[0, 5])
    with pytest.raises(aggregate.NoResultsError, match="ccu train"):
        aggregate.collect("smoke", "mnist-offline", tmp_path, methods=["Base", "OE"])
    with pytest.raises(aggregate.NoResultsError, match="no results"):
        aggregate.build_tables("smoke", "digits", tmp_path)


def test_seed_directories_are_side_by_side(tmp_path):
    a = store.method_dir("smoke", "digits", "CCU", tmp_path, seed=0)
    b = store.method_dir("smoke", "digits", "CCU", tmp_path, seed=1)
    assert a != b and a.parent.name == "seed0" and b.parent.name == "seed1"
    assert store.adversarial_dir("smoke", "digits", tmp_path, 2).parent.name == "seed2"
    with pytest.raises(ValueError, match="non-negative integer"):
        store.seed_dir("smoke", "digits", -1, tmp_path)


def test_tables_of_a_subset_never_overwrite_or_mix_with_every_methods(tmp_path, capsys):
    import json

    from ccu import cli

    tiny = {"epochs": 1, "n_train": 200, "n_centres": 4, "attack_steps": 2, "attack_restarts": 1}
    common = ["--dataset", "digits", "--results", str(tmp_path), "--device", "cpu",
              "--no-progress", "--overrides", json.dumps(tiny)]  # fmt: skip
    assert cli.main(["attack", *common, "--method", "Base", "CCU"]) == cli.EXIT_OK
    assert cli.main(["tables", *common]) == cli.EXIT_OK
    tables = next(tmp_path.glob("*/digits/tables"))
    every = {p.name: p.read_bytes() for p in tables.glob("*.csv")}
    assert len(every) >= 2  # the comparisons below are not vacuous
    assert cli.main(["tables", *common, "--method", "CCU", "Base"]) == cli.EXIT_OK  # every one
    assert {p.name: p.read_bytes() for p in tables.glob("*.csv")} == every
    assert not any(p.is_dir() for p in tables.iterdir())
    assert cli.main(["tables", *common, "--method", "Base"]) == cli.EXIT_OK
    assert {p.name: p.read_bytes() for p in tables.glob("*.csv")} == every  # untouched
    subset = tables / "methods-Base"
    for name in ("table1.csv", "table2_auroc.csv"):
        text = (subset / name).read_text()
        assert "Base" in text and "CCU" not in text, name  # Table 1 like the others: Base only


def test_a_stand_in_sets_row_over_seeds_keeps_the_papers_value(tmp_path):
    """The Tiny ImageNet test set stands in for the paper's Imagenet- (its row says so): the
    table over seeds looked the paper's number up by another label and showed none."""
    for seed in (0, 1):
        d = store.method_dir("smoke", "cifar10-offline", "Base", tmp_path, seed)
        label = "Imagenet- (Tiny ImageNet test)"
        metrics = {
            "test_error": 0.1,
            "n_test": 100,
            "ood": {"imagenet-": {"auroc": 0.8 + seed / 10, "aupr_in": 0.9}},
            "ood_sources": {"imagenet-": {"source": "tiny", "label": label, "n": 100}},
        }
        store.write_json(d / "metrics.json", metrics)
        store.write_json(d / "config.json", {"method": "Base"})
    tables = aggregate.build_tables("smoke", "cifar10-offline", tmp_path, seeds=[0, 1])
    for key, paper in (("table2_auroc", 87.5), ("table_aupr", None)):
        row = tables[key].set_index(["method", "key"]).loc[("Base", "Imagenet-")]
        if paper is not None:
            assert row["paper"] == pytest.approx(paper)  # the paper's CIFAR10 Base, Table 2
        assert not math.isnan(row["paper"])


def test_a_seed_attacked_before_is_counted_as_the_paper_counts_ties(tmp_path):
    """A mean over seeds mixed a seed's strict AUC (attacked before 0.6.0) with the others'
    ties-one-half AUCs; the older row is now brought up to date from the seed's scores."""
    import numpy as np

    from ccu.core import evaluate as ev

    _write_seed(tmp_path, 0, 0.2, 0.9, 0.1)
    test, worst = np.array([0.0, 0.0, -1.0]), np.array([0.0, -2.0])
    d = store.method_dir("smoke", "mnist-offline", "Base", tmp_path, 0)
    store.write_npz(d / "scores.npz", test=test)
    adv = store.adversarial_dir("smoke", "mnist-offline", tmp_path, 0)
    store.write_npz(adv / "adversarial.npz", Base_worst_score=worst)
    tables = aggregate.build_tables("smoke", "mnist-offline", tmp_path, seeds=[0])
    row = tables["table1"].set_index(["method", "key"]).loc[("Base", "AUC")]
    assert row["mean"] == pytest.approx(100 * ev.attack_auc(test, worst))  # not the saved 0.5
    ccu_row = tables["table1"].set_index(["method", "key"]).loc[("CCU", "AUC")]
    assert ccu_row["mean"] == pytest.approx(100.0)  # no scores to count again: as saved


def test_a_cell_over_fewer_seeds_than_the_table_says_how_many(tmp_path):
    """The heading says "mean ± sd over seeds [0, 1, 2]": a method one seed lacks must not read
    as averaged over all three."""
    for seed in (0, 1, 2):
        _write_seed(tmp_path, seed, 0.2 + 0.1 * seed, 0.9, 0.1)
    # CCU's run of seed 2 is gone: its cells average two seeds
    shutil.rmtree(store.method_dir("smoke", "mnist-offline", "CCU", tmp_path, 2))
    tables = aggregate.build_tables("smoke", "mnist-offline", tmp_path)
    shown = aggregate.wide(tables["table2_auroc"])
    assert shown.loc["Uniform", ("CCU", "ours (mean ± sd)")].endswith("(n=2)")
    assert "(n=" not in shown.loc["Uniform", ("Base", "ours (mean ± sd)")]
    aggregate.write_tables("smoke", "mnist-offline", tmp_path)
    md = (store.tables_dir("smoke", "mnist-offline", tmp_path) / "tables.md").read_text()
    assert "seeds [0, 1, 2]" in md and "(n=2)" in md
