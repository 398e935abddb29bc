"""The records' file formats (:mod:`ccu.store.records`) and the old names they still read: ``n_seeds``,
the uniform-noise centres of Table 1 before they were called ``n_centres``."""

import json
from pathlib import Path

import pytest

import ccu
from ccu.core.settings import RENAMED_FIELDS, current_fields
from ccu.data import load_dataset
from ccu.run import experiment
from ccu.store import results as store
from ccu.store.records import AttackSummary, Metrics, RunSpec
from ccu.store.reference_results import REFERENCE_RESULTS

ROOT = Path(__file__).resolve().parents[2]


def _old(profile: dict) -> dict:
    """A profile's fields as the version before the rename wrote them."""
    return {("n_seeds" if k == "n_centres" else k): v for k, v in profile.items()}


# ----------------------------------------------------------------------------- profiles
def test_profiles_say_n_centres_and_take_n_seeds_as_its_old_name():
    new = ccu.get_profile("smoke", n_centres=5)
    assert new.n_centres == 5 and "n_centres" in new.as_dict() and "n_seeds" not in new.as_dict()
    assert new.name == "smoke-centres5"
    assert ccu.get_profile("smoke", n_seeds=5) == new  # an override of before the rename
    assert ccu.get_profile("smoke", n_seeds=5, n_centres=5) == new
    with pytest.raises(ValueError, match="n_centres given twice"):
        ccu.get_profile("smoke", n_seeds=5, n_centres=6)
    assert RENAMED_FIELDS == {"n_seeds": "n_centres"}
    assert current_fields({"epochs": 2, "n_seeds": 3}) == {"epochs": 2, "n_centres": 3}


def test_an_old_config_names_the_same_run(tmp_path):
    """A config.json whose profile says n_seeds (checksum and all) reads as n_centres and is the
    same configuration as the run asked for now."""
    prof = ccu.get_profile("smoke", epochs=2, n_centres=7)
    spec = RunSpec("digits", "Base", prof)
    new = dict(spec.identity(), ccu_version=ccu.__version__, precision="float32")
    old = dict(new, profile=_old(new["profile"]))
    assert "n_seeds" in old["profile"] and "n_centres" not in old["profile"]
    store.write_config(tmp_path / store.CONFIG, old)
    read = store.read_config(tmp_path / store.CONFIG)
    assert read["profile"] == json.loads(json.dumps(prof.as_dict()))
    assert store.same_config(read, new) and store.config_key(old) == store.config_key(new)
    assert store.same_config(old, spec.identity(), keys=("profile", "seed"))
    assert ccu.Profile(**read["profile"] | {"vgg_methods": ()}) == prof


def test_a_run_saved_by_the_old_version_is_loaded_not_retrained(tmp_path):
    prof = ccu.get_profile("smoke", epochs=1, n_train=200)
    data = load_dataset("digits").subset(prof.n_train)
    first = experiment.run_method("digits", "Base", prof, data=data, root=tmp_path)
    assert first.config["profile"]["n_centres"] == prof.n_centres
    path = first.directory / store.CONFIG
    saved = json.loads(path.read_text())
    store.write_config(path, dict(saved, profile=_old(saved["profile"])))  # as written before
    assert '"n_seeds"' in path.read_text()
    again = experiment.run_method("digits", "Base", prof, data=data, root=tmp_path)
    assert again.loaded and again.config["profile"]["n_centres"] == prof.n_centres


# ----------------------------------------------------------------------------- table1.json
def test_attack_summaries_of_both_names_round_trip():
    new = {"n_centres": 4, "n_certified": 3, "median_radius": 1.5, "certified_auc": 0.9}
    old = _old(new)
    assert AttackSummary.from_json(new) == AttackSummary.from_json(old)
    assert AttackSummary.from_json(old).n_centres == 4
    for obj in (new, old, dict(new, ccu_bound_violations=0, methods={})):
        back = AttackSummary.from_json(obj).to_json()
        assert back == obj and list(back) == list(obj)


