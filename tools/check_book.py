"""Open every page of the built book in headless Chromium, with the network cut, and check it.

For each HTML page of ``_build/html`` (the chapters and the other pages of ``_toc.yml``):

* figures: as many numbered figures with a loaded, non-empty image as the chapter's source asks
  for (``{glue:figure}`` and ``{figure}`` directives in its Markdown cells);
* math: every MathJax-marked element rendered by MathJax, none with a MathJax error, and no raw
  ``\\(``, ``\\[``, ``$`` or ``\\begin{`` left in the text outside code;
* outputs: no progress-bar fragments (tqdm), no ``Traceback`` or ``Error`` in cell outputs;
* nothing loaded from outside the book (the browser's network is cut: a dead proxy).

It works on the DOM after scripts have run: one headless Chromium (the system's, driven by
Playwright: no browser download) opens each page with a probe script that waits for MathJax,
measures the page and writes its findings as JSON into the DOM; the same loaded page is then
photographed, full width, to ``_build/screenshots/<page>.png`` (at most 30,000 pixels high).
Each page is loaded once (Chromium's command line needs a process for the DOM and another for
the screenshot of each page: twice the time).

Usage: ``python tools/check_book.py [--html _build/html] [--screenshots _build/screenshots]``.
Exit status 1 lists every failed check; 2 says how to install Chromium when it is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE_ID = "ccu-book-probe"
INSTALL_HINT = "apt-get update && apt-get install -y chromium"

# Runs in the page: waits for MathJax (if the page loads it) and images, then reports as JSON.
PROBE_JS = r"""
(function () {
  var reported = false;
  function report(timedOut) {
    if (reported) return;
    reported = true;
    var main = document.querySelector("main") || document.body;
    var figures = [];
    main.querySelectorAll("figure").forEach(function (f) {
      var img = f.querySelector("img");
      var r = img ? img.getBoundingClientRect() : null;
      var cap = f.querySelector("figcaption");
      figures.push({
        id: f.id || (f.querySelector("[id]") || {}).id || "",
        has_img: !!img,
        natural: img ? [img.naturalWidth, img.naturalHeight] : [0, 0],
        shown: r ? [Math.round(r.width), Math.round(r.height)] : [0, 0],
        caption: cap ? cap.innerText.trim().slice(0, 120) : ""
      });
    });
    var loose = main.querySelectorAll(".cell_output img").length;
    var math = main.querySelectorAll(".math.notranslate");  // what Sphinx marked as math
    var unrendered = 0;
    math.forEach(function (m) {
      if (!m.querySelector(".MathJax, .MathJax_Display, .MathJax_SVG, mjx-container")) unrendered++;
    });
    var rendered = main.querySelectorAll(".MathJax, .MathJax_SVG, mjx-container").length;
    var mathErrors = main.querySelectorAll(".MathJax .merror, .MathJax_Error, mjx-merror").length;
    var clone = main.cloneNode(true);
    clone.querySelectorAll("pre, code, script, style, .MathJax_Preview").forEach(function (n) { n.remove(); });
    var outputs = [];
    main.querySelectorAll(".cell_output").forEach(function (o) { outputs.push(o.innerText); });
    var external = performance.getEntriesByType("resource")
      .map(function (e) { return e.name; })
      .filter(function (u) { return !/^(file|data|blob|about):/.test(u); });
    document.querySelectorAll("script[src], link[href]").forEach(function (n) {
      var u = n.src || n.href;
      if (u && /^https?:/.test(u)) external.push(u);
    });
    // wide elements: tables and math wider than the article's column, or scrolled/clipped by
    // a container (the reader does not see their right part, e.g. CCU's column)
    var article = main.querySelector("article") || main;
    var right = article.getBoundingClientRect().right;
    var wide = [];
    main.querySelectorAll("table, mjx-container, .MathJax_Display, .MathJax_SVG_Display, div.math").forEach(function (el) {
      if (el.closest("pre, .highlight")) return;
      var clipped = el.getBoundingClientRect().right > right + 2;
      for (var p = el.parentElement; p && p !== article.parentElement && !clipped; p = p.parentElement) {
        var ox = getComputedStyle(p).overflowX;
        if ((ox === "auto" || ox === "scroll" || ox === "hidden") && p.scrollWidth > p.clientWidth + 2) clipped = true;
      }
      if (clipped) wide.push(el.tagName.toLowerCase() + ": " + (el.innerText || el.textContent || "").replace(/\s+/g, " ").trim().slice(0, 80));
    });
    var out = document.createElement("pre");
    out.id = "%(probe_id)s";
    out.textContent = JSON.stringify({
      title: document.title,
      figures: figures,
      output_images: loose,
      math_elements: math.length,
      math_unrendered: unrendered,
      math_rendered: rendered,
      math_errors: mathErrors,
      mathjax_loaded: typeof window.MathJax !== "undefined" && !!window.MathJax.Hub,
      text: clone.innerText,
      outputs: outputs,
      wide: wide,
      external: external,
      timed_out: !!timedOut,
      height: Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)
    });
    document.body.appendChild(out);
  }
  function whenMathDone() {
    if (window.MathJax && window.MathJax.Hub && window.MathJax.Hub.Queue) {
      window.MathJax.Hub.Queue(function () { setTimeout(function () { report(false); }, 200); });
    } else {
      setTimeout(function () { report(false); }, 500);
    }
  }
  window.addEventListener("load", function () { setTimeout(whenMathDone, 300); });
  // MathJax never finished: the checker calls this after its wait (seconds of the machine's
  // time, not of the page's: a loaded machine is not mistaken for a broken page)
  window.ccuProbeTimedOut = function () { report(true); };
})();
""".replace("%(probe_id)s", PROBE_ID)

TQDM = re.compile(r"\d+%\|[^\n]*\||\d+(\.\d+)?(it/s|s/it)\]|\|\s*\d+/\d+ \[")
ERROR = re.compile(r"Traceback|\b\w*Error\b")
# a Python warning printed into an output (``UserWarning: ...``, ``ConvergenceWarning: ...``)
WARNING = re.compile(r"\b\w*Warning: ")
#: a figure shown at less than this fraction of its pixel width: its text (10-point at the
#: figure's dpi) is below ~6 points on the page, too small to read
MIN_FIGURE_SCALE = 0.6
# a "$" left in the text is a dollar-math delimiter MyST did not pair: broken math
RAW_MATH = ("\\(", "\\)", "\\[", "\\]", "$", "\\begin{")


def find_chromium() -> str | None:
    """The Chromium binary (``CHROMIUM`` overrides the search)."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


