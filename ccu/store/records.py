"""The records the steps pass around: one owner per concept.

* :class:`TrainerOptions`: :class:`ccu.Trainer`'s speed options (``precision``, ``channels_last``,
  ``compile``), one record from the command line to the method instead of three loose arguments.
* :class:`RunSpec`: what names one method's run (dataset, method, profile, seed, device and the
  trainer options): its config dict (the identity written to ``config.json``) and its key
  (:func:`ccu.store.results.config_key`). Whether a saved run matches one asked for is decided by
  :func:`ccu.store.results.same_config` alone.
* The keys of the result files' JSON objects, spelled once here (where the files live and
  their names are :mod:`ccu.store.results`): the adversarial-noise summary (``table1.json``, Table 1
  of the paper: :data:`N_CERTIFIED`, :data:`CERTIFIED_AUC`, :data:`METHODS`, ...), each
  method's row in it (:data:`TE`, :data:`SR`, :data:`AUC`, ...) and its certificate
  (:data:`BOUND_VIOLATIONS`, ...), the reference copy's provenance (:data:`COMMIT`,
  :data:`DEVICE_NAME`, ...), ``trained.json`` (:func:`trained_record`), ``evaluation.json``
  (:func:`evaluation_record`) and ``run_times.json`` (:data:`RUN_TIMES_METHODS`, ...).
  ``guarantees.json`` takes the shared ones from here and spells its own at the top of
  :mod:`ccu.run.guarantees`, its only writer and reader.
* :class:`AttackSummary`: the headline of one ``table1.json`` as a frozen record, read with
  :meth:`AttackSummary.from_json` and written back unchanged with :meth:`AttackSummary.to_json`.
* :class:`Metrics`: one method's ``metrics.json`` (test error, confidences, the OOD metrics per
  set) as a frozen record, the same way; its keys (:data:`TEST_ERROR`, :data:`AUROC`, ...) and
  those of ``evaluation.json`` are spelled here alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ccu.core.evaluate import AUPR_IN, AUPR_OUT, AUROC, FPR95, attack_auc

if TYPE_CHECKING:
    from ccu.core.settings import Profile
    from ccu.data.spec import Dataset

# ----------------------------------------------------------------------------- method order
#: the paper's column order of the methods (its tables' columns; :mod:`ccu.methods` registers
#: them under these names)
METHOD_ORDER = ("Base", "MCD", "EDL", "DE", "GAN", "ODIN", "Maha", "ACET", "ACET2", "OE", "CCU")


def ordered(names) -> list[str]:
    """``names`` in the paper's column order (CCU variants right after CCU)."""
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}

    def key(m):
        if m in rank:
            return (rank[m], "")
        if m.startswith("CCU-"):
            return (rank["CCU"], m)
        return (len(rank), m)

    return sorted(names, key=key)


#: the seed offset of Table 1's uniform-noise centres: centre seed ``seed + CENTRE_SEED_OFFSET``
#: (the balls are drawn with it, :mod:`ccu.run.balls`; reference parts redraw them with it)
CENTRE_SEED_OFFSET = 1000

