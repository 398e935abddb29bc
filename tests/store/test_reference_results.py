"""The committed reference results: complete, consistent and readable by the chapters."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import MACHINE_PATH

import ccu
from ccu import report
from ccu.book import chapter
from ccu.methods import METHOD_ORDER
from ccu.store.records import AttackSummary

REFS = report.reference_runs("cpu")
ROOT = Path(__file__).resolve().parents[2]


def test_the_mnist_reference_covers_every_method():
    ref = REFS["mnist-offline"]
    assert set(ref["metrics"]) == set(METHOD_ORDER)
    assert set(ref["table1"]["methods"]) == set(METHOD_ORDER)
    assert ref["table1"].get("skipped_for_time", []) == []


@pytest.mark.parametrize("dataset", sorted(REFS))
def test_reference_runs_are_consistent(dataset):
    ref = REFS[dataset]
    t1 = ref["table1"]
    assert t1["ccu_bound_violations"] == 0, "a certificate was beaten"
    assert t1["images_inside_balls"] == 0
    assert set(t1["methods"]) == set(ref["metrics"]) == set(ref["config"])
    for name, row in t1["methods"].items():
        assert 0.0 <= row["SR"] <= 1.0 and 0.0 <= row["AUC"] <= 1.0
        assert row["TE"] == pytest.approx(ref["metrics"][name]["test_error"])
        assert row["max_distance_over_radius"] <= 1.0 + 1e-5, f"{name}: attack left its ball"
        cfg = ref["config"][name]
        assert cfg["dataset"] == dataset and cfg["method"] == name
        assert cfg["ccu_version"] == t1_version(ref) and len(cfg["data_checksum"]) == 64
    assert t1["methods"]["CCU"]["SR"] == 0.0
    radii = np.loadtxt(ref["directory"] / "radii.csv")  # NaN: an uncertified centre
    certified = ~np.isnan(radii)
    n_centres = AttackSummary.from_json(t1).n_centres  # committed files say n_seeds, the old name
    assert len(radii) == n_centres == t1["n_certified"] + t1["n_uncertified"]
    assert int(certified.sum()) == t1["n_certified"], "certified centres counted apart"
    assert (radii[certified] > 0).all(), "a radius of 0 must not stand for 'uncertified'"
    assert np.median(radii[certified]) == pytest.approx(t1["median_radius"], rel=1e-4)
    table = report.attack_table(t1, dataset)
    assert len(table) > 0


def t1_version(ref):
    versions = {c["ccu_version"] for c in ref["config"].values()}
    assert len(versions) == 1, f"reference runs mix library versions {versions}"
    return versions.pop()


def test_reference_runs_come_from_this_library_version():
    """This version, or an earlier one that ``RESULT_COMPATIBLE_VERSIONS`` lists with what
    differs (the book names the version of every reference run)."""
    from ccu.store.results import RESULT_COMPATIBLE_VERSIONS

    for dataset, ref in REFS.items():
        version = t1_version(ref)
        assert version == ccu.__version__ or version in RESULT_COMPATIBLE_VERSIONS, (
            f"{dataset}: made by ccu {version}; rerun `ccu run --reference-out reference-results`"
        )


def test_the_density_comparison_reference():
    refs = report.reference_runs("densities/cpu")
    assert "mnist-offline" in refs
    for ref in refs.values():
        t1 = ref["table1"]
        certifying = [m for m, row in t1["methods"].items() if "certificate" in row]
        assert {"CCU", "CCU-diag"} <= set(certifying)
        for m in certifying:
            cert = t1["methods"][m]["certificate"]
            assert cert["bound_violations"] == 0 and cert["points_outside_balls"] == 0
            assert ref["config"][m]["density_family"] == ("gmm" if m == "CCU" else m[4:])
        table = report.density_comparison(ref["metrics"], t1, ref["config"])
        assert list(table.index) == certifying
        words = report.legend(table)  # its AUC is the certified one, not Table 1's
        assert "certified AUC: the in-distribution" in words and "adversarial" not in words


def test_reference_profiles_put_the_paper_first_and_label_every_run(tmp_path):
    import shutil

    src = report.REFERENCE_RESULTS / "cpu" / "mnist-offline"
    for profile in ("cpu", "paper-e30", "paper", "densities"):
        shutil.copytree(src, tmp_path / profile / "mnist-offline")
    assert report.reference_profiles(tmp_path) == ["paper", "paper-e30", "cpu"]
    runs = report.every_reference_run(tmp_path)
    assert list(runs) == [f"mnist-offline ({p})" for p in ("paper", "paper-e30", "cpu")]
    assert all(r["dataset"] == "mnist-offline" for r in runs.values())
    tables = chapter.reference_ood_tables({"mnist-offline (paper)": runs["mnist-offline (paper)"]})
    assert len(tables) == 2  # AUROC and AUPR-In, with the paper's values looked up by dataset


def _committed(*folders):
    out = subprocess.run(
        ["git", "ls-files", *folders], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [ROOT / line for line in out.stdout.splitlines()]


def _texts(path: Path):
    """The text of a committed file: itself, or the string arrays of an .npz."""
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return [" ".join(map(str, z[k].ravel())) for k in z.files if z[k].dtype.kind in "US"]
    return [path.read_text()]


def test_committed_results_name_no_machine_paths():
    files = _committed("reference-results", "benchmarks/timings")
    assert len(files) > 10
    for path in files:
        for text in _texts(path):
            found = MACHINE_PATH.findall(text)
            assert not found, f"{path.relative_to(ROOT)} records machine paths: {found[:3]}"


def test_the_reference_writer_records_paths_relative_to_the_data_root():
    from ccu.data.sources import data_root, mirror_dirs
    from ccu.store import reference_results

    mirror = mirror_dirs()[-1]
    config = {
        "data_sources": {
            "source": f"offline mirror {mirror / 'mnist'} (the official files), unpacked to "
            f"{data_root() / 'MNIST' / 'raw'} and read by torchvision.datasets.MNIST"
        },
        "ood": {"emnist": {"skipped": f"EMNIST (test) is not in {data_root()} and ..."}},
        "n": [1, 2.5, None],
    }
    out = reference_results.without_machine_paths(config)
    assert out["data_sources"]["source"] == (
        "offline mirror mnist (the official files), unpacked to MNIST/raw and read by "
        "torchvision.datasets.MNIST"
    )
    assert out["ood"]["emnist"]["skipped"] == "EMNIST (test) is not in the data root and ..."
    assert out["n"] == [1, 2.5, None]
    assert not MACHINE_PATH.findall(json.dumps(out))


def test_the_attack_budget_checks_say_what_a_gap_is():
    """The committed checks (tools/attack_budget_check.py) as the Adversarial noise chapter
    shows them: OE's gap to the paper closes at the paper's budget; Maha's was the earlier
    attack's unit steps (not fooled even at the paper's budget), and the paper's raw-gradient
    step fools it on most of the same centres at ours; a larger ball changes little."""
    checks = report.attack_budget_checks()
    earlier, paper_step = (report.PGD_STEP_WORDS[k] for k in ("normalised", "raw"))
    oe = checks[checks.method == "OE"].set_index("budget (restarts x steps)")
    assert oe.loc["50 x 500", "SR"] == 100.0 > oe.loc["5 x 100", "SR"]
    maha = checks[(checks.method == "Maha") & (checks.centres == 20)]
    by = maha.set_index(["PGD step", "ball"]).SR
    assert by[(earlier, "certified")] == 0.0 and by[(paper_step, "certified")] >= 50.0
    assert by[(paper_step, "2 x certified radius")] >= 50.0
    old = checks[
        (checks.method == "Maha") & (checks.centres == 5) & (checks["PGD step"] == earlier)
    ]
    assert old.set_index("budget (restarts x steps)").loc["50 x 500", "SR"] == 0.0
    assert (maha["paper SR"] == 100.0).all()


def test_the_released_attack_keeps_its_points_in_the_balls_and_matches_ours():
    """tools/attack_projection_check.py: the iteration of the authors' released attack ends
    inside the certified balls, and fools Maha about as often as our Table 1 attack."""
    proj = report.projection_checks().set_index("method")
    assert (proj["released points outside the ball (%)"] == 0.0).all()
    assert (proj["largest distance / radius"] <= 1.0).all()
    assert proj.loc["Maha", "released attack SR"] >= 50.0 and proj.loc["Maha", "ours SR"] >= 50.0


def test_the_epochs_checks_say_what_a_gap_is():
    """The committed learning-curve check (tools/epochs_check.py) as the OOD detection chapter
    shows it: EDL's AUROC on Uniform moves towards the paper's with more epochs."""
    checks = report.epochs_checks()
    edl = checks[checks.method == "EDL"].set_index("training")
    assert list(edl.index) == ["10 epochs", "30 epochs", "100 epochs"]  # the last: the paper
    ten, thirty, paper = (edl.loc[k, "Uniform"] for k in edl.index)
    assert ten < thirty < paper


def test_the_learning_curves_say_cifar10s_test_error_is_the_short_training():
    """What the OOD detection chapter says of the committed CIFAR-10 stand-in: every trained
    method's training accuracy at the last epoch is level with its test accuracy (no over-fit)
    and above its middle epoch's (still rising), far below the paper's; MNIST's reach ~99 %."""
    cifar = report.learning_curves("cifar10-offline")
    assert len(cifar) >= 5
    last, middle = cifar["epoch 10 (last)"], cifar["epoch 5"]
    assert ((last - cifar["test acc."]).abs() < 10).all() and (last > middle).all()
    assert (cifar["paper's test acc."] - cifar["test acc."] > 30).all()
    mnist = report.learning_curves("mnist-offline")
    assert (mnist["test acc."] > 97).all()


