"""The equation index: the paper's printed numbers -> the ``ccu`` functions -> the book chapters.

Numbers are as printed in the paper (Meinke & Hein, ICLR 2020): equations are numbered through
the appendix; theorems are numbered within sections (Theorem 3.1 and Corollary 3.1 in Section 3,
restated with their proofs as Theorem A.1 and Corollary B.1); figures and tables in order of
their captions. The book and the docstrings call Theorem 3.1 and Corollary 3.1 "Theorem 1" and
"Corollary 1" for short. ``label`` is the TeX label, for readers of the paper's source only.

README.md and ``book/api.md`` show this index as a table; ``tests/book/test_equations.py`` checks
that both tables equal :data:`INDEX`, that every equation number 1 to :data:`N_EQUATIONS` is
listed once, that every function named exists and cites its entry in its docstring, and that
every chapter exists and is in ``_toc.yml``.

>>> entry = lookup("eq. (6)")
>>> entry.functions
('ccu.ccu_loss', 'ccu.Trainer')
>>> entry.chapter
'book/training'
>>> lookup(9).cite, lookup(9).equations
('Theorem 3.1', (8, 9, 10))
>>> lookup("Eq:Cov").ref
'eq. (12)'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: how many numbered equations the paper prints (the appendix continues the numbering)
N_EQUATIONS = 27


@dataclass(frozen=True)
class Entry:
    """One printed item of the paper and where ``ccu`` implements and the book explains it."""

    ref: str  # as printed, e.g. "eq. (6)", "Theorem 3.1, eqs. (8)-(10)", "Table 1"
    label: str  # the TeX label(s), e.g. "eq:loss1"; "" for unlabelled equations
    what: str  # what it is, in words
    functions: tuple[str, ...]  # public ``ccu.<...>`` names implementing or checking it
    chapter: str  # the book chapter explaining it, e.g. "book/training"

    @property
    def cite(self) -> str:
        """How docstrings cite the entry: ``ref`` up to its first comma."""
        return self.ref.split(",")[0]

    @property
    def equations(self) -> tuple[int, ...]:
        """The equation numbers ``ref`` covers: ``(8)-(10)`` is 8, 9, 10."""
        numbers: list[int] = []
        for first, last in re.findall(r"\((\d+)\)(?:-\((\d+)\))?", self.ref):
            numbers.extend(range(int(first), int(last or first) + 1))
        return tuple(numbers)


INDEX: tuple[Entry, ...] = (
    Entry(
        "eqs. (1)-(3)",
        "eq:Bayesian1, eq:model_full",
        "p(y given x) mixes an in- and an out-distribution conditional; the model keeps the form "
        "with p(y given x, o) = 1/M and p(y given x, i) the classifier's softmax",
        ("ccu.CCU", "ccu.CCU.forward"),
        "book/two_moons",
    ),
    Entry(
        "eq. (4)",
        "eq:model_GMM",
        "the in- and out-densities: Gaussian mixtures in the metric d",
        ("ccu.GaussianMixture",),
        "book/two_moons",
    ),
    Entry(
        "eq. (5)",
        "eq:loss",
        "the expected log-likelihood of the joint model",
        ("ccu.ccu_loss",),
        "book/training",
    ),
    Entry(
        "eq. (6)",
        "eq:loss1",
        "the empirical objective CCU maximises (in-, out-, and both density terms)",
        ("ccu.ccu_loss", "ccu.Trainer"),
        "book/training",
    ),
    Entry(
        "eq. (7)",
        "",
        "the model's class posterior and marginal density with lambda = p(o)/p(i)",
        ("ccu.CCU.forward", "ccu.CCU.log_marginal"),
        "book/two_moons",
    ),
    Entry(
        "Theorem 3.1, eqs. (8)-(10)",
        "Thr:thr1",
        "far enough from the training set (9), confidence at most (1 + eps)/M (10); "
        "assumes min theta_l > max sigma_k",
        (
            "ccu.theorem1_distance",
            "ccu.theorem1_terms",
            "ccu.CCU.check_constraint",
            "ccu.book.checks.theorem1_check",
        ),
        "book/theorem1",
    ),
    Entry(
        "Corollary 3.1, eq. (11)",
        "Cor:Cor1",
        "an upper bound on the confidence over a whole ball d(x, x0) <= R",
        ("ccu.confidence_bound", "ccu.log_ratio_bound", "ccu.book.checks.corollary1_check"),
        "book/corollary1",
    ),
    Entry(
        "eq. (12)",
        "Eq:Cov",
        "the metric's covariance C, eigenvalues floored at 1e-6 of the largest",
        ("ccu.Mahalanobis", "ccu.Mahalanobis.from_covariance"),
        "book/corollary1",
    ),
    Entry(
        "Theorem A.1, eqs. (13)-(17)",
        "App:Thr",
        "the proof of Theorem 3.1 (restated as (13)-(15)); the library keeps the proof's "
        "sqrt(2) that the statement drops",
        ("ccu.theorem1_terms",),
        "book/theorem1",
    ),
    Entry(
        "Corollary B.1, eqs. (18)-(23)",
        "App:Cor",
        "the proof of Corollary 3.1: the in-density's upper and the out-density's lower bound "
        "over the ball",
        ("ccu.GaussianMixture.ball_bounds_whitened", "ccu.confidence_bound"),
        "book/corollary1",
    ),
    Entry(
        "eqs. (24)-(25)",
        "App:Radius",
        "the certified radius: b(R) is increasing, bisection solves b(R) = lambda (nu - 1)/(M - nu)",
        ("ccu.certified_radius", "ccu.log_ratio_bound"),
        "book/corollary1",
    ),
    Entry(
        "eqs. (26)-(27)",
        "App:AUPR",
        "precision and recall, for the area under the precision-recall curve",
        ("ccu.core.evaluate.aupr_in", "ccu.core.evaluate.aupr_out"),
        "book/ood_detection",
    ),
    Entry(
        "Figure 1",
        "Fig:two_moons",
        "confidence maps of a ReLU network and CCU on two moons, near and far",
        ("ccu.book.plots.plot_confidence_maps",),
        "book/two_moons",
    ),
    Entry(
        "Figure 2",
        "Fig:Samples",
        "each method's worst case in the certified balls around uniform noise",
        ("ccu.book.plots.plot_worst_cases",),
        "book/adversarial_noise",
    ),
    Entry(
        "Figure 3",
        "Fig:histograms",
        "histograms of the certified radii around uniform noise",
        ("ccu.book.plots.plot_radius_histograms",),
        "book/adversarial_noise",
    ),
    Entry(
        "Table 1",
        "Table:AttackStats",
        "test error, success rate and AUC of the attack in the certified balls",
        (
            "ccu.run.adversarial_noise.adversarial_noise",
            "ccu.report.tables.attack_table",
            "ccu.core.evaluate.success_rate",
            "ccu.core.evaluate.attack_auc",
        ),
        "book/adversarial_noise",
    ),
    Entry(
        "Table 2",
        "Table:OOD",
        "AUROC of in- versus out-distribution",
        ("ccu.report.tables.ood_table", "ccu.core.evaluate.auroc"),
        "book/ood_detection",
    ),
    Entry(
        "Table 3",
        "Tab:P_Stats",
        "CCU's lowest test confidence and how many test points are below 1.1/M",
        ("ccu.report.tables.p_stats_row",),
        "book/adversarial_noise",
    ),
    Entry(
        "Table 4",
        "Tab:ACET_Comp",
        "AUROC of ACET2 (ACET around uniform noise), the ACET2 column of Table 2",
        ("ccu.methods.trained.ACET2Method", "ccu.report.tables.ood_table"),
        "book/ood_detection",
    ),
    Entry(
        "Table 5",
        "Tab:ACET_CompAtt",
        "test error, AUC and success rate of ACET2, the ACET2 column of Table 1",
        ("ccu.methods.trained.ACET2Method", "ccu.report.tables.attack_table"),
        "book/adversarial_noise",
    ),
    Entry(
        "Table 6",
        "Tab:AUPR",
        "AUPR-In of in- versus out-distribution",
        ("ccu.report.tables.ood_table", "ccu.core.evaluate.aupr_in"),
        "book/ood_detection",
    ),
)


def lookup(key: int | str) -> Entry:
    """The entry for an equation number (``6``), a ``ref`` or its ``cite`` (``"Table 1"``,
    ``"Theorem 3.1"``) or a TeX label (``"eq:loss1"``); ``KeyError`` if none."""
    for entry in INDEX:
        if isinstance(key, int):
            if key in entry.equations:
                return entry
        elif key in (entry.ref, entry.cite) or key in entry.label.split(", "):
            return entry
    raise KeyError(f"no entry for {key!r} in ccu.book.equations.INDEX")


def table_row(entry: Entry, chapter_cell: str) -> str:
    """One Markdown row: paper, what, functions, chapter (``chapter_cell``), TeX label."""
    functions = ", ".join(f"`{name}`" for name in entry.functions)
    label = ", ".join(f"`{label}`" for label in entry.label.split(", ")) if entry.label else ""
    return f"| {entry.ref} | {entry.what} | {functions} | {chapter_cell} | {label} |"


#: the header of both tables
TABLE_HEADER = (
    "| Paper | What | `ccu` | Chapter | TeX label |",
    "| --- | --- | --- | --- | --- |",
)