# ----------------------------------------------------------------------------- summary keys
#: uniform-noise centres drawn for Table 1, one ball each (the paper: 200 per dataset)
N_CENTRES = "n_centres"
#: the earlier name of :data:`N_CENTRES` (``table1.json`` written before the rename, and the
#: committed reference results): still read, by :meth:`AttackSummary.from_json` alone
N_CENTRES_OLD = "n_seeds"
#: centres whose CCU bound at ``R = 0`` is below the level ``1.1 / M``: they get a certified ball
N_CERTIFIED = "n_certified"
#: centres without a certified ball (not attacked, counted apart)
N_UNCERTIFIED = "n_uncertified"
#: the strict AUC of in-distribution confidences against CCU's guaranteed upper bounds
#: (Corollary 1, eq. (11)); uncertified centres count as failures
CERTIFIED_AUC = "certified_auc"
#: the median certified radius over the certified centres (Table 1's "radius")
MEDIAN_RADIUS = "median_radius"
#: float64 bound violations of CCU's worst points (any is a false certificate)
CCU_BOUND_VIOLATIONS = "ccu_bound_violations"
#: per method: TE, SR, AUC of Table 1 and the attack's checks (a row, keys below)
METHODS = "methods"
#: the certifying method whose certified balls are attacked (``"CCU"`` when it ran)
BALLS_FROM = "balls_from"
#: a reduced variant's folder (``paper-e50``, :func:`ccu.store.reference_results.assemble_reference`)
#: holds a copy of ``balls.json`` with the label whose folder holds the balls and their
#: method's part: its parts were attacked in those balls
CERTIFIED_IN = "certified_in"
#: ``balls.json`` (:mod:`ccu.run.balls`) besides the summary: the balls' key (what each attack's key
#: is built from), the sha256 of ``balls.npz``, and the files of the run that certified them
BALLS_KEY, BALLS_ARRAYS_SHA256, BALL_RUN_FILES = "balls_key", "balls_npz_sha256", "ball_run_files"
#: a reference part's ``<method>.attack.json`` (:func:`ccu.run.reference.write_part`): its
#: row of Table 1, the key of the balls it was attacked in, its provenance
PART_ROW, PART_BALLS_KEY, PART_PROVENANCE = "row", "balls_key", "provenance"
#: ``table1.json`` assembled from parts: the methods whose parts it holds
PARTS = "parts"
#: the level of the certificates: a ball is certified where the bound is below ``level / M``
#: (also a key of ``guarantees.json``)
LEVEL = "level"
#: training or test images inside a certified ball
IMAGES_INSIDE_BALLS = "images_inside_balls"
#: the ball method's certificate (its row's :data:`CERTIFICATE`) repeated in the summary: its
#: worst points outside their ball, their highest float64 confidence, the largest float32 error
CCU_POINTS_OUTSIDE_BALLS = "ccu_points_outside_balls"
CCU_MAX_CONFIDENCE_FLOAT64 = "ccu_max_confidence_float64"
CCU_MAX_FLOAT32_DEVIATION = "ccu_max_float32_deviation"

# ---------------------------------------------------------- one method's row of table1.json
#: Table 1's numbers over the certified centres: the clean test error, the attack's success
#: rate and the AUC of in-distribution against the worst noise (fractions); the rows of
#: the Table 1 tables are named by these keys, the paper's names (``ccu/reference/paper``)
TE, SR, AUC = "TE", "SR", "AUC"
#: Table 1's AUC with ties as failures (:func:`ccu.core.evaluate.strict_auc`), beside the
#: paper's :data:`AUC` (ties one half); and how a row's :data:`AUC` counts ties:
#: :data:`AUC_TIES_HALF`. A row without it (attacked before) counted them as failures: its AUC
#: is the strict one, below the paper's way by up to half the share of tied pairs
AUC_STRICT, AUC_TIES, AUC_TIES_HALF = "AUC_strict", "auc_ties", "one half"


def with_paper_auc(row: dict, test_scores, worst) -> dict:
    """A saved Table 1 row with the paper's AUC (ties one half,
    :func:`ccu.core.evaluate.attack_auc`): a row attacked before :data:`AUC_TIES` existed holds the
    strict AUC under ``AUC``; its attack is the same, so the row is brought up to date from its
    worst scores and the run's test scores (the file is left as it is)."""
    if AUC_TIES in row:
        return row
    row = dict(row, **{AUC_STRICT: row.get(AUC), AUC_TIES: AUC_TIES_HALF})
    if len(worst):
        row[AUC] = attack_auc(test_scores, worst)
    return row


#: True in the row of a method whose score draws noise (MCD) when its worst points were scored
#: once more after the attack (:func:`ccu.run.adversarial_noise.attack_method`); such a row
#: without it kept the best of many noisy draws, biased up
WORST_SCORED_ONCE_MORE = "worst_scored_once_more"
#: the methods whose score drew noise before 0.6.0, when rows had neither
#: :data:`WORST_SCORED_ONCE_MORE` nor :data:`AUC_TIES`: a fact about those rows (a method
#: declares its own since, :attr:`ccu.methods.base.Method.stochastic_score`)
NOISY_SCORES_BEFORE_0_6 = ("MCD",)
TABLE1_METRICS = (TE, SR, AUC)
#: the largest distance of an attacked point from its centre over its ball's radius (<= 1)
MAX_DISTANCE_OVER_RADIUS = "max_distance_over_radius"
#: centres whose worst point came from the method's attack surrogate
SEEDS_WON_BY_SURROGATE = "seeds_won_by_surrogate"
#: how the attack's PGD steps used the gradient (:data:`ccu.core.attacks.GRADIENTS`); a row without
#: it is from the earlier attack, whose steps were unit directions ("normalised")
ATTACK_GRADIENT = "attack_gradient"
#: the refining steps after the paper's attack (:func:`ccu.core.attacks.ball_attack`'s
#: ``refine_steps``; a row without it had none), and SR and AUC of the paper's attack alone
REFINE_STEPS = "refine_steps"
SR_PAPER_ATTACK, AUC_PAPER_ATTACK = "sr_paper_attack", "auc_paper_attack"
#: certified centres attacked, and the attack's wall time
N_ATTACKED = "n_attacked"
ATTACK_SECONDS = "attack_seconds"
#: a certifying method's own Corollary 1 certificate over the balls (keys below)
CERTIFICATE = "certificate"
#: ``attack.<method>.json``: the attack's digest and its finished row
ATTACK_KEY, ATTACK_ROW = "key", "row"

