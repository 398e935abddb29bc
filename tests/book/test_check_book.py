"""The browser check of the built book (tools/check_book.py): what makes a page fail.

The unit tests feed it the probe's findings; the Chromium tests open small pages that reproduce
the regressions it exists for: figures drawn with Agg (no image), MathJax from a CDN with the
network cut, progress bars and errors in outputs.
"""

import base64
import io
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import check_book  # noqa: E402


def _found(**kw):
    base = dict(
        figures=[{"id": "f", "has_img": True, "natural": [600, 400], "shown": [600, 400]}],
        output_images=0,
        math_elements=2,
        math_unrendered=0,
        math_rendered=2,
        math_errors=0,
        mathjax_loaded=True,
        timed_out=False,
        text="confidence at most 1.1/M",
        outputs=["digits: 1400 train"],
        external=[],
        height=2000,
    )
    base.update(kw)
    return base


def test_a_good_page_passes():
    assert check_book.check_page(_found(), 1) == []


@pytest.mark.parametrize(
    "change, message",
    [
        ({"figures": []}, "1 figures expected, found 0"),
        (
            {"figures": [{"id": "f", "has_img": False, "natural": [0, 0], "shown": [0, 0]}]},
            "0 show a non-empty image",
        ),
        ({"output_images": 2}, "outside numbered figures"),
        ({"mathjax_loaded": False, "math_unrendered": 2}, "MathJax did not load"),
        ({"math_errors": 1}, "MathJax errors"),
        ({"text": r"the uniform \(1/M\)"}, "raw LaTeX"),
        ({"text": "a lone $x$ pair"}, "raw LaTeX"),
        ({"outputs": ["train digits:  40%|████      | 12/30 [00:01<00:02, 9.1it/s]"]}, "progress"),
        ({"outputs": ["Traceback (most recent call last):"]}, "error in an output"),
        ({"outputs": ["ValueError: bad"]}, "error in an output"),
        ({"external": ["https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"]}, "outside"),
        ({"timed_out": True}, "did not finish"),
        ({"wide": ["table: AUROC (%) Base MCD ... ODIN"]}, "its right part cut off"),
        (
            {"outputs": ["/tmp/x.py:4: UserWarning: Converting a tensor with requires_grad"]},
            "a Python warning in an output",
        ),
        (
            {
                "figures": [
                    {"id": "f", "has_img": True, "natural": [1650, 350], "shown": [700, 148]}
                ]
            },
            "too small to read",
        ),
    ],
)
def test_each_regression_fails_the_page(change, message):
    errors = check_book.check_page(_found(**change), 1)
    assert any(message in e for e in errors), errors


def test_expected_figures_come_from_the_chapter_source():
    assert check_book.expected_figures(ROOT / "book" / "two_moons.ipynb") == 1
    assert check_book.expected_figures(ROOT / "book" / "adversarial_noise.ipynb") == 3
    assert check_book.expected_figures(ROOT / "book" / "glance.ipynb") == 1
    assert check_book.expected_figures(ROOT / "book" / "field_terms.ipynb") == 1
    assert check_book.expected_figures(ROOT / "book" / "intro.md") == 0
    pages = check_book.pages_of_book(ROOT / "_build" / "html")
    assert len(pages) == 13 and all(src.exists() for src in pages.values())


# ----------------------------------------------------------------------------- in Chromium
chromium = check_book.find_chromium()
needs_chromium = pytest.mark.skipif(
    chromium is None and not os.environ.get("CI"),
    reason=f"Chromium not installed ({check_book.INSTALL_HINT})",
)


def _png() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _page(folder, name, body, head=""):
    page = folder / f"{name}.html"
    page.write_text(f"<html><head>{head}</head><body><main>{body}</main></body></html>")
    return page


