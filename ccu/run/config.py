"""Profiles (the size of every run) and the optimiser settings a dataset record holds.

* ``smoke``: minutes per chapter on 2 CPU cores (scaled down on ResNet18 datasets:
  :data:`ccu.core.settings.SMOKE_SCALE`), offline data only (CI, the book build).
* ``cpu``: a real but reduced run on the CPU (minutes).
* ``paper``: the paper's protocol (100 epochs, 500-step 50-restart attacks on 200 noise points); GPU.

Every chapter takes a ``profile`` parameter that goes through :func:`get_profile`, which checks
it against the methods it may name. The records themselves (:class:`Profile`,
:class:`TrainSettings`, :data:`PROFILES`) live in :mod:`ccu.core.settings`, which the data layer and
the methods import; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace

from ccu.core.settings import (
    ATTACK_FIELDS,
    CHAPTER_FIELDS,
    LABELLED_PROFILES,
    PROFILES,
    RENAMED_FIELDS,
    SMOKE_SCALE,
    TRAINING_FIELDS,
    Profile,
    TrainSettings,
    current_fields,
    profile_label,
)
from ccu.data.registry import get_spec
from ccu.methods import METHOD_ORDER, METHODS

__all__ = [
    "ATTACK_FIELDS",
    "CHAPTER_FIELDS",
    "LABELLED_PROFILES",
    "PROFILES",
    "PROFILE_CHECKS",
    "RENAMED_FIELDS",
    "SMOKE_SCALE",
    "TRAINING_FIELDS",
    "Profile",
    "TrainSettings",
    "current_fields",
    "get_profile",
    "profile_label",
    "train_settings",
]


def get_profile(name: str, dataset: str | None = None, **overrides) -> Profile:
    """The profile called ``name`` (``smoke``, ``cpu`` or ``paper``), with optional overrides.

    A profile with overrides that change it is renamed after them (:func:`profile_label`, e.g.
    ``paper-e30`` or ``smoke-e2-n400``): a reduced run never passes for the paper's protocol,
    and runs of different settings never share a results folder. An earlier name of a field
    (:data:`ccu.core.settings.RENAMED_FIELDS`: ``n_seeds`` for ``n_centres``) is taken as the field.
    Given the ``dataset`` it runs on, ``smoke`` is scaled to the dataset's network first
    (:data:`SMOKE_SCALE`; ResNet18 sets train fewer epochs on fewer points, score fewer test
    points and attack fewer, shorter), as overrides that the given ones take precedence over,
    e.g. ``get_profile("smoke", "fmnist")`` is
    ``smoke-e2-n200-centres10-steps10-restarts2-test500``."""
    overrides = current_fields(overrides)
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}.")
    unknown = set(overrides) - {f.name for f in fields(Profile)} | ({"name"} & set(overrides))
    if unknown:
        raise ValueError(
            f"cannot override {sorted(unknown)}; profile fields: "
            f"{[f.name for f in fields(Profile) if f.name != 'name']}."
        )
    if dataset is not None and name == "smoke":
        overrides = {**SMOKE_SCALE.get(train_settings(dataset).classifier, {}), **overrides}
    if isinstance(overrides.get("vgg_methods"), list):  # from JSON (papermill): a list
        overrides["vgg_methods"] = tuple(overrides["vgg_methods"])
    profile = replace(PROFILES[name], **overrides) if overrides else PROFILES[name]
    if name in LABELLED_PROFILES:
        profile = replace(profile, name=profile_label(name, overrides))
    for check in PROFILE_CHECKS:
        check(profile)
    return profile


def _check_methods(profile: Profile) -> None:
    """Profiles may name methods (``vgg_methods``): they must exist."""
    bad = sorted(m for m in profile.vgg_methods if m not in METHODS)
    if bad:
        raise ValueError(
            f"vgg_methods names unknown methods {bad}; choose from {list(METHOD_ORDER)}."
        )


#: the checks :func:`get_profile` runs on every profile, in order (more may be appended)
#: (the fields' types and ranges are checked by :class:`Profile` itself, ``__post_init__``)
PROFILE_CHECKS: list[Callable[[Profile], None]] = [_check_methods]


def train_settings(dataset: str) -> TrainSettings:
    """The optimiser settings of ``dataset``: part of its registry record
    (``ccu.data.get_spec(dataset).settings``); unknown names list the known ones."""
    return get_spec(dataset).settings