#: Chromium's flags: the network is cut (every http(s) request goes to a closed local port and
#: fails; file:// pages need none), and nothing runs in the background
CHROMIUM_FLAGS = [
    "--disable-gpu",
    "--hide-scrollbars",
    "--allow-file-access-from-files",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--proxy-server=http://127.0.0.1:9",
]
#: the widest screenshot's height (the API page is ~90,000 pixels high)
MAX_SHOT_HEIGHT = 30000


class Browser:
    """Headless Chromium (the system's binary, driven by Playwright) for checking pages.

    ``Browser(binary).check_all([(page, shot), ...])`` starts one browser, loads each page once
    with the probe in a tab of its own (``tabs`` at once: a page mostly waits for its scripts),
    saves its screenshot to ``shot`` (unless None) and returns the probe's findings, in order.
    """

    def __init__(self, binary: str, width: int = 1280, wait_s: float = 180.0, tabs: int = 4):
        self.binary, self.width, self.tabs = binary, width, tabs
        self.wait_ms = int(wait_s * 1000)

    def check(self, page: Path, shot: Path | None = None) -> dict:
        """The probe's findings for one page (and its screenshot to ``shot``)."""
        return self.check_all([(page, shot)])[0]

    def check_all(self, jobs) -> list[dict]:
        # Playwright, not Chromium's command line: one browser loads a page once for both its
        # DOM and its screenshot (the command line does one of the two per process)
        return asyncio.run(self._check_all(list(jobs)))

    async def _check_all(self, jobs):
        from playwright.async_api import async_playwright

        flags = list(CHROMIUM_FLAGS)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=self.binary, headless=True, args=flags
            )
            try:
                at_once = asyncio.Semaphore(self.tabs)

                async def one(page, shot):
                    async with at_once:
                        return await self._check(browser, Path(page), shot)

                return await asyncio.gather(*(one(page, shot) for page, shot in jobs))
            finally:
                await browser.close()

    async def _check(self, browser, page: Path, shot: Path | None) -> dict:
        page = page.resolve()
        tab = await browser.new_page(viewport={"width": self.width, "height": 900})
        try:
            await tab.add_init_script(PROBE_JS)
            await tab.goto(page.as_uri(), wait_until="load", timeout=self.wait_ms)
            probe = f"#{PROBE_ID}"
            try:
                await tab.wait_for_selector(probe, state="attached", timeout=self.wait_ms)
            except Exception:  # Playwright's TimeoutError: report what there is, timed out
                await tab.evaluate("window.ccuProbeTimedOut()")
            found = json.loads(await tab.text_content(probe))
            if shot is not None:
                await tab.evaluate(f"document.getElementById('{PROBE_ID}').remove()")
                shot = Path(shot).resolve()
                shot.parent.mkdir(parents=True, exist_ok=True)
                height = max(600, min(int(found["height"]), MAX_SHOT_HEIGHT))
                await tab.set_viewport_size({"width": self.width, "height": height})
                await tab.screenshot(path=str(shot))
                if not shot.is_file() or shot.stat().st_size == 0:
                    raise RuntimeError(f"no screenshot written for {page}")
            return found
        finally:
            await tab.close()


def expected_figures(source: Path) -> int:
    """Figures a chapter's source asks for: ``{glue:figure}`` and ``{figure}`` directives."""
    if source.suffix == ".ipynb":
        nb = json.loads(source.read_text(encoding="utf-8"))
        text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    else:
        text = source.read_text(encoding="utf-8")
    return len(re.findall(r"^\s*(```+|:::+)\{(glue:figure|figure)\}", text, re.M))


