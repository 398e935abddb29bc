"""ccu: Certified Certain Uncertainty (Meinke & Hein, ICLR 2020) in PyTorch.

The book in ``book/`` explains every piece; docstrings name the chapter.
"""

import ccu.methods  # noqa: F401 - registers the methods (ccu.config imports it too)
from ccu._version import __version__  # noqa: F401 - ccu.__version__
from ccu.attacks import AttackResult, ball_attack, confidence_score, sample_in_ball
from ccu.bounds import (
    CertificateAttack,
    CertificateCheck,
    Theorem1Terms,
    attack_certificates,
    certified_mask,
    certified_radius,
    check_certificate,
    confidence_bound,
    float32_deviation,
    log_ratio_bound,
    nearest_training_point,
    theorem1_distance,
    theorem1_terms,
)
from ccu.config import PROFILES, Profile, TrainSettings, get_profile, train_settings
from ccu.density import (
    DENSITY_FAMILIES,
    BallBounds,
    DensityModel,
    GaussianMixture,
    get_density_family,
    register_density,
)
from ccu.diag_gmm import DiagonalGaussianMixture
from ccu.initialisation import init_ccu
from ccu.losses import ccu_loss, uniform_cross_entropy
from ccu.lp import (
    guaranteed_auc,
    inner_lp_radius,
    lp_confidence_bound,
    lp_norm_factor,
    mahalanobis_radius,
)
from ccu.methods.base import BaseMethod, Method, register_method
from ccu.metric import Mahalanobis
from ccu.model import CCU, ConstraintError, TheoremNotApplicable
from ccu.nets import MLP, LeNet, make_classifier
from ccu.train import Trainer, accuracy

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
    "confidence_bound",
    "confidence_score",
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


def __getattr__(name: str):
    # ``ccu.setup_chapter``: the chapters' one-call setup, imported on first use (it loads the
    # data layer and plotting, which plain ``import ccu`` does not need)
    if name == "setup_chapter":
        from ccu.chapter import setup_chapter

        return setup_chapter
    raise AttributeError(f"module 'ccu' has no attribute {name!r}")