# ------------------------------------------------------------------ a row's certificate
#: its own certified centres, their median radius and its certified AUC on the same centres
N_OWN_CERTIFIED = "n_own_certified"
MEDIAN_OWN_RADIUS = "median_own_radius"
OWN_CERTIFIED_AUC = "own_certified_auc"
#: points above its own bound: the attack's worst points and the density peaks (any is a false
#: certificate); the sum of both
BOUND_VIOLATIONS = "bound_violations"
ATTACK_BOUND_VIOLATIONS = "attack_bound_violations"
PEAK_BOUND_VIOLATIONS = "peak_bound_violations"
#: the highest float64 confidence at the density peaks
PEAK_MAX_CONFIDENCE_FLOAT64 = "peak_max_confidence_float64"
#: the attack's worst points judged in float64: outside their ball, highest confidence, largest
#: float32 error and the largest bound over the balls
POINTS_OUTSIDE_BALLS = "points_outside_balls"
MAX_CONFIDENCE_FLOAT64 = "max_confidence_float64"
MAX_FLOAT32_DEVIATION = "max_float32_deviation"
MAX_BOUND_OVER_BALLS = "max_bound_over_balls"

# ------------------------------------------- provenance: reference table1.json, trained.json
#: the commit of the tree that wrote the file (also in a reference ``config.json``)
COMMIT = "commit"
#: the device (``"cuda"``, ``"cpu"``) and its name (the GPU's)
DEVICE, DEVICE_NAME = "device", "device_name"
TORCH_VERSION = "torch_version"
#: ``ccu run``'s wall time over its calls, per method, how many calls, methods skipped for time
WALL_SECONDS_TOTAL = "wall_seconds_total"
WALL_SECONDS_PER_METHOD = "wall_seconds_per_method"
CALLS = "calls"
SKIPPED_FOR_TIME = "skipped_for_time"
#: the most training processes that shared the device at once (``tools/device_run.sh``'s
#: ``JOBS``): their per-method wall times were measured on a shared GPU
CONCURRENT_JOBS = "concurrent_jobs"
#: ``trained.json``: whether the run was loaded (not trained) and the seconds it took
LOADED, SECONDS = "loaded", "seconds"
#: ``trained.json`` of a run loaded: the device it was loaded on (its ``device`` stays the one
#: it trained on)
LOADED_ON = "loaded_on"
#: ``trained.json``: the sha256 of the run's files (its config's ``files``)
FILES = "files"

# ----------------------------------------------------------------------------- run_times.json
#: ``run_times.json`` (:class:`ccu.run.run_times.RunTimes`): per method its finished training's wall
#: time, per method the time of attempts cut short, and the calls (each :data:`SECONDS` and
#: where it :data:`STOPPED`) since the run last finished (:data:`CALLS`)
RUN_TIMES_METHODS, RUN_TIMES_PENDING, STOPPED = "methods", "pending", "stopped"
#: a call's training processes at once (only where more than one: the lanes of a device run),
#: and whether ``ccu run`` went on in the same device call (then the two are one call)
JOBS, THEN_RUN = "jobs", "then_run"


