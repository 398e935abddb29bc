"""The records of a run's settings: profiles (the size of every run) and the optimiser settings
a dataset record holds. Plain data: this module imports nothing of ``ccu``, so every other module
may import it (:mod:`ccu.run.config` adds the checked :func:`~ccu.run.config.get_profile`).

* ``smoke``: minutes per chapter on 2 CPU cores (scaled down on ResNet18 datasets:
  :data:`ccu.core.settings.SMOKE_SCALE`), offline data only (CI, the book build).
* ``cpu``: a real but reduced run on the CPU (minutes).
* ``paper``: the paper's protocol (100 epochs, 500-step 50-restart attacks on 200 noise points); GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class Profile:
    """How big a run is. Smaller values: faster, noisier, less converged."""

    name: str
    epochs: int  # training epochs (the paper: 100)
    n_train: int | None  # cap on in-distribution training points (None: all)
    n_components: int  # K_i = K_o (the paper: 100)
    n_centres: int  # uniform-noise centres of the certified balls, attacked (the paper: 200)
    attack_steps: int  # PGD steps (the paper: 500)
    attack_restarts: int  # random restarts per centre (the paper: 50)
    n_rays: int  # rays walked away from the data in the Theorem 1 chapter
    grid: int  # resolution of the 2-D confidence maps
    acet_steps: int = 40  # PGD steps of ACET's inner attack (the paper: 40)
    ensemble: int = 5  # members of the deep ensemble (the paper: 5)
    # each method's own paper network (VGG13 for MCD and GAN, see ``Method.paper_network``)
    paper_networks: bool = False
    # further methods trained on VGG13 instead of the dataset's network (an override)
    vgg_methods: tuple[str, ...] = ()
    # cap on the in-distribution test points scored (a seeded draw); the OOD test sets are as
    # large as the test set (None: all, the paper)
    n_test: int | None = None
    # cap on the augmented training images the metric's covariance (eq. (12)) is computed from
    # (None: the dataset's own number, TrainSettings.n_covariance: the paper's 50,000 or 60,000)
    n_covariance: int | None = None

    def __post_init__(self):
        if isinstance(self.vgg_methods, list):
            object.__setattr__(self, "vgg_methods", tuple(self.vgg_methods))  # JSON gives lists
        for f in fields(self):
            problem = _field_problem(f.name, getattr(self, f.name))
            if problem:
                raise ValueError(
                    f"profile field {f.name} must be {problem}, not {getattr(self, f.name)!r}"
                    f" ({type(getattr(self, f.name)).__name__}); e.g. {_EXAMPLES[f.name]}."
                )

    def as_dict(self) -> dict:
        """Its fields; those added after a run format was fixed (:data:`OPTIONAL_FIELDS`) only
        when set, so that the config of a run that does not use them stays as it was."""
        out = asdict(self)
        for name, default in OPTIONAL_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    @property
    def base(self) -> str:
        """The built-in profile this one was made from: the first part of its name."""
        return self.name.split("-", 1)[0]

    @property
    def label(self) -> str:
        """Its name as its fields give it (:func:`profile_label`): the folder of its attack
        results, tables and reference results. The same as ``name`` for a profile from
        :func:`get_profile`; it also holds for one made with :func:`dataclasses.replace`."""
        return self._label(f.name for f in fields(self) if f.name != "name")

    @property
    def training_label(self) -> str:
        """The label of its training fields alone (:data:`TRAINING_FIELDS`): the folder of its
        trained methods, shared by profiles that differ only in attack or chapter settings
        (``smoke-e2-steps5`` trains in ``smoke-e2``)."""
        return self._label(TRAINING_FIELDS)

    def _label(self, names) -> str:
        if self.base not in PROFILES:  # a profile of its own: its name is all there is
            return self.name
        return profile_label(self.base, {n: getattr(self, n) for n in names})


#: the smallest value of each whole-number profile field
_MINIMUM = {
    "epochs": 1,
    "n_train": 1,
    "n_components": 1,
    "n_centres": 1,
    "attack_steps": 1,
    "attack_restarts": 1,
    "n_rays": 1,
    "grid": 2,
    "acet_steps": 1,
    "ensemble": 1,
    "n_test": 1,
    "n_covariance": 2,
}
_EXAMPLES = {
    "name": '"smoke"',
    "epochs": '{"epochs": 10}',
    "n_train": '{"n_train": 500} or {"n_train": null} (all points)',
    "paper_networks": '{"paper_networks": true}',
    "vgg_methods": '{"vgg_methods": ["MCD"]}',
    **{
        k: f'{{"{k}": {max(v, 2) * 5}}}'
        for k, v in _MINIMUM.items()
        if k not in ("epochs", "n_train", "n_test", "n_covariance")
    },
    "n_test": '{"n_test": 1000} or {"n_test": null} (all points)',
    "n_covariance": '{"n_covariance": 4096} or {"n_covariance": null} (the dataset\'s)',
}


def _field_problem(name: str, value) -> str | None:
    """What a value of profile field ``name`` must be, when ``value`` is not that; else None."""
    if name == "name":
        return None if isinstance(value, str) and value else "a non-empty string"
    if name == "paper_networks":
        return None if isinstance(value, bool) else "true or false"
    if name == "vgg_methods":
        ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        return None if ok else "a list of method names"
    if name in ("n_train", "n_test", "n_covariance") and value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or value < _MINIMUM[name]:
        extra = {"n_train": " or null (all points)", "n_test": " or null (all points)",
                 "n_covariance": " or null (the dataset's)"}.get(name, "")  # fmt: skip
        return f"a whole number >= {_MINIMUM[name]}{extra}"
    return None


PROFILES: dict[str, Profile] = {
    "smoke": Profile("smoke", 30, 1500, 10, 40, 30, 3, 20, 120, acet_steps=10, ensemble=3),
    "cpu": Profile("cpu", 10, None, 100, 200, 100, 5, 100, 250, acet_steps=10),
    "paper": Profile("paper", 100, None, 100, 200, 500, 50, 200, 400, paper_networks=True),
}


#: fields added to :class:`Profile` after runs were first saved, with the value that means "not
#: used": :meth:`Profile.as_dict` leaves them out at that value (old configs stay valid)
OPTIONAL_FIELDS = {"n_test": None, "n_covariance": None}

#: the ``smoke`` profile per network (:attr:`TrainSettings.classifier` of the dataset): profile
#: fields that replace the defaults on datasets whose network is slow on a CPU, so that every
#: chapter runs in minutes on 2 cores (ResNet18 trains ~30-60 images/s per core at 32x32; the
#: README's table "smoke on every dataset" has the measured times). The run is named after them
#: like any override (``smoke-e2-n200-centres10-steps10-restarts2-test500``): it never shares a
#: folder with an unscaled smoke run. :func:`ccu.run.config.get_profile` applies them when given the
#: dataset.
SMOKE_SCALE: dict[str, dict] = {
    "resnet18": {
        "epochs": 2,
        "n_train": 200,
        "n_test": 500,
        "n_centres": 10,
        "attack_steps": 10,
        "attack_restarts": 2,
    },
}

#: profiles renamed after the overrides that change them (every built-in profile): ``paper``
#: with 30 epochs is ``paper-e30``, ``smoke`` with 2 epochs ``smoke-e2``, so that their results,
#: which live under the profile's name (``results/<name>/``, ``reference-results/<name>/``),
#: never mix with the protocol's own nor with another reduced run's
LABELLED_PROFILES = tuple(PROFILES)
#: the fields of the adversarial-noise experiment: they change its results, not the training
ATTACK_FIELDS = ("n_centres", "attack_steps", "attack_restarts")
#: the fields only the chapters' figures use (rays walked, the 2-D maps' resolution)
CHAPTER_FIELDS = ("n_rays", "grid")
#: the fields that change a trained method (its folder: :attr:`Profile.training_label`)
TRAINING_FIELDS = tuple(
    f.name for f in fields(Profile) if f.name not in ("name", *ATTACK_FIELDS, *CHAPTER_FIELDS)
)
#: earlier names of profile fields, still read (old name: current name): a ``config.json``
#: written before the rename, and overrides such as ``{"n_seeds": 50}``, mean the current field.
#: ``n_seeds`` was the uniform-noise points of Table 1, now ``n_centres`` ("seed" is a random
#: seed alone). :func:`current_fields` is where the old names are mapped.
RENAMED_FIELDS = {"n_seeds": "n_centres"}


def current_fields(profile: dict) -> dict:
    """``profile`` (a profile's fields, or overrides of some) with every earlier name
    (:data:`RENAMED_FIELDS`) replaced by the current one, in place of it; a ValueError when both
    names are given with different values. Every reader of profile fields (overrides, a saved
    config's ``profile``) goes through this."""
    if not any(old in profile for old in RENAMED_FIELDS):
        return dict(profile)
    out = {}
    for key, value in profile.items():
        new = RENAMED_FIELDS.get(key)
        if new is None:
            out[key] = value
            continue
        if new in profile and profile[new] != value:
            raise ValueError(
                f"profile field {new} given twice, also under its old name {key}, with different "
                f"values ({profile[new]!r} and {value!r})."
            )
        out.setdefault(new, value)
    return out


_SHORT = {
    "epochs": "e",
    "n_train": "n",
    "n_components": "k",
    "n_centres": "centres",
    "attack_steps": "steps",
    "attack_restarts": "restarts",
    "n_test": "test",
    "n_covariance": "cov",
}


def profile_label(name: str, overrides: dict | None = None) -> str:
    """The name of profile ``name`` with ``overrides``: ``name`` itself when they change nothing,
    else ``name`` followed by each changed field and its value in field order, e.g.
    ``paper-e30`` or ``paper-e30-centres50``."""
    base = PROFILES[name]
    parts = [name]
    for f in fields(Profile):
        if f.name == "name" or f.name not in (overrides or {}):
            continue
        value = overrides[f.name]
        if isinstance(value, list):
            value = tuple(value)
        if value == getattr(base, f.name):
            continue
        if value is None:
            text = "all"
        elif isinstance(value, bool):
            text = "on" if value else "off"
        elif isinstance(value, tuple):
            text = "+".join(map(str, value)) or "none"
        else:
            text = f"{value:g}" if isinstance(value, float) else str(value)
        text = "".join(c if c.isalnum() or c in "._+" else "_" for c in text)
        parts.append(f"{_SHORT.get(f.name, f.name)}{text}")
    return "-".join(parts)


@dataclass(frozen=True)
class TrainSettings:
    """Optimiser settings (appendix "Experimental details")."""

    optimizer: str = "adam"  # ADAM on MNIST-like data, SGD (momentum 0.9) otherwise
    lr: float = 1e-3
    gmm_lr: float = 1e-5  # GMM parameters: lr 1e-5, no weight decay
    weight_decay: float = 5e-4
    batch_size: int = 128  # in-batch; the out-batch has the same size
    milestones: tuple[float, ...] = (0.5, 0.75, 0.9)  # x0.1 after 50/75/90 of 100 epochs
    classifier: str = "mlp"
    lam: float = 1.0
    eigen_floor: float = 1e-6
    augment: bool = True  # the paper's crops / flips on in-batches
    n_covariance: int | None = None  # augmented samples for the metric (None: training-set size)