def _pages() -> dict[str, tuple[str, str]]:
    """The synthetic pages of the tests below: ``{name: (body, head)}``."""
    png = _png()
    cells = "".join(f"<th>method {i}</th>" for i in range(22))
    wide = (
        '<article style="width:600px"><div style="overflow-x:auto">'
        f"<table><tr>{cells}</tr></table></div></article>"
    )
    return {
        "figure": (
            f'<figure id="fig-a"><img src="data:image/png;base64,{png}"><figcaption>A'
            "</figcaption></figure>",
            "",
        ),  # fmt: skip
        # with the Agg backend a glued figure has only its text form: no image in the figure
        "agg": (
            '<figure id="fig-a"><pre>&lt;Figure size 640x480 with 1 Axes&gt;</pre></figure>',
            "",
        ),
        "broken": ('<figure id="fig-b"><img src="missing.png"></figure>', ""),
        # what Sphinx writes by default: MathJax 3 from jsDelivr; the check cuts the network
        "cdn": (
            r'<p>uniform <span class="math notranslate nohighlight">\(1/M\)</span></p>',
            '<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js">'
            "</script>",
        ),
        "progress": (
            '<div class="cell_output"><pre>train digits: 100%|##########| 30/30 '
            "[00:03<00:00, 9.8it/s]</pre></div>",
            "",
        ),  # fmt: skip
        "wide": (wide, ""),
        "roomy": (wide.replace("width:600px", "width:4000px"), ""),
    }


@needs_chromium
def test_chromium_sees_a_real_figure_and_flags_each_regression(tmp_path):
    """Every synthetic page in one headless Chromium (a browser per page cost a second or two
    of CPU each, and a module fixture is built once per pytest-xdist worker): a real figure
    passes and is photographed; each regression is named."""
    jobs = [(_page(tmp_path, name, body, head), tmp_path / "figure.png" if name == "figure" else None)
            for name, (body, head) in _pages().items()]  # fmt: skip
    found = check_book.Browser(chromium).check_all(jobs)
    probed = {page.stem: f for (page, _), f in zip(jobs, found, strict=True)}
    # a real figure
    assert check_book.check_page(probed["figure"], 1) == []
    assert (tmp_path / "figure.png").read_bytes()[:4] == b"\x89PNG"
    # a figure drawn with Agg (its text form only), or a broken image
    for name in ("agg", "broken"):
        errors = check_book.check_page(probed[name], 1)
        assert any("0 show a non-empty image" in e for e in errors), (name, errors)
    # MathJax from a CDN: not loaded (the network is cut), raw LaTeX, a file from outside
    errors = check_book.check_page(probed["cdn"], 0)
    assert any("MathJax did not load" in e for e in errors), errors
    assert any("raw LaTeX" in e for e in errors), errors
    assert any("outside the book" in e for e in errors), errors
    # progress bars in outputs
    assert any("progress-bar" in e for e in check_book.check_page(probed["progress"], 0))
    # a 22-column table in a scrolling box narrower than itself (the book theme's wrapper) is
    # cut off at the right edge: named; the same table in a wide box passes
    assert any("its right part cut off" in e for e in check_book.check_page(probed["wide"], 0))
    assert check_book.check_page(probed["roomy"], 0) == []


@needs_chromium
def test_a_page_whose_mathjax_never_finishes_is_reported_after_the_wait(tmp_path):
    """MathJax that never calls back: the checker waits (its own clock), then the probe reports
    what the page shows, timed out (the wait only bounds a page that never finishes)."""
    head = "<script>window.MathJax = {Hub: {Queue: function () {}}};</script>"
    body = r'<p><span class="math notranslate nohighlight">\(x\)</span></p>'
    found = check_book.Browser(chromium, wait_s=1).check(_page(tmp_path, "page", body, head))
    assert found["timed_out"]
    assert any("did not finish typesetting" in e for e in check_book.check_page(found, 0))


def test_a_missing_browser_or_book_is_one_line_with_exit_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "no-chromium"))
    assert check_book.main(["--html", str(tmp_path)]) == 3
    assert "is not an executable file" in capsys.readouterr().err
    monkeypatch.delenv("CHROMIUM")
    if check_book.find_chromium() is not None:
        assert check_book.main(["--html", str(tmp_path / "none")]) == 3
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no built book" in err[0]
