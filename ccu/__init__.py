"""ccu: Certified Certain Uncertainty (Meinke & Hein, ICLR 2020) in PyTorch.

The book in ``book/`` explains every piece; docstrings name the chapter.
"""

import ccu.methods  # noqa: F401 - registers the methods (ccu.run.config imports it too)
from ccu import _moved
from ccu._version import __version__  # noqa: F401 - ccu.__version__
from ccu.core.attacks import (
    AttackResult,
    ball_attack,
    confidence_score,
    confidence_surrogate,
    sample_in_ball,
)
from ccu.core.bounds import (
    CertificateAttack,
    CertificateCheck,
    Theorem1Terms,
    attack_certificates,
    certified_mask,
    certified_radius,
    check_certificate,
    confidence_bound,
    float32_deviation,
    float64_confidence,
    log_ratio_bound,
    nearest_training_point,
    theorem1_distance,
    theorem1_terms,
)
from ccu.core.density import (
    DENSITY_FAMILIES,
    BallBounds,
    DensityModel,
    get_density_family,
    register_density,
)
from ccu.core.diag_gmm import DiagonalGaussianMixture
from ccu.core.gmm import GaussianMixture
from ccu.core.initialisation import init_ccu
from ccu.core.losses import ccu_loss, uniform_cross_entropy
from ccu.core.lp import (
    guaranteed_auc,
    inner_lp_radius,
    lp_confidence_bound,
    lp_norm_factor,
    mahalanobis_radius,
)
from ccu.core.metric import Mahalanobis
from ccu.core.model import CCU, ConstraintError, TheoremNotApplicable
from ccu.core.nets import MLP, LeNet, make_classifier
from ccu.methods.base import BaseMethod, Method, register_method
from ccu.methods.training import Trainer, accuracy
from ccu.run.config import PROFILES, Profile, TrainSettings, get_profile, train_settings

__all__ = [
    "CCU",
    "MLP",
    "PROFILES",
    "AttackResult",
    "BallBounds",
    "BaseMethod",
    "CertificateAttack",
    "CertificateCheck",
    "ConstraintError",
    "DENSITY_FAMILIES",
    "DensityModel",
    "DiagonalGaussianMixture",
    "GaussianMixture",
    "LeNet",
    "Mahalanobis",
    "Method",
    "Profile",
    "TheoremNotApplicable",
    "Theorem1Terms",
    "TrainSettings",
    "Trainer",
    "accuracy",
    "ball_attack",
    "ccu_loss",
    "attack_certificates",
    "certified_mask",
    "certified_radius",
    "check_certificate",
    "float32_deviation",
    "float64_confidence",
    "confidence_bound",
    "confidence_score",
    "confidence_surrogate",
    "get_density_family",
    "get_profile",
    "guaranteed_auc",
    "inner_lp_radius",
    "lp_confidence_bound",
    "lp_norm_factor",
    "mahalanobis_radius",
    "init_ccu",
    "log_ratio_bound",
    "make_classifier",
    "nearest_training_point",
    "register_density",
    "register_method",
    "sample_in_ball",
    "theorem1_distance",
    "theorem1_terms",
    "train_settings",
    "uniform_cross_entropy",
]


_moved.install()  # the modules' old names (CHANGELOG.md), with a warning