@pytest.mark.parametrize(
    "path", sorted(REFERENCE_RESULTS.glob("**/table1.json")), ids=lambda p: p.parent.name
)
def test_committed_table1_files_still_load_unchanged(path):
    obj = json.loads(path.read_text())
    summary = AttackSummary.from_json(obj)
    # files committed before the rename keep the old name, the newer ones (reference-results/
    # paper/) the new one; each reads back unchanged
    assert summary.n_centres == obj.get("n_seeds", obj.get("n_centres")) is not None
    assert json.dumps(summary.to_json(), indent=2) == json.dumps(obj, indent=2)


def test_committed_configs_read_with_the_current_profile_fields():
    paths = sorted(REFERENCE_RESULTS.glob("**/*.config.json"))
    assert len(paths) > 10  # the loop below is not vacuous
    for path in paths:
        profile = store.normalised_config(json.loads(path.read_text()))["profile"]
        assert "n_centres" in profile and "n_seeds" not in profile, path


def test_the_committed_files_the_parametrized_tests_read_are_there():
    """The tests parametrized over committed files would be skipped, not failed, without any."""
    assert len(sorted(REFERENCE_RESULTS.glob("**/table1.json"))) > 3
    assert len(sorted(REFERENCE_RESULTS.glob("**/*.metrics.json"))) > 10