# ----------------------------------------------------------------------------- metric keys
#: the clean test error, a fraction (Table 1's TE)
TEST_ERROR = "test_error"
#: test points scored
N_TEST = "n_test"
#: the mean of the highest class probability (over the test set, or over one OOD set)
MEAN_MAX_CONFIDENCE = "mean_max_confidence"
#: the lowest highest class probability over the test set (the appendix's P_Stats)
MIN_CONFIDENCE = "min_confidence"
#: test points whose highest class probability is below ``1.1 / M`` (P_Stats)
N_BELOW_LEVEL = "n_below_1.1_over_M"
#: per OOD set: its metrics (:data:`OOD_METRICS` and :data:`MEAN_MAX_CONFIDENCE`) or why it was
#: skipped (:data:`SKIPPED`)
OOD = "ood"
#: per OOD set that loaded: where its images came from and how many (``n``)
OOD_SOURCES = "ood_sources"
#: an OOD set that could not be loaded (a download-only set offline): the first line of why
SKIPPED = "skipped"
#: the OOD metrics of one set (:func:`ccu.core.evaluate.ood_metrics`; fractions in [0, 1]): AUROC
#: (Table 2), AUPR-In (Table 6), AUPR-Out and FPR@95, in the order ``metrics.json`` holds them;
#: named by the metrics themselves, which the math computes without the store
OOD_METRICS = (AUROC, AUPR_IN, AUPR_OUT, FPR95)
#: ``evaluation.json``: the mean AUROC over the OOD sets that loaded
MEAN_AUROC = "mean_auroc"


@dataclass(frozen=True)
class TrainerOptions:
    """:class:`ccu.Trainer`'s speed options. ``precision`` (``"float32"`` or ``"bf16"``: the
    classifier under bfloat16 autocast while training) is part of a run's config;
    ``channels_last`` and ``compile`` change only how fast it trains."""

    precision: str = "float32"
    channels_last: bool = False
    compile: bool = False

    def as_kwargs(self) -> dict:
        """``{"precision": ..., "channels_last": ..., "compile": ...}`` for a method or
        :class:`ccu.Trainer`."""
        return asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """One method's run: ``method`` trained on ``dataset`` with ``profile`` (a
    :class:`ccu.Profile`) and ``seed`` on ``device``, with the trainer's ``options``."""

    dataset: str
    method: str
    profile: Profile
    seed: int = 0
    device: str = "cpu"
    options: TrainerOptions = field(default_factory=TrainerOptions)

    def with_method(self, method: str) -> RunSpec:
        """The same run of another method (its Base, or the next method of a seed)."""
        return RunSpec(self.dataset, method, self.profile, self.seed, self.device, self.options)

    def config(self, data: Dataset, method=None) -> dict:
        """The run's config as ``config.json`` records it: the fields that name the run (the
        profile, the training settings, the data's checksum and sources, the library version)
        and, given the built ``method`` (a :class:`ccu.methods.Method`), its network, the
        trainer options it applies and its own extra fields."""
        import torch

        from ccu._version import __version__

        out = {
            "dataset": self.dataset,
            "method": self.method,
            "profile": self.profile.as_dict(),
            "settings": asdict(data.spec.settings),  # the dataset's record holds them
            "seed": self.seed,
            "ccu_version": __version__,
            "torch_version": torch.__version__,
            "data_checksum": data.checksum(),
            "dataset_description": data.spec.description,
            "data_sources": data.info,  # in-data files, out-distribution files and count
            "out_distribution": data.out_description,
            "out_checksum": data.out_checksum(),  # part of the key (0.7.0 on)
            "ood_sets": list(data.spec.ood_sets),
        }
        if method is not None:
            out.update(
                network=method.network_kind(),
                precision=method.trainer_options["precision"],
                trainer_options=method.trainer_options,
                **method.extra_config(),
            )
            from ccu.store.plugins import code_identity

            code = code_identity(method.code_classes())
            if code is not None:  # a plug-in's code is part of its run's identity
                out["plugin_code"] = code
        return out

    def key(self, data: Dataset, method=None) -> str:
        """The digest that decides whether a saved run is this one
        (:func:`ccu.store.results.config_key` of :meth:`config`)."""
        from ccu.store import results as store

        return store.config_key(self.config(data, method))

    def identity(self) -> dict:
        """The fields known before the data is loaded (dataset, method, profile, seed): what a
        step reading a saved run compares with :func:`ccu.store.results.same_config` (``keys=``)."""
        return {
            "dataset": self.dataset,
            "method": self.method,
            "profile": self.profile.as_dict(),
            "seed": self.seed,
        }


def ball_certificate_summary(certificate: dict) -> dict:
    """The ball method's certificate (its row's :data:`CERTIFICATE`) as ``table1.json`` repeats
    it in the summary: ``ccu_bound_violations``, ``ccu_points_outside_balls``, ... (one place for
    Table 1 of a run and Table 1 assembled from parts)."""
    return {
        CCU_BOUND_VIOLATIONS: certificate[BOUND_VIOLATIONS],
        CCU_POINTS_OUTSIDE_BALLS: certificate[POINTS_OUTSIDE_BALLS],
        CCU_MAX_CONFIDENCE_FLOAT64: certificate[MAX_CONFIDENCE_FLOAT64],
        CCU_MAX_FLOAT32_DEVIATION: certificate[MAX_FLOAT32_DEVIATION],
    }


