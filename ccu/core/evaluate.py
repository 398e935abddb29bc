"""OOD metrics (scikit-learn) and the Table 1 statistics.

Conventions (the book chapter *OOD detection* states them too), for scores where higher means
more in-distribution:

* AUROC and AUPR-In take the in-distribution as the positive class; AUPR-Out takes the OOD set as
  positive with the negated score.
* FPR@95: the fraction of OOD inputs scoring at or above the 5% quantile of the in-distribution
  scores (so that 95% of in-distribution inputs are kept), as in ODIN.
* Table 1's AUC (:func:`attack_auc`) is the paper's: scikit-learn's ``roc_auc_score`` of the
  test images' scores against the worst points', a tie counting one half, as the authors'
  ``gen_attack_stats.py`` computes it (float32 log-confidences saturate at exactly 0, so ties
  are common: counted as failures, OE's MNIST AUC was 0.5 % where the paper has 35.2 %).
* Certified and guaranteed AUCs (:func:`strict_auc`) count ties as failures: a guarantee that
  only ties is none.
* SR (attack success rate): the share of seeds whose worst case reaches the median
  in-distribution score (a tie counts as a success of the attack).
"""

from __future__ import annotations

import numpy as np

#: the keys of :func:`ood_metrics`' dict (``metrics.json`` stores it as is, so the records
#: re-export them: :data:`ccu.store.records.OOD_METRICS`): AUROC (Table 2 of the paper),
#: AUPR-In (Table 6), AUPR-Out and FPR@95
AUROC, AUPR_IN, AUPR_OUT, FPR95 = "auroc", "aupr_in", "aupr_out", "fpr95"


def _arrays(score_in, score_out):
    a = np.asarray(score_in, dtype=np.float64).ravel()
    b = np.asarray(score_out, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("both score sets must be non-empty.")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("scores contain NaN or infinite values.")
    return a, b


def auroc(score_in, score_out) -> float:
    """Area under the ROC curve, in-distribution positive (ties count one half).

    The paper's Table 2; chapter *OOD detection* (``book/ood_detection.ipynb``)."""
    a, b = _arrays(score_in, score_out)
    y = np.r_[np.ones_like(a), np.zeros_like(b)]
    # scikit-learn imported here, not at the top: it adds ~1.3 s to every `ccu` command (the
    # results store imports this module for the metrics' names)
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, np.r_[a, b]))


def attack_auc(score_in, worst_scores) -> float:
    """The AUC of the paper's Table 1: the in-distribution test scores against the attack's
    worst scores, in-distribution positive, a tie counting one half (:func:`auroc`, as the
    paper's authors compute it: scikit-learn's ``roc_auc_score`` in their
    ``gen_attack_stats.py``). :func:`strict_auc` is the same with ties as failures. Chapter
    *Adversarial noise* (``book/adversarial_noise.ipynb``)."""
    return auroc(score_in, worst_scores)


def strict_auc(score_in, score_out) -> float:
    """``P(score_in > score_out)`` over all pairs: ties count as failures.

    The certified AUCs' convention (Table 1's summary, the guarantees): a bound that only ties
    with a confidence guarantees nothing. Table 1's own AUC counts ties one half, as the paper
    does (:func:`attack_auc`); its rows keep this one as ``AUC_strict``."""
    a, b = _arrays(score_in, score_out)
    a_sorted = np.sort(a)
    greater = a.size - np.searchsorted(a_sorted, b, side="right")  # in-scores strictly above
    return float(greater.sum() / (a.size * b.size))


def aupr_in(score_in, score_out) -> float:
    """Area under the precision-recall curve (precision and recall: eqs. (26)-(27)), the
    in-distribution positive. The paper's Table 6; chapter *OOD detection*
    (``book/ood_detection.ipynb``)."""
    a, b = _arrays(score_in, score_out)
    from sklearn.metrics import average_precision_score  # lazily: see auroc

    return float(average_precision_score(np.r_[np.ones_like(a), np.zeros_like(b)], np.r_[a, b]))


def aupr_out(score_in, score_out) -> float:
    """Area under the precision-recall curve (eqs. (26)-(27)), the OOD set positive with the
    negated score; chapter *OOD detection* (``book/ood_detection.ipynb``)."""
    a, b = _arrays(score_in, score_out)
    from sklearn.metrics import average_precision_score  # lazily: see auroc

    return float(average_precision_score(np.r_[np.zeros_like(a), np.ones_like(b)], -np.r_[a, b]))


def fpr_at_95(score_in, score_out) -> float:
    a, b = _arrays(score_in, score_out)
    threshold = np.quantile(a, 0.05)
    return float((b >= threshold).mean())


def ood_metrics(score_in, score_out) -> dict[str, float]:
    """AUROC, AUPR-In, AUPR-Out and FPR@95 (fractions in [0, 1])."""
    return {
        AUROC: auroc(score_in, score_out),
        AUPR_IN: aupr_in(score_in, score_out),
        AUPR_OUT: aupr_out(score_in, score_out),
        FPR95: fpr_at_95(score_in, score_out),
    }


def success_rate(worst_scores, score_in) -> float:
    """SR: share of seeds whose worst case reaches the median in-distribution score.

    The SR of the paper's Table 1; chapter *Adversarial noise*
    (``book/adversarial_noise.ipynb``). The median is numpy's (of an even count, the mean of
    the two middle scores); the authors' ``gen_attack_stats.py`` takes torch's, the lower one,
    which counts a worst score between the two as a success."""
    a, b = _arrays(score_in, worst_scores)
    return float((b >= np.median(a)).mean())


def classification_error(predictions, labels) -> float:
    p, y = np.asarray(predictions).ravel(), np.asarray(labels).ravel()
    if p.shape != y.shape:
        raise ValueError(f"{p.size} predictions for {y.size} labels.")
    return float((p != y).mean())