def check_page(found: dict, n_figures: int) -> list[str]:
    """The failed checks of one page (an empty list: the page is fine)."""
    errors = []
    good = [
        f
        for f in found["figures"]
        if f["has_img"] and min(f["natural"]) > 0 and min(f["shown"]) > 0
    ]
    if len(found["figures"]) != n_figures or len(good) != n_figures:
        errors.append(
            f"{n_figures} figures expected, found {len(found['figures'])} of which "
            f"{len(good)} show a non-empty image: {found['figures']}"
        )
    if found["output_images"]:
        errors.append(f"{found['output_images']} images in cell outputs outside numbered figures")
    if found["math_elements"]:
        if not found["mathjax_loaded"]:
            errors.append("the page has math but MathJax did not load")
        if found["math_unrendered"]:
            errors.append(
                f"{found['math_unrendered']} of {found['math_elements']} math elements "
                "not rendered by MathJax"
            )
    if found["timed_out"]:
        errors.append("MathJax did not finish typesetting within the time budget")
    if found["math_errors"]:
        errors.append(f"{found['math_errors']} MathJax errors")
    raw = [s for s in RAW_MATH if s in found["text"]]
    if raw:
        i = min(found["text"].find(s) for s in raw)
        errors.append(f"raw LaTeX {raw} in the text: ...{found['text'][max(0, i - 60) : i + 60]!r}")
    for f in good:
        scale = f["shown"][0] / f["natural"][0]
        if scale < MIN_FIGURE_SCALE:
            errors.append(
                f"figure {f['id'] or f['caption'][:40]!r} shown at {scale:.2f} of its width: its "
                "text is too small to read (make the figure narrower)"
            )
    for what in found.get("wide", []):
        errors.append(f"wider than the page's column, its right part cut off: {what!r}")
    for text in found["outputs"]:
        if WARNING.search(text):
            i = WARNING.search(text).start()
            errors.append(f"a Python warning in an output: {text[max(0, i - 60) : i + 100]!r}")
        if TQDM.search(text):
            errors.append(f"progress-bar text in an output: {TQDM.search(text).group(0)!r}")
        if ERROR.search(text):
            i = ERROR.search(text).start()
            errors.append(f"error in an output: {text[max(0, i - 80) : i + 80]!r}")
    if found["external"]:
        errors.append(f"resources from outside the book: {sorted(set(found['external']))[:5]}")
    return errors


def pages_of_book(html: Path) -> dict[Path, Path]:
    """Built page -> its source, for every page of ``_toc.yml``."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part.get("chapters", [])]
    pages = {}
    for f in files:
        src = next(
            (ROOT / f"{f}{ext}" for ext in (".ipynb", ".md") if (ROOT / f"{f}{ext}").is_file()),
            None,
        )
        if src is None:
            raise FileNotFoundError(f"no source for {f} in _toc.yml")
        pages[html / f"{f}.html"] = src
    return pages


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--screenshots", type=Path, default=ROOT / "_build" / "screenshots")
    ap.add_argument("--report", type=Path, default=None, help="write the findings as JSON")
    args = ap.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print(f"[check_book] Chromium not found; install it with: {INSTALL_HINT}", file=sys.stderr)
        return 3
    if not (Path(binary).is_file() and os.access(binary, os.X_OK)):
        print(f"[check_book] CHROMIUM={binary} is not an executable file; point it at Chromium "
              f"or unset it ({INSTALL_HINT})", file=sys.stderr)  # fmt: skip
        return 3
    if not (args.html / "book").is_dir():
        print(f"[check_book] no built book in {args.html}: build it first (bash ci/build_book.sh)",
              file=sys.stderr)  # fmt: skip
        return 3
    failures, summary = {}, {}
    pages = pages_of_book(args.html)

    def name_of(page: Path) -> str:
        return page.relative_to(args.html).with_suffix("").as_posix()

    def shot_of(page: Path) -> Path:
        return args.screenshots / f"{name_of(page).replace('/', '_')}.png"

    built = [page for page in pages if page.is_file()]
    probed = Browser(binary).check_all((page, shot_of(page)) for page in built)
    findings = dict(zip(built, probed, strict=True))
    for page, source in pages.items():
        name = name_of(page)
        if page not in findings:
            failures[name] = [f"{page} was not built"]
            continue
        found, shot, n_fig = findings[page], shot_of(page), expected_figures(source)
        errors = check_page(found, n_fig)
        summary[name] = {
            "figures": len(found["figures"]),
            "expected_figures": n_fig,
            "math_rendered": found["math_rendered"],
            "screenshot": str(shot),
            "errors": errors,
        }
        status = "ok" if not errors else "FAILED"
        print(
            f"[check_book] {name}: {len(found['figures'])}/{n_fig} figures, "
            f"{found['math_elements']} math elements ({found['math_unrendered']} unrendered), "
            f"screenshot {shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot}: {status}"
        )
        if errors:
            failures[name] = errors
    if args.report:
        args.report.write_text(json.dumps(summary, indent=2))
    for name, errors in failures.items():
        for e in errors:
            print(f"[check_book] {name}: {e}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