@dataclass(frozen=True)
class AttackSummary:
    """The headline of the adversarial-noise experiment (``table1.json``; Table 1 of the paper):
    how many of ``n_centres`` uniform-noise centres got a certified ball, their median radius,
    the certified AUC and CCU's bound violations. ``fields`` keeps the whole JSON object, so that
    :meth:`to_json` gives back exactly what :meth:`from_json` read. A summary written before the
    rename says ``n_seeds`` (:data:`N_CENTRES_OLD`): it is read as ``n_centres`` and written back
    under the name it had."""

    n_centres: int
    n_certified: int
    median_radius: float
    certified_auc: float
    ccu_bound_violations: int | None
    fields: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, obj: dict) -> AttackSummary:
        return cls(
            obj[_centres_key(obj)],
            obj[N_CERTIFIED],
            obj[MEDIAN_RADIUS],
            obj[CERTIFIED_AUC],
            obj.get(CCU_BOUND_VIOLATIONS),
            dict(obj),
        )

    def to_json(self) -> dict:
        out = dict(self.fields)
        out.update(
            {
                _centres_key(out): self.n_centres,
                N_CERTIFIED: self.n_certified,
                MEDIAN_RADIUS: self.median_radius,
                CERTIFIED_AUC: self.certified_auc,
            }
        )
        if self.ccu_bound_violations is not None:
            out[CCU_BOUND_VIOLATIONS] = self.ccu_bound_violations
        return out


def _centres_key(summary: dict) -> str:
    """The key of the number of centres in ``summary``: :data:`N_CENTRES`, or in a summary
    written before the rename :data:`N_CENTRES_OLD`."""
    return N_CENTRES_OLD if N_CENTRES_OLD in summary and N_CENTRES not in summary else N_CENTRES


@dataclass(frozen=True)
class Metrics:
    """One method's ``metrics.json`` (:func:`ccu.run.experiment.score_sets`): the test error, the
    test set's confidences (the appendix's P_Stats) and, per OOD set, its OOD metrics (AUROC of
    Table 2, AUPR of Table 6, ...) or why it was skipped. ``fields`` keeps the whole JSON object,
    so that :meth:`to_json` gives back exactly what :meth:`from_json` read; a field absent from
    the file (an older or partial one) is None and stays absent."""

    test_error: float | None = None
    n_test: int | None = None
    mean_max_confidence: float | None = None
    min_confidence: float | None = None
    n_below_level: int | None = None
    ood: dict[str, dict] | None = None
    ood_sources: dict[str, dict] | None = None
    fields: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, obj: dict) -> Metrics:
        return cls(
            obj.get(TEST_ERROR),
            obj.get(N_TEST),
            obj.get(MEAN_MAX_CONFIDENCE),
            obj.get(MIN_CONFIDENCE),
            obj.get(N_BELOW_LEVEL),
            obj.get(OOD),
            obj.get(OOD_SOURCES),
            dict(obj),
        )

    def to_json(self) -> dict:
        out = dict(self.fields)
        for key, value in (
            (TEST_ERROR, self.test_error),
            (N_TEST, self.n_test),
            (MEAN_MAX_CONFIDENCE, self.mean_max_confidence),
            (MIN_CONFIDENCE, self.min_confidence),
            (N_BELOW_LEVEL, self.n_below_level),
            (OOD, self.ood),
            (OOD_SOURCES, self.ood_sources),
        ):
            if value is not None or key in out:
                out[key] = value
        return out

    @staticmethod
    def ood_entry(metrics: dict[str, float], mean_max_confidence: float | None) -> dict:
        """One OOD set's entry: its :data:`OOD_METRICS` and the mean highest class probability
        on it."""
        return dict(metrics, **{MEAN_MAX_CONFIDENCE: mean_max_confidence})

    @staticmethod
    def skipped_entry(why: str) -> dict:
        """The entry of an OOD set that could not be loaded."""
        return {SKIPPED: why}

    def ood_sets(self) -> dict[str, dict]:
        """Every OOD set's entry (skipped ones too), in the file's order."""
        return dict(self.ood or {})

    def skipped(self, name: str) -> str | None:
        """Why OOD set ``name`` was skipped, or None when it was scored."""
        return (self.ood or {}).get(name, {}).get(SKIPPED)

    def value(self, name: str, key: str = AUROC) -> float | None:
        """OOD metric ``key`` (:data:`OOD_METRICS`, or :data:`MEAN_MAX_CONFIDENCE`) of set
        ``name``; None when the set was skipped or has no such value."""
        return (self.ood or {}).get(name, {}).get(key)

    def source(self, name: str) -> dict:
        """Where OOD set ``name``'s images came from (:data:`OOD_SOURCES`; empty if unknown)."""
        return (self.ood_sources or {}).get(name, {})