# ----------------------------------------------------------------------------- metrics.json
@pytest.mark.parametrize(
    "path",
    sorted(REFERENCE_RESULTS.glob("**/*.metrics.json")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_committed_metrics_round_trip_byte_for_byte(path):
    obj = json.loads(path.read_text())
    metrics = Metrics.from_json(obj)
    assert metrics.test_error == obj["test_error"] and metrics.n_test == obj["n_test"]
    assert metrics.n_below_level == obj["n_below_1.1_over_M"]
    for name, entry in obj["ood"].items():
        assert metrics.skipped(name) == entry.get("skipped")
        assert metrics.value(name) == entry.get("auroc")
    assert json.dumps(metrics.to_json(), indent=2) == json.dumps(obj, indent=2)


def test_metrics_written_in_the_order_of_the_file_and_partial_ones_kept_partial():
    fresh = Metrics(
        0.1, 10, 0.9, 0.2, 1, {"a": Metrics.ood_entry({"auroc": 0.5}, 0.3)}, {"a": {"n": 4}}
    )
    assert list(fresh.to_json()) == [
        "test_error", "n_test", "mean_max_confidence", "min_confidence", "n_below_1.1_over_M",
        "ood", "ood_sources",
    ]  # fmt: skip
    assert fresh.to_json()["ood"]["a"] == {"auroc": 0.5, "mean_max_confidence": 0.3}
    none_loaded = Metrics(0.1, 10, 0.9, 0.2, 1, {"b": Metrics.skipped_entry("offline")})
    assert "ood_sources" not in none_loaded.to_json() and none_loaded.skipped("b") == "offline"
    partial = {"ood": {"u": {"auroc": 0.9}}}
    assert Metrics.from_json(partial).to_json() == partial


# ----------------------------------------------------------------------------- one owner
#: the keys of the result files' JSON objects that only :mod:`ccu.store.records` spells: the
#: adversarial-noise summary (table1.json), each method's row and certificate in it, the reference
#: copy's provenance (generic words such as "device", "commit" or "seconds" are left out: they
#: are also config.json's fields)
OWNED_KEYS = (
    "methods", "balls_from", "n_certified", "n_uncertified", "level", "images_inside_balls",
    "certified_auc", "median_radius", "ccu_bound_violations", "ccu_points_outside_balls",
    "ccu_max_confidence_float64", "ccu_max_float32_deviation",
    "TE", "SR", "AUC", "max_distance_over_radius", "seeds_won_by_surrogate", "n_attacked",
    "attack_seconds", "certificate",
    "n_own_certified", "median_own_radius", "own_certified_auc", "bound_violations",
    "attack_bound_violations", "peak_bound_violations", "peak_max_confidence_float64",
    "points_outside_balls", "max_confidence_float64", "max_float32_deviation",
    "max_bound_over_balls",
    "device_name", "wall_seconds_total", "wall_seconds_per_method", "skipped_for_time",
    "concurrent_jobs",
)  # fmt: skip
#: the same words where they are no key of a result file: (module, word) -> why
NOT_KEYS = {
    ("ccu/cli.py", "methods"): "the sub-command `ccu methods`",
    ("ccu/cli_parser.py", "methods"): "the sub-command `ccu methods`",
    ("ccu/run/checks.py", "methods"): "the workflow config's key (workflow/config.yaml)",
    ("ccu/book/chapter.py", "methods"): "the chapters' parameter",
    (
        "ccu/report/guarantees.py",
        "AUC",
    ): "GOOD's published metric (ccu/reference/field) and a column",
    ("ccu/book/checks.py", "n_certified"): "theorem1_check's rows for the chapter (no file)",
}
#: the modules that may spell them: the records, and the store (file names, config.json)
OWNERS = ("ccu/store/records.py", "ccu/store/results.py")


def spelled_keys(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` for every string constant in ``source`` that is one of
    :data:`OWNED_KEYS`, and every keyword argument named like one (``dict(x, level=...)``,
    ``d.update(certificate=...)``)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in OWNED_KEYS:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("dict", "update"):
                found += [(k.value.lineno, k.arg) for k in node.keywords if k.arg in OWNED_KEYS]
    return sorted(found)


def test_result_keys_are_spelled_in_the_records_alone():
    """No module of ccu/ or tools/ but the records and the store spells a key of table1.json
    (summary, rows, certificates) or of its reference copy's provenance: each reads and
    writes them through :mod:`ccu.store.records`' constants."""
    files = sorted(ROOT.glob("ccu/**/*.py")) + sorted(ROOT.glob("tools/**/*.py"))
    bad = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in OWNERS:
            continue
        for line, key in spelled_keys(path.read_text()):
            if (rel, key) not in NOT_KEYS:
                bad.append(f"{rel}:{line}: {key!r}")
    assert not bad, "spell these keys with ccu.store.records' constants:\n" + "\n".join(bad)


def test_the_rule_finds_keys_in_every_position():
    source = (
        'a = t1["methods"]\nb = row.get("TE")\nc = {"certificate": 1}\n'
        "d = dict(x, balls_from=2)\ne.update(level=3)\nf(level=4)\n"
    )
    assert spelled_keys(source) == [
        (1, "methods"), (2, "TE"), (3, "certificate"), (4, "balls_from"), (5, "level"),
    ]  # fmt: skip


def test_owned_keys_are_the_records_constants():
    from ccu.store import records

    values = {v for k, v in vars(records).items() if k.isupper() and isinstance(v, str)}
    assert set(OWNED_KEYS) <= values


@pytest.mark.parametrize(
    "path", sorted(REFERENCE_RESULTS.glob("**/table1.json")), ids=lambda p: p.parent.name
)
def test_every_key_of_the_committed_table1_files_is_a_records_constant(path):
    from ccu.store import records

    values = {v for k, v in vars(records).items() if k.isupper() and isinstance(v, str)}
    obj = json.loads(path.read_text())
    keys = set(obj)
    for row in obj[records.METHODS].values():
        keys |= set(row) | set(row.get(records.CERTIFICATE, {}))
    assert keys <= values, sorted(keys - values)


def test_trained_json_keeps_its_fields_in_order():
    from ccu.store.records import trained_record

    spec = RunSpec("digits", "Base", ccu.get_profile("smoke"), 2, "cpu")
    stamp = trained_record(spec, "cpu", True, 1.5, {"model.pt": "ab"}, 0.1)
    assert list(stamp) == [
        "dataset", "method", "profile", "seed", "device", "device_name", "loaded", "seconds",
        "files", "test_error",
    ]  # fmt: skip
    assert stamp["profile"] == "smoke" and stamp["seed"] == 2 and stamp["loaded"] is True