def test_gans_gap_is_neither_the_short_training_nor_the_network():
    """What the chapters say of GAN on MNIST (the paper: fooled on 43.5 %): trained three times
    longer (tools/attack_budget_check.py --method-profile), ours is still fooled on every
    centre, while its worst points stand further from the test set (a higher AUC); on a VGG13
    too."""
    checks = report.attack_budget_checks()
    gan = checks[checks.method.str.startswith("GAN")].set_index("method")
    ten, thirty = gan.loc["GAN"], gan.loc["GAN (30 epochs)"]
    assert ten.SR == thirty.SR == 100.0 and ten["paper SR"] < 50.0
    assert thirty.AUC > ten.AUC
    vgg = gan.loc["GAN (VGG13)"]  # on a VGG13: fooled all the same
    assert vgg.SR == 100.0


def test_a_refined_budget_check_shows_the_papers_steps_and_the_refinement(tmp_path):
    (tmp_path / "checks").mkdir()
    found = {"SR": 0.9, "AUC": 0.6, "auc_ties": "one half", "gradient": "raw",
             "refine_steps": 500, "sr_paper_attack": 0.5, "auc_paper_attack": 0.8}  # fmt: skip
    check = {"dataset": "mnist-offline", "profile": "cpu", "method": "OE", "n_centres": 20,
             "budgets": {"50x500": found}}  # fmt: skip
    (tmp_path / "checks" / "oe.json").write_text(json.dumps(check))
    table = report.attack_budget_checks(tmp_path)
    assert list(table["PGD step"]) == [
        "the paper's: step x gradient",
        "the paper's: step x gradient, then 500 refining steps",
    ]
    assert list(table.SR) == [50.0, 90.0] and list(table.AUC) == [80.0, 60.0]