def trained_record(spec: RunSpec, device_name: str, loaded: bool, seconds: float, files: dict,
                   test_error: float | None) -> dict:  # fmt: skip
    """``trained.json`` (:func:`ccu.run.steps.train_one`, the workflow's marker): the run named by
    ``spec``, the device it ran on (``device_name``: the GPU's name), whether it was
    ``loaded`` from disk, its wall ``seconds``, its files' sha256 and its test error."""
    return {
        "dataset": spec.dataset,
        "method": spec.method,
        "profile": spec.profile.name,
        "seed": spec.seed,
        DEVICE: spec.device,
        DEVICE_NAME: device_name,
        LOADED: loaded,
        SECONDS: seconds,
        FILES: files,
        TEST_ERROR: test_error,
    }


def evaluation_record(spec: RunSpec, metrics: Metrics, ood: dict[str, dict]) -> dict:
    """``evaluation.json`` (:func:`ccu.run.steps.evaluate_one`): the run named by ``spec``, its test
    error and the OOD metrics recomputed from the saved scores (``ood``, entries as in
    :class:`Metrics`), with their mean AUROC over the sets that loaded."""
    aurocs = [v[AUROC] for v in ood.values() if AUROC in v]
    return {
        "dataset": spec.dataset,
        "method": spec.method,
        "seed": spec.seed,
        "profile": spec.profile.name,
        TEST_ERROR: metrics.test_error,
        OOD: ood,
        MEAN_AUROC: sum(aurocs) / len(aurocs) if aurocs else float("nan"),
    }


# ----------------------------------------------------------------------------- guarantees.json
# the keys of ``guarantees.json`` (written by :mod:`ccu.run.guarantees`, read by
# :mod:`ccu.report.guarantees`; the store names the file, :data:`ccu.store.results.GUARANTEES`);
# the keys it shares with Table 1's summary (:data:`LEVEL`, :data:`N_CERTIFIED`, ...) are above
#: the certificates' setting: classes, the norm factors kappa_2 and kappa_inf, the radii swept
NUM_CLASSES, KAPPA_2, KAPPA_INF = "num_classes", "kappa_2", "kappa_inf"
EPS_INF, EPS_2 = "eps_inf", "eps_2"
#: per point set (``"test"``, the OOD sets): its row (keys below)
SETS = "sets"
#: a row: points, the share certified, the certified radii's quantiles (and of the inner l_2 and
#: l_inf radii), per l_inf / l_2 eps the GAUC (ties one half), the strict GAUC and median bound
N, SHARE_CERTIFIED = "n", "share_certified"
RADIUS, INNER_L2_RADIUS, INNER_LINF_RADIUS = "radius", "inner_l2_radius", "inner_linf_radius"
GAUC_INF, GAUC_2 = "gauc_inf", "gauc_2"
GAUC, GAUC_STRICT, MEDIAN_BOUND = "gauc", "gauc_strict", "median_bound"
#: an OOD set's clean AUC with ties lost, of the float64 model's confidences (the test set's
#: against the set's): what GOOD's published clean AUC counts (0.8.0 on; absent before)
CLEAN_AUC_STRICT = "clean_auc_strict"
#: which in-distribution confidences the AUCs compare with the bounds: "float64 model" (the
#: model the bounds are about). A file without it compared the run's float32 scores: there the
#: trivial bound 1 tied with every confidence that rounds to 1 in float32, which the GAUC with
#: ties one half counted as half a success (the strict GAUC and the certified AUC stand, up to a
#: confidence within 6e-8 of 1 that float32 rounded above a bound just below 1)
CONFIDENCE_IN = "confidence_in"
CONFIDENCE_IN_FLOAT64 = "float64 model"
#: the quantile of a row's radii that is their median
MEDIAN = "q50"
#: the field's l_inf eps of the run's kind (:data:`ccu.core.guarantees.FIELD_EPS`); the OOD
#: sets not loaded are under :data:`SKIPPED`
FIELD_EPS_INF = "field_eps_inf"
