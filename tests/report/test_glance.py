"""Reproduction at a glance (:mod:`ccu.report.glance`) on a fake reference-results tree."""

import json

import numpy as np
import pytest

from ccu import report
from ccu.report import glance


def _write(root, profile, dataset, method, auroc, te=0.01, sr=0.0, auc=1.0, min_conf=0.3):
    d = root / profile / dataset
    d.mkdir(parents=True, exist_ok=True)
    metrics = {
        "test_error": te,
        "n_test": 1000,
        "min_confidence": min_conf,
        "n_below_1.1_over_M": 2,
        "ood": {"fmnist": {"auroc": auroc, "aupr_in": auroc}, "emnist": {"skipped": "offline"}},
    }
    config = {"seed": 0, "commit": f"c0ffee{profile}", "ccu_version": "9.9", "device": "cpu"}
    config["profile"] = {"name": profile}
    (d / f"{method}.metrics.json").write_text(json.dumps(metrics))
    (d / f"{method}.config.json").write_text(json.dumps(config))
    t1 = json.loads((d / "table1.json").read_text()) if (d / "table1.json").exists() else {}
    t1.setdefault("methods", {})[method] = {"TE": te, "SR": sr, "AUC": auc}
    t1["device_name"] = "fake device"
    (d / "table1.json").write_text(json.dumps(t1))


def _paper(table, **keys):
    t = report.paper_table(table)
    for k, v in keys.items():
        t = t[t[k] == v]
    return float(t.value.iloc[0])


def test_the_best_profile_per_method_and_the_differences(tmp_path):
    _write(tmp_path, "cpu", "mnist", "Base", 0.90)
    _write(tmp_path, "cpu", "mnist", "CCU", 0.91)
    _write(tmp_path, "cpu", "mnist-offline", "OE", 0.92)
    _write(tmp_path, "paper", "mnist", "CCU", 0.99, min_conf=0.35)
    comp = glance.comparison(tmp_path)
    row = comp[(comp.dataset == "MNIST") & (comp.table == "Table 2") & (comp.key == "FMNIST")]
    ccu_row = row[row.method == "CCU"].iloc[0]
    assert ccu_row.profile == "paper" and ccu_row.ours == pytest.approx(99.0)
    paper = _paper("table2_ood_auc", in_dataset="MNIST", ood_dataset="FMNIST", method="CCU")
    assert ccu_row.paper == paper and ccu_row["diff"] == pytest.approx(99.0 - paper)
    base = row[row.method == "Base"].iloc[0]
    assert base.profile == "cpu" and base.run == "mnist" and base.ours == pytest.approx(90.0)
    oe = row[row.method == "OE"].iloc[0]
    assert oe.run == "mnist-offline" and oe.commit.startswith("c0ffee")
    assert np.isnan(row[row.method == "MCD"].iloc[0].ours)  # not run: no number of ours
    emnist = comp[(comp.table == "Table 2") & (comp.key == "EMNIST") & (comp.method == "CCU")]
    assert np.isnan(emnist.iloc[0].ours)  # skipped set: no number
    te = comp[(comp.table == "Table 1") & (comp.key == "TE") & (comp.method == "CCU")]
    assert te[te.dataset == "MNIST"].iloc[0].ours == pytest.approx(1.0)
    ps = comp[(comp.table == "P_Stats") & (comp.dataset == "MNIST")].set_index("key")
    assert ps.loc["min p(y|x) %"].ours == pytest.approx(35.0)
    assert ps.loc["% < 1.1/M"].ours == pytest.approx(0.2)
    s = glance.summary(comp)
    assert 0 < s["n_compared"] < s["n_paper"]
    hm = glance.heatmap_frame(comp, "MNIST")
    assert list(hm.columns) == ["Base", "OE", "CCU"]  # methods with a number, paper order
    # the panel mixes runs (cpu mnist, cpu mnist-offline, paper mnist): each column says which
    fig = glance.heatmap_figure(comp)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["Base · cpu", "OE · cpu, mnist-offline", "CCU · paper"]


def test_status_matrix_and_it_updates_when_results_are_committed(tmp_path):
    _write(tmp_path, "cpu", "mnist", "CCU", 0.91)
    st = glance.status_matrix(tmp_path)
    assert st.loc["MNIST", "CCU"] == "cpu"
    assert st.loc["MNIST", "Base"] == "not run"
    assert st.loc["SVHN", "CCU"] == "no offline copy"
    assert st.loc["CIFAR10", "CCU"] == "not run"  # the JPEG copy is offline: it could be run
    _write(tmp_path, "paper-e30", "mnist", "CCU", 0.95)
    _write(tmp_path, "cpu", "cifar10-offline", "Base", 0.8)
    st = glance.status_matrix(tmp_path)
    assert st.loc["MNIST", "CCU"] == "reduced (paper-e30)"
    assert st.loc["CIFAR10", "Base"] == "cpu (cifar10-offline)"
    assert glance.paper_status(tmp_path).startswith("No run at the paper's full protocol")
    _write(tmp_path, "paper", "mnist", "CCU", 0.99)
    assert glance.status_matrix(tmp_path).loc["MNIST", "CCU"] == "paper protocol"
    assert list(glance.status_matrix(tmp_path).index) == list(glance.PAPER_DATASETS)
    # the page's first sentence says how far the paper's grid is (a partial grid as partial)
    assert glance.paper_status(tmp_path).startswith(
        "1 of the 4 committed runs follows the paper's full protocol (MNIST: 1 of the 11 "
        "methods so far, the others not yet run) and comes first"
    )


