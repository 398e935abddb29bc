"""The ``smoke`` profile scaled to a dataset's network (issue: every chapter in minutes on a CPU)."""

import pytest
import torch

from ccu.core.settings import PROFILES
from ccu.data import load_dataset
from ccu.run.config import SMOKE_SCALE, get_profile, train_settings


def test_smoke_is_scaled_for_resnet18_datasets_and_named_after_it():
    assert train_settings("fmnist").classifier == "resnet18"
    prof = get_profile("smoke", "fmnist")
    for field, value in SMOKE_SCALE["resnet18"].items():
        assert getattr(prof, field) == value
    assert prof.name == prof.label != "smoke"  # never in results/smoke/
    assert prof.name.startswith("smoke-") and "test" in prof.name
    assert get_profile("smoke", "cifar10-jpeg") == prof


@pytest.mark.parametrize("dataset", ["digits", "moons", "mnist"])
def test_smoke_is_unchanged_where_the_network_is_fast(dataset):
    assert get_profile("smoke", dataset) == get_profile("smoke") == PROFILES["smoke"]


def test_a_users_overrides_win_over_the_scale_and_say_so_in_the_name():
    prof = get_profile("smoke", "fmnist", epochs=30, n_test=None)
    assert prof.epochs == 30 and prof.n_test is None
    assert prof.n_train == SMOKE_SCALE["resnet18"]["n_train"]
    assert "-e" not in prof.name and "test" not in prof.name  # both back at smoke's values
    assert prof.name != get_profile("smoke", "fmnist").name


def test_other_profiles_are_not_scaled():
    assert get_profile("cpu", "fmnist") == PROFILES["cpu"]
    assert get_profile("paper", "cifar10-jpeg") == PROFILES["paper"]


def test_n_test_is_left_out_of_configs_when_unused():
    """Runs that do not cap the test set keep the config (and config key) they had."""
    assert "n_test" not in get_profile("smoke").as_dict()
    assert get_profile("smoke", n_test=100).as_dict()["n_test"] == 100


def test_the_covariance_cap_is_a_training_field_left_out_when_unused():
    """``n_covariance`` caps the metric's augmented sample (the scaled smoke keeps the
    dataset's): a capped run trains in a folder of its own; others keep their configs."""
    assert "n_covariance" not in get_profile("smoke", "cifar10-offline").as_dict()
    capped = get_profile("smoke", "cifar10-offline", n_covariance=4096)
    assert capped.as_dict()["n_covariance"] == 4096
    assert capped.training_label.endswith("-cov4096")
    assert capped.training_label != get_profile("smoke", "cifar10-offline").training_label
    for bad in (0, 1, "4096", 2.5, True):
        with pytest.raises(ValueError, match="n_covariance must be a whole number >= 2 or null"):
            get_profile("smoke", n_covariance=bad)


@pytest.mark.parametrize("bad", [0, -1, "500", 2.5, True])
def test_n_test_is_checked(bad):
    with pytest.raises(ValueError, match="n_test must be a whole number >= 1 or null"):
        get_profile("smoke", n_test=bad)


def test_the_test_cap_is_a_seeded_draw_in_order():
    data = load_dataset("digits", seed=0)
    small = data.subset(None, 100)
    again = data.subset(None, 100)
    assert len(small.test_x) == 100 and small.info["n_test"] == 100
    assert torch.equal(small.test_x, again.test_x)
    assert torch.equal(small.train_x, data.train_x)
    # every drawn point is a test point, in the order of the test set
    rows = [int(torch.nonzero((data.test_x == x).flatten(1).all(1))[0]) for x in small.test_x]
    assert rows == sorted(rows)
    assert len(set(small.test_y.tolist())) == data.num_classes  # every class
    assert data.subset(None, 10_000) is data and data.subset(None, None) is data
