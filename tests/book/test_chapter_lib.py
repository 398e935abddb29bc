"""The computations behind the chapters' prose, figures and tables (ccu.book.chapter, plots, report;
the guarantees the prose checks: tests/book/test_book_checks.py)."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import random_ccu  # noqa: E402

import ccu  # noqa: E402
from ccu import report
from ccu.book import (
    chapter,  # noqa: E402
    plots,
)
from ccu.methods import ordered  # noqa: E402
from ccu.run import adversarial_noise as noise  # noqa: E402

BASE, CCU = "Base (ReLU network)", "CCU"


def test_setup_chapter_validates_and_loads():
    data, prof, settings, methods = chapter.setup_chapter(
        "moons", "smoke", 0, "cpu", {"n_train": 100}, ["CCU", "Base"], verbose=False
    )
    assert len(data.train_x) == 100 and prof.n_train == 100 and prof.name == "smoke-n100"
    assert methods == ["Base", "CCU"]  # the paper's order
    assert settings == ccu.train_settings("moons")
    with pytest.raises(ValueError, match="unknown profile"):
        chapter.setup_chapter("moons", "huge", verbose=False)
    with pytest.raises(ValueError, match="unknown method 'XYZ'"):
        chapter.setup_chapter("moons", "smoke", methods=["XYZ"], verbose=False)
    with pytest.raises(ValueError, match="cannot override"):
        chapter.setup_chapter("moons", "smoke", overrides={"nope": 1}, verbose=False)
    with pytest.raises(ValueError, match="unknown dataset"):
        chapter.setup_chapter("mnistt", "smoke", verbose=False)


def test_bisection_trace_brackets_the_certified_radius():
    model = random_ccu(0, d=4, num_classes=4, classifier="linear")
    noise = torch.rand(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    radii = ccu.certified_radius(model, noise, level=1.1)
    i = int(torch.nonzero(ccu.certified_mask(radii))[0])
    rows = chapter.bisection_trace(model, noise[i : i + 1], 1.1, iterations=10)
    assert [k for k, _, _ in rows] == list(range(11))
    widths = [hi - lo for _, lo, hi in rows]
    assert widths[-1] == pytest.approx(widths[0] / 2**10)
    _, lo, hi = rows[-1]
    assert lo <= float(radii[i]) <= hi


def test_figure2_rows_and_grid_from_the_reference_runs():
    refs = report.reference_runs("cpu")
    assert refs, "reference results are committed"
    rows = [r for name, ref in refs.items() for r in chapter.worst_cases_of_reference(name, ref)]
    assert len(rows) == 2 * len(refs)
    methods = ordered({m for r in rows for m in r["worst"]})
    assert "CCU" in methods and "Base" in methods
    fig = plots.plot_worst_cases(rows)
    # at most five methods beside a centre: the rest wrap onto lines of their own
    n_lines = -(-len(methods) // 5)
    axes = np.array(fig.axes).reshape(len(rows) * n_lines, min(len(methods), 5) + 1)

    def panel(i, m):
        k = methods.index(m)
        return axes[i * n_lines + k // 5, k % 5 + 1]

    assert axes[0, 0].get_title().startswith(rows[0]["label"].split("\n")[0])
    assert panel(0, "CCU").get_title().startswith("CCU\nconf.")
    # a method a run skipped leaves its panel empty
    missing = [(i, m) for i, r in enumerate(rows) for m in methods if m not in r["worst"]]
    for i, m in missing:
        assert "not run" in panel(i, m).get_title()
    assert fig.get_size_inches()[0] <= 9.5  # the page shows it without shrinking its text
    plt.close(fig)


def test_figure2_rows_of_a_run():
    prof = ccu.get_profile("smoke", n_centres=5)

    class Data:
        spec = type("Spec", (), {"shape": (1, 4, 4)})

    radii = np.array([1.0, np.nan, 1.0, 1.0, 1.0])  # seed 1 uncertified: not attacked
    adv = noise.AdversarialResult(
        {"methods": {"Base": {}, "Maha": {}}},
        np.random.default_rng(0).random((5, 1, 4, 4)),
        radii,
        radii * 0.11,
        {"Base": np.zeros((4, 1, 4, 4)), "Maha": np.ones((4, 1, 4, 4))},
        {"Base": np.log(np.full(4, 0.9)), "Maha": np.full(4, -12.5)},
    )
    rows = chapter.worst_cases_of_run(adv, Data, prof, seed=0, rows=3)
    assert len(rows) == 3 and rows[0]["centre"].shape == (1, 4, 4)
    assert np.array_equal(rows[1]["centre"], adv.centres[2])  # the certified centres, in order
    assert rows[1]["worst"]["Base"][1] == pytest.approx(np.log(0.9))
    assert plots.score_label("Base", np.log(0.9)) == "Base\nconf. 0.900"
    assert plots.score_label("Maha", -12.5) == "Maha\nscore -12.5"
    # with the runs' test scores: a worst case below the median test score is not a success,
    # and its title is bold, as in the paper's Figure 2
    test = {"Base": np.log([0.5, 0.95, 0.99]), "Maha": np.array([-20.0, -10.0, -5.0])}
    runs = {m: SimpleNamespace(scores={"test": s}) for m, s in test.items()}
    rows = chapter.worst_cases_of_run(adv, Data, prof, seed=0, rows=3, runs=runs)
    assert rows[0]["not_fooled"] == {"Base": True, "Maha": True}  # 0.9 < 0.95, -12.5 < -10
    fig = plots.plot_worst_cases(rows)
    weights = {ax.get_title().split("\n")[0]: ax.title.get_fontweight() for ax in fig.axes[1:3]}
    assert weights == {"Base": "bold", "Maha": "bold"}
    runs["Base"].scores["test"] = np.log([0.5, 0.6, 0.7])  # now 0.9 beats the median: fooled
    rows = chapter.worst_cases_of_run(adv, Data, prof, seed=0, rows=3, runs=runs)
    assert rows[0]["not_fooled"]["Base"] is False
    fig = plots.plot_worst_cases(rows)
    assert fig.axes[1].title.get_fontweight() == "normal"
    plt.close("all")
    # the median SR compares with is of the scores in float64: a worst case one float32 step
    # from the middle of two test scores is bold exactly when it is not a success
    from ccu.core import evaluate as ev

    pair = np.array([0.70199394, 0.70199424], dtype=np.float32)
    worst = float(np.float32(0.70199406))
    adv.worst_score["Base"] = np.full(4, worst)
    runs["Base"].scores["test"] = pair
    rows = chapter.worst_cases_of_run(adv, Data, prof, seed=0, rows=1, runs=runs)
    assert rows[0]["not_fooled"]["Base"] == (ev.success_rate([worst], pair) == 0.0)


def test_radius_histograms_count_uncertified_points():
    fig = plots.plot_radius_histograms({"a": np.array([1.0, 2.0, np.nan]), "b": np.arange(5.0)})
    titles = [ax.get_title() for ax in fig.axes]
    assert "2 certified, 1 not" in titles[0] and "5 certified, 0 not" in titles[1]
    assert all("whitened units" in ax.get_xlabel() for ax in fig.axes)
    plt.close(fig)


def test_compared_radius_histograms_share_one_axis_and_bins():
    radii = {"gmm": np.array([1.0, 2.0, 3.0]), "diag": np.array([10.0, 20.0, np.nan])}
    fig = plots.plot_radius_histograms(radii, bins=5, sharex=True)
    a, b = fig.axes
    assert a.get_xlim() == b.get_xlim() and a.get_xlim()[1] >= 20.0
    widths = {round(p.get_width(), 9) for ax in fig.axes for p in ax.patches}
    assert widths == {round(19.0 / 5, 9)}  # the same bins in both panels
    plt.close(fig)


def test_training_history_gives_ccus_objective_its_own_loss_panel():
    hist = {
        "Base": {"loss": [0.5, 0.1], "accuracy": [0.8, 0.9]},
        "CCU": {"loss": [-300.0, -360.0], "accuracy": [0.8, 0.95]},
    }
    fig = plots.plot_history(hist)
    loss, ccu_loss, acc = fig.axes
    assert [line.get_label() for line in loss.lines] == ["Base"]
    assert [line.get_label() for line in ccu_loss.lines] == ["CCU"]
    assert len(acc.lines) == 2 and "eq. (6)" in ccu_loss.get_title()
    plt.close(fig)
    fig = plots.plot_history({"Base": hist["Base"]})  # no CCU: loss and accuracy only
    assert len(fig.axes) == 2
    plt.close(fig)


def test_median_and_epoch_texts_say_what_they_mean():
    from ccu.run.experiment import median

    assert median(torch.tensor([1511.4, 1520.5, 1000.0, 2000.0])) == pytest.approx(1515.95)
    assert chapter.epochs_text(1) == "1 epoch" and chapter.epochs_text(10) == "10 epochs"
    assert chapter.version_text(ccu.__version__) == f"ccu {ccu.__version__}"
    old = chapter.version_text("0.3.0")
    assert old.startswith("ccu 0.3.0 (same protocol as") and "differs in" in old


def test_tables_define_the_abbreviations_they_use():
    table = pd.DataFrame({("CCU", "ours"): {"TE": 1.0, "SR": 0.0}, ("CCU", "paper"): {"TE": 0.5}})
    caption = report.styled(table, "Table 1").caption
    assert caption.startswith("Table 1 (TE: clean test error; SR: success rate")
    assert "AUC:" not in caption
    p_stats = pd.DataFrame({"# < 1.1/M": [3], "% < 1.1/M": [0.1]})
    assert "#: number of test points; %: in percent" in report.styled(p_stats, "P").caption
    assert report.styled(pd.DataFrame({"radius": [1.0]}), "plain").caption == "plain"


def test_every_metric_table_and_styled_missing_values():
    metrics = {
        "CCU": {"ood": {"uniform": {"auroc": 0.99, "aupr_in": 0.98, "mean_max_confidence": 0.11}}},
        "Base": {"ood": {"uniform": {"auroc": 0.5, "aupr_in": 0.6}, "skipped": {}}},
    }
    table = report.every_metric_table(metrics)
    assert list(table.index) == [("Base", "Uniform"), ("CCU", "Uniform")]
    assert table.loc[("CCU", "Uniform"), "auroc"] == pytest.approx(99.0)
    assert np.isnan(table.loc[("Base", "Uniform"), "mean conf."])
    html = report.styled(table, "caption naming the run").to_html()
    assert report.MISSING in html and "caption naming the run" in html and "nan" not in html


def test_training_table():
    class Run:
        def __init__(self, te, loaded):
            self.metrics = {"test_error": te, "mean_max_confidence": 0.9}
            self.config = {"train_seconds": 1.5} if not loaded else {}
            self.loaded = loaded

    table = report.training_table({"CCU": Run(0.1, True), "Base": Run(0.05, False)})
    assert list(table.index) == ["Base", "CCU"]
    assert table.loc["Base", "test error %"] == pytest.approx(5.0)
    assert np.isnan(table.loc["CCU", "train seconds"])
    assert isinstance(table, pd.DataFrame)


def test_reference_tables_and_captions():
    refs = report.reference_runs("cpu")
    name, ref = next(iter(refs.items()))
    cap = chapter.reference_caption(name, ref)
    assert name in cap and "profile cpu" in cap and "commit" in cap
    assert len(chapter.reference_ood_tables(refs)) == 2 * len(refs)
    shown = chapter.reference_attack_tables(refs)
    assert len(shown) == 3 * len(refs)
    assert "median certified radius" in shown[0].data
    assert "Table 1" in shown[1].data and 'class="ccu-grid"' in shown[1].data


def test_glue_passes_numpy_scalars_as_python_numbers(monkeypatch):
    import myst_nb

    import ccu.book.chapter as chapter_module

    seen = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: seen.update({name: value}))
    chapter_module.glue("x", np.float64(8.5))
    chapter_module.glue("n", np.int64(3))
    assert seen == {"x": 8.5, "n": 3}
    assert type(seen["x"]) is float and type(seen["n"]) is int


def test_theorem1_markers_are_told_apart_where_they_overlap():
    """The rays figure's markers (one per eps, at nearly the same distance) have a colour each
    and their distance in the legend: three overlapping lines of one colour were unreadable."""
    nearest = torch.logspace(-1, 6, 20).repeat(3, 1)
    markers = {f"eps={e}": (100.0 + e, 0.1 + e / 10) for e in (0.01, 0.1, 1.0)}
    ax = plots.plot_rays(nearest, torch.rand(3, 20), 10, markers)
    vertical = [line for line in ax.lines if line.get_label().startswith("eps=")]
    assert len({line.get_color() for line in vertical}) == 3
    assert vertical[0].get_label() == "eps=0.01: 100"
    plt.close(ax.figure)
