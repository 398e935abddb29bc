"""Figures of the book (matplotlib): confidence maps, confidence along rays, bounds and radii.

These functions only draw. The numbers behind the prose, and the checks of the guarantees, are
:mod:`ccu.book.checks` (rays, Theorem 1, Corollary 1, images in balls, far field) and
:mod:`ccu.book.chapter`; a figure that evaluates a function to draw it (a confidence map, a bound
curve) returns those values too, so the tests check them without looking at pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np
import torch

from ccu.core.bounds import confidence_bound

#: the unit of every distance the book plots: the metric d(x, y) = ||W (x - y)||, i.e. Euclidean
#: distance after whitening with the in-distribution's (regularised) covariance
DISTANCE_UNIT = "whitened units"
#: methods whose score is not a log-confidence (Figure 2 shows their raw score)


def set_style() -> None:
    """The book's one figure style (a seaborn theme); every chapter calls it through
    :func:`ccu.book.chapter.setup_chapter`."""
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.dpi": 96, "savefig.bbox": "tight", "image.cmap": "viridis"})


def softmax_confidence(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> max_y softmax(f(x))_y`` for a plain classifier."""

    @torch.no_grad()
    def conf(x):
        return torch.softmax(model(x), 1).max(1).values

    return conf


@torch.no_grad()
def predicted_class(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> argmax_y`` (for CCU: its classifier's argmax, which the calibration keeps)."""
    return lambda x: (model.predict(x) if hasattr(model, "predict") else model(x).argmax(1)).float()


@torch.no_grad()
def confidence_grid(confidence, extent: float, grid: int):
    """Confidence on a ``grid x grid`` lattice over ``[-extent, extent]^2``."""
    g = torch.linspace(-extent, extent, grid)
    xx, yy = torch.meshgrid(g, g, indexing="xy")
    pts = torch.stack([xx.ravel(), yy.ravel()], 1)
    return g.numpy(), confidence(pts).reshape(grid, grid).numpy()


def plot_confidence_maps(
    models: dict, data, extents=(3.0, 30.0), grid: int = 200, predictors: dict | None = None
):
    """Figure 1 of the paper: colour-coded ``max_y p(y|x)`` of each model, near and far.

    ``models`` maps a title to a confidence function (batch (N, 2) -> (N,)); ``predictors``
    optionally maps the same titles to class predictions, drawn as the decision boundary (white).
    Returns the figure and a dict ``{(title, extent): grid of confidences}``. Chapter *Two
    moons* (``book/two_moons.ipynb``).
    """
    if data.train_x.shape[1:] != (2,):
        raise ValueError(
            f"confidence maps need 2-D inputs; dataset {data.name!r} has shape "
            f"{tuple(data.train_x.shape[1:])}. Use dataset='moons'."
        )
    fig, axes = plt.subplots(
        len(extents), len(models), figsize=(4.2 * len(models), 3.8 * len(extents)), squeeze=False
    )
    maps = {}
    x, y = data.train_x.numpy(), data.train_y.numpy()
    for j, (title, conf) in enumerate(models.items()):
        for i, extent in enumerate(extents):
            g, c = confidence_grid(conf, extent, grid)
            maps[(title, extent)] = c
            ax = axes[i, j]
            im = ax.pcolormesh(g, g, c, vmin=0.5, vmax=1.0, cmap="viridis", shading="auto")
            if predictors and title in predictors:
                _, cls = confidence_grid(predictors[title], extent, grid)
                ax.contour(g, g, cls, levels=np.arange(data.num_classes - 1) + 0.5, colors="w")
            ax.scatter(x[:, 0], x[:, 1], c=y, s=3, cmap="coolwarm", edgecolors="none")
            ax.set_title(f"{title}, [-{extent:g}, {extent:g}]$^2$")
            ax.set_xlabel("$x_1$ (input units)")
            ax.set_ylabel("$x_2$ (input units)")
            ax.grid(False)
            ax.set_xlim(-extent, extent)
            ax.set_ylim(-extent, extent)
            ax.set_aspect("equal")
    fig.colorbar(im, ax=axes, label=r"$\max_y \hat p(y|x)$", shrink=0.8)
    return fig, maps


def plot_rays(nearest, conf, num_classes: int, markers: dict | None = None, ax=None):
    """Confidence against distance to the training set, one line per ray."""
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    for r in range(nearest.shape[0]):
        ax.plot(nearest[r].numpy(), conf[r].numpy(), color="tab:blue", alpha=0.3, lw=1)
    ax.axhline(1 / num_classes, color="k", ls=":", label="1/M")
    # one colour and dash pattern per marker, its distance in the legend: markers at nearly
    # the same distance (the median barely moves with eps) stay told apart where they overlap
    colours = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    dashes = ("--", (0, (6, 3)), (0, (2, 2)), (0, (8, 2, 2, 2)), (0, (1, 1)))
    for k, (label, (dist, level)) in enumerate((markers or {}).items()):
        colour, dash = colours[k % len(colours)], dashes[k % len(dashes)]
        ax.axvline(dist, color=colour, ls=dash, lw=1.4, label=f"{label}: {dist:.3g}")
        ax.axhline(level, color=colour, ls="-.", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(rf"distance to the training set $\min_i d(z, x_i)$ ({DISTANCE_UNIT})")
    ax.set_ylabel(r"$\max_y \hat p(y|z)$")
    ax.legend(fontsize=8)
    return ax


def plot_bound_curves(model, x0, radii, level: float = 1.1, ax=None):
    """Corollary 1's bound as a function of R for each centre, with the level and the radii."""
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    M = model.num_classes
    radii = torch.as_tensor(radii, dtype=torch.float64)
    certified = radii[~radii.isnan()]  # NaN: an uncertified centre, drawn without its radius
    top = float(certified.max()) if len(certified) else 0.0
    grid = torch.linspace(0, top * 1.6 if top > 0 else 1.0, 300, dtype=torch.float64)
    curves = []
    for i in range(len(x0)):
        b = confidence_bound(model, x0[i : i + 1].expand(len(grid), *x0.shape[1:]), grid)
        curves.append(b)
        line = ax.plot(grid.numpy(), b.numpy(), lw=1.5)[0]
        if not bool(radii[i].isnan()):
            ax.axvline(float(radii[i]), color=line.get_color(), ls="--", lw=0.8)
    ax.axhline(level / M, color="k", ls=":", label=f"{level:g}/M")
    ax.set_xlabel(f"radius R ({DISTANCE_UNIT})")
    ax.set_ylabel("Corollary 1 bound on $\\max_y \\hat p(y|x)$")
    ax.legend()
    return ax, grid, torch.stack(curves)


def plot_attack_vs_bound(check: dict, num_classes: int, level: float = 1.1, ax=None):
    """Corollary 1 chapter: the confidence the attacks, the points towards the in-means and the
    samples found in each ball, against its radius, under the certified level (``check`` is
    :func:`ccu.book.checks.corollary1_check`)."""
    ax = ax or plt.subplots(figsize=(7, 3.5))[1]
    radius = check["radius"].numpy()
    ax.scatter(radius, check["attack"].numpy(), s=12, label="PGD worst case")
    if check.get("toward_means") is not None:
        ax.scatter(radius, check["toward_means"].numpy(), s=14, marker="^", facecolors="none",
                   edgecolors="C2", label="towards the in-means")  # fmt: skip
    ax.scatter(radius, check["sampled"].numpy(), s=12, marker="x", label="best of the samples")
    ax.axhline(level / num_classes, color="k", ls=":", label=f"{level:g}/M (the certificate)")
    ax.set_xlabel(f"certified radius ({DISTANCE_UNIT})")
    ax.set_ylabel(r"confidence found $\max_y \hat p(y|x)$")
    ax.legend(fontsize=8)
    return ax


def plot_radius_histograms(radii: dict, bins: int = 20, sharex: bool = False):
    """Figure 3 of the paper: a histogram of the certified radii of uniform noise per dataset.

    ``radii`` maps a panel title (dataset and run) to an array of radii; NaN entries (points the
    library could not certify) are counted in the panel title, not drawn. ``sharex=True``: one
    x-axis (and the same bins) for all panels, for runs on the same data that are compared.
    Chapter *Adversarial noise* (``book/adversarial_noise.ipynb``).
    """
    # at most two panels side by side: wider figures are shrunk on the page until their text
    # cannot be read (tools/check_book.py measures it)
    cols = min(len(radii), 2)
    nrows = -(-len(radii) // cols)
    fig, grid = plt.subplots(
        nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False, sharex=sharex
    )
    for ax in grid.ravel()[len(radii) :]:
        ax.axis("off")
    axes = grid.reshape(1, -1)[:, : len(radii)]
    finite = [np.asarray(r, dtype=float) for r in radii.values()]
    finite = np.concatenate([r[np.isfinite(r)] for r in finite] or [np.zeros(0)])
    edges = np.histogram_bin_edges(finite, bins=bins) if sharex and finite.size else bins
    for ax, (title, r) in zip(axes[0], radii.items(), strict=True):
        r = np.asarray(r, dtype=float)
        ok = np.isfinite(r)
        ax.hist(r[ok], bins=edges, color="tab:blue")
        ax.set_title(f"{title}\n{int(ok.sum())} certified, {int((~ok).sum())} not", fontsize=10)
        ax.set_xlabel(f"certified radius ({DISTANCE_UNIT})")
        ax.set_ylabel("noise images")
    fig.tight_layout()
    return fig


def _show_image(ax, img) -> None:
    img = np.clip(np.asarray(img, dtype=float), 0.0, 1.0)
    if img.ndim == 3 and img.shape[0] == 3:
        ax.imshow(img.transpose(1, 2, 0))
    else:
        ax.imshow(img.reshape(img.shape[-2:]), cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def score_label(method: str, score: float) -> str:
    """Figure 2's caption of a worst case: the confidence for a method whose score is a log
    confidence, else the raw score (the method's :attr:`ccu.methods.Method.score_kind`; a
    method not registered in this process, say a plug-in's, shows its raw score)."""
    from ccu.methods import get_method
    from ccu.methods.base import LOG_CONFIDENCE

    try:
        kind = get_method(method).score_kind
    except (KeyError, ValueError):  # not registered here
        kind = None
    if kind == LOG_CONFIDENCE:
        return f"{method}\nconf. {np.exp(score):.3f}"
    return f"{method}\nscore {score:.3g}"


def plot_worst_cases(rows: list[dict], methods=None):
    """Figure 2 of the paper: one row per noise centre; the centre, then each method's worst case
    in the certified ball with its confidence (the raw score for MCD and Maha) above it.

    ``rows``: dicts with ``label`` (the row's name), ``centre`` (the image, (C, H, W)) and ``worst``
    (``{method: (image, score)}``); a method missing from a row leaves its panel empty. A row's
    optional ``not_fooled`` (``{method: bool}``) sets the title of a worst case that stayed below
    the method's median test score in bold, as the paper's Figure 2 does.
    Chapter *Adversarial noise* (``book/adversarial_noise.ipynb``).
    """
    from ccu.methods import ordered  # the paper's column order

    methods = ordered(methods or {m for r in rows for m in r["worst"]})
    # at most PER_LINE methods beside a centre: more wrap onto the next line (the centre
    # repeated), so that the figure keeps a width the page shows without shrinking its text
    per_line = 5
    chunks = [methods[i : i + per_line] for i in range(0, len(methods), per_line)] or [[]]
    width = min(len(methods), per_line) + 1
    lines = [(row, chunk) for row in rows for chunk in chunks]
    fig, axes = plt.subplots(
        len(lines), width, figsize=(1.55 * width, 1.9 * len(lines)), squeeze=False
    )
    for i, (row, chunk) in enumerate(lines):
        _show_image(axes[i, 0], row["centre"])
        axes[i, 0].set_title(row["label"], fontsize=8)
        for j in range(1, width):
            ax = axes[i, j]
            if j > len(chunk):
                ax.axis("off")
                continue
            m = chunk[j - 1]
            if m not in row["worst"]:
                ax.axis("off")
                ax.set_title(f"{m}\nnot run", fontsize=8)
                continue
            img, score = row["worst"][m]
            _show_image(ax, img)
            bold = row.get("not_fooled", {}).get(m, False)
            ax.set_title(score_label(m, float(score)), fontsize=8,
                         fontweight="bold" if bold else "normal")  # fmt: skip
    fig.tight_layout()
    return fig


def plot_history(histories: dict):
    """Training loss and accuracy per epoch, one line per method (``{method: history dict}``).

    CCU's objective (eq. (6)) adds the log-likelihood of the densities to the classifier's terms, so
    its loss is of another kind and scale (hundreds of nats below zero on images) than the other
    methods' cross-entropies: ``CCU`` and ``CCU-<family>`` get a loss panel of their own."""
    runs = {m: h for m, h in histories.items() if h}
    groups = [
        ("training loss (nats per example)", [m for m in runs if not m.startswith("CCU")]),
        ("CCU's objective, eq. (6) (nats)", [m for m in runs if m.startswith("CCU")]),
    ]
    groups = [g for g in groups if g[1]] or groups[:1]
    # panels side by side, each ~3.3 inches: at the book's width (~7 inches) the text keeps
    # about its size (three 5.5-inch panels were shrunk to a third: unreadable)
    n = len(groups) + 1
    fig, axes = plt.subplots(1, n, figsize=(3.3 * n, 3.0))
    for ax, (label, methods) in zip(axes[:-1], groups, strict=True):
        for m in methods:
            ax.plot(np.arange(1, len(runs[m]["loss"]) + 1), runs[m]["loss"], label=m)
        ax.set_title(label, fontsize=10)
    for m, hist in runs.items():
        axes[-1].plot(np.arange(1, len(hist["accuracy"]) + 1), hist["accuracy"], label=m)
    axes[-1].set_title("training accuracy (fraction)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("epoch")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