def test_the_papers_layout_one_grid_per_run_never_mixing_runs(tmp_path):
    """Table 1 as the paper prints it (rows TE / SR / AUC, columns the methods in its order),
    each cell ours over the paper's; a method only another run has is "—" in this run's grid."""
    _write(tmp_path, "cpu", "mnist", "Base", 0.90, te=0.012, sr=1.0, auc=0.05)
    _write(tmp_path, "cpu", "mnist", "CCU", 0.91)
    _write(tmp_path, "paper", "mnist", "OE", 0.99)
    runs = {r["profile"]: r for r in glance.every_run(tmp_path)}
    assert list(runs) == ["paper", "cpu"]  # the paper's protocol first
    grid = glance.paper_grid(runs["cpu"], "Table 1")
    assert list(grid.index) == ["TE", "SR", "AUC"]
    assert (
        list(grid.columns)
        == report.paper_table("table1_adversarial_noise")
        .query("dataset == 'MNIST'")
        .method.unique()
        .tolist()
    )  # every method of the paper's Table 1, in its order
    te_paper = _paper("table1_adversarial_noise", dataset="MNIST", method="Base", metric="TE")
    assert grid.loc["TE", "Base"] == f'1.2<br><span class="ccu-paper">{te_paper:.1f}</span>'
    assert grid.loc["TE", "OE"].startswith("—<br>")  # OE is in the paper run only: not here
    assert glance.paper_grid(runs["paper"], "Table 1").loc["TE", "OE"].startswith("1.0<br>")
    t2 = glance.paper_grid(runs["cpu"], "Table 2")
    assert "FMNIST" in t2.index and t2.loc["FMNIST", "CCU"].startswith("91.0<br>")
    stats = glance.paper_grid(runs["cpu"], "P_Stats")
    assert list(stats.columns) == ["CCU"] and stats.loc["# < 1.1/M", "CCU"].startswith("2<br>")
    html = glance.grid_html(grid, "Table 1")
    assert 'class="ccu-grid"' in html and "Table 1" in html
    with pytest.raises(ValueError, match="table must be one of"):
        glance.paper_grid(runs["cpu"], "Table 9")


def test_every_run_in_plain_words_with_the_papers_protocol_first(tmp_path):
    _write(tmp_path, "cpu", "mnist-offline", "CCU", 0.91)
    words = glance.runs_in_plain_words(tmp_path)
    assert words.index[0] == "the paper" and words.loc["the paper", "epochs"] == "100"
    (title,) = words.index[1:]
    assert title.startswith("MNIST (stand-in: mnist-offline), reduced profile 'cpu'")
    assert "8,000 train / 2,000 test" in words.loc[title, "data (train / test images)"]
    assert glance.profile_words("paper-e30") == "the paper's protocol cut to 30 epochs"


def test_the_runs_in_plain_words_say_their_cifar10_images_are_the_jpeg_copy():
    """The data README: results on the JPEG copy of CIFAR-10 are near, not equal, to results on
    the original; say so wherever they are shown. Every committed MNIST run trained against
    grey CIFAR-10 from it (its description alone did not say)."""
    words = glance.runs_in_plain_words()["training out-distribution"]
    mnist = [k for k in words.index if k.startswith("MNIST")]
    assert mnist and all("from CIFAR-10's JPEG copy" in words[k] for k in mnist)
    assert "JPEG" not in words["the paper"]

    for run in glance.every_run():  # and under each MNIST run's Table 2 and AUPR grids
        if run["dataset"].startswith("mnist"):
            assert "CIFAR-10's JPEG copy" in glance.grid_note(run, "Table 2")
            assert "JPEG" not in glance.grid_note(run, "Table 1")


def test_acet2_cells_show_the_papers_appendix_numbers(tmp_path):
    """ACET2 is not in the paper's Tables 1 and 2 but in its appendix (Tables 4, 5): an ACET2
    cell shows that number under ours, in the grids and the comparison alike."""
    _write(tmp_path, "cpu", "mnist", "ACET2", 0.97, te=0.007, sr=0.0, auc=1.0)
    (run,) = glance.every_run(tmp_path)
    t5 = report.paper_table("table_acet2_adversarial_noise").query("dataset == 'MNIST'")
    te_paper = float(t5[t5.metric == "TE"].ACET2.iloc[0])
    grid = glance.paper_grid(run, "Table 1")
    assert grid.loc["TE", "ACET2"] == f'0.7<br><span class="ccu-paper">{te_paper:.1f}</span>'
    t4 = report.paper_table("table_acet2_ood_auc").query("in_dataset == 'MNIST'")
    fmnist = float(t4[t4.ood_dataset == "FMNIST"].ACET2.iloc[0])
    t2 = glance.paper_grid(run, "Table 2")
    assert t2.loc["FMNIST", "ACET2"] == f'97.0<br><span class="ccu-paper">{fmnist:.1f}</span>'
    comp = glance.comparison(tmp_path)
    acet2 = comp[(comp.method == "ACET2") & (comp.dataset == "MNIST")].set_index(["table", "key"])
    assert acet2.loc[("Table 1", "TE"), "paper"] == te_paper
    assert acet2.loc[("Table 2", "FMNIST"), "diff"] == pytest.approx(97.0 - fmnist)
