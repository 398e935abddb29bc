"""Sphinx extension: serve MathJax from the book itself, so equations render without network.

MathJax 2.7 comes from the ``jupyter-server-mathjax`` package (a dependency of the ``book``
extra). At ``builder-inited`` its files are copied into ``_static/mathjax`` of the HTML output and
``mathjax_path`` points there; the in-page configuration is MathJax 2's (the package's combined TeX input
and HTML-CSS output, with its STIX web fonts), restricted to the elements MyST marks as math.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MATHJAX_DIR = "mathjax"

MATHJAX2_CONFIG = {
    # the package ships MathJax's combined configuration (TeX input and HTML-CSS output inside)
    "config": ["TeX-AMS-MML_HTMLorMML-full.js"],
    "TeX": {
        "extensions": [
            "AMSmath.js",
            "AMSsymbols.js",
            "noErrors.js",
            "noUndefined.js",
        ]
    },
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processEscapes": True,
        "processEnvironments": True,
        # as myst-parser does for MathJax 3: only what MyST marked as math, plus cell outputs
        "processClass": "tex2jax_process|mathjax_process|math|output_area",
        "ignoreClass": "tex2jax_ignore|mathjax_ignore",
    },
    "HTML-CSS": {
        "availableFonts": [],
        "preferredFont": None,
        "webFont": "STIX-Web",
        "imageFont": None,
    },
    "showMathMenu": False,
    "messageStyle": "none",
}


def mathjax_source() -> Path:
    """The directory holding ``MathJax.js`` in the installed ``jupyter-server-mathjax``."""
    try:
        import jupyter_server_mathjax
    except ImportError as exc:  # the book extra installs it
        raise RuntimeError(
            "offline MathJax needs the jupyter-server-mathjax package: "
            "pip install -e '.[book]' (ci/env.sh does)."
        ) from exc
    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (src / "MathJax.js").is_file():
        raise RuntimeError(f"no MathJax.js in {src}")
    return src


def _configure(app, config) -> None:
    config.mathjax_path = f"{MATHJAX_DIR}/MathJax.js"
    config.mathjax2_config = MATHJAX2_CONFIG


def _drop_mathjax3_config(app) -> None:
    # myst-parser fills mathjax3_config at builder-inited; with MathJax 2 it would only add a
    # stray `window.MathJax = {...}` object to every page.
    app.config.mathjax3_config = None
    if app.builder.format == "html":
        target = Path(app.outdir) / "_static" / MATHJAX_DIR
        shutil.copytree(mathjax_source(), target, dirs_exist_ok=True)


def setup(app):
    app.setup_extension("sphinx.ext.mathjax")
    app.connect("config-inited", _configure)
    app.connect("builder-inited", _drop_mathjax3_config, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