def test_a_refined_projection_check_puts_ours_before_refining_beside_the_released_attack(tmp_path):
    (tmp_path / "checks").mkdir()
    exact = {"SR": 1.0, "AUC": 0.1, "refine_steps": 100, "sr_paper_attack": 0.6,
             "auc_paper_attack": 0.4}  # fmt: skip
    released = {"SR": 0.65, "AUC": 0.3, "share_outside_ball": 0.0, "max_distance_over_radius": 1.0}
    check = {"dataset": "mnist-offline", "profile": "cpu", "n_centres": 20, "budget": "5x100",
             "methods": {"OE": {"exact": exact, "released_style": released}}}  # fmt: skip
    (tmp_path / "checks" / "projection-x.json").write_text(json.dumps(check))
    row = report.projection_checks(tmp_path).iloc[0]
    assert row["ours SR"] == 60.0 and row["ours SR, refined"] == 100.0
    assert row["released attack SR"] == 65.0


def test_refinement_words_name_the_methods_of_a_mixed_table():
    from ccu.report import glance

    table1 = {"methods": {
        "Base": {"SR": 1.0, "AUC": 0.0, "attack_gradient": "raw"},  # attacked before 0.8.0
        "OE": {"SR": 1.0, "AUC": 0.005, "attack_gradient": "raw", "refine_steps": 100,
               "sr_paper_attack": 0.025, "auc_paper_attack": 0.712},
        "ACET": {"SR": 0.5, "AUC": 0.50001, "attack_gradient": "raw", "refine_steps": 100,
                 "sr_paper_attack": 0.5, "auc_paper_attack": 0.50002},  # equal as printed
    }}  # fmt: skip
    note = report.refinement_note(table1)
    assert "(OE, ACET; the others without)" in note and "OE 2.5, 71.2" in note
    assert "ACET 50.0" not in note
    words = glance.attack_step_words({"table1": table1})
    assert words.endswith(
        "then 100 refining steps along the box's faces (OE, ACET; the others without)"
    )
