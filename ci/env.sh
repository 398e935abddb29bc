# Sourced by the ci/ scripts: create .venv if missing and install the project with its extras.
# Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[ccu] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=".venv/.ccu-installed"
want="$(cat pyproject.toml ci/env.sh | sha256sum | cut -d' ' -f1)"  # either changed: again
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[ccu] installing ccu[book,test,workflow] into .venv (first time: a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[book,test,workflow]'
  # rfc3987-syntax (from jupyter-events' jsonschema[format-nongpl]) compiles 39 lark grammars
  # whenever jsonschema is imported: ~2.5 s of CPU in every process that imports nbformat,
  # papermill, snakemake or jupyter-book (dozens in the test suite). Without it jsonschema
  # only lacks its "iri" format check, which no schema of ours or of the notebook tools uses.
  .venv/bin/python -m pip uninstall --quiet -y rfc3987-syntax
  .venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
  echo "$want" > "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# One torch thread: two competing multi-threaded processes slow down 100x on 2 cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# Scripts and tests draw with Agg; the chapters switch their kernel to the inline backend
# (ccu.book.chapter.setup_chapter), so the book shows every figure.
export MPLBACKEND=Agg PYTHONHASHSEED=0
# Bytecode caches written (__pycache__, ignored by git) even where the caller's environment
# forbids them: the suite starts ~150 Python processes (CLI steps, kernels, workers), and
# without the caches each compiles ccu's modules again (~0.4 s of CPU each) and each pytest
# worker rewrites and compiles every test module again.
unset PYTHONDONTWRITEBYTECODE
# CCU_PROGRESS stays as the caller set it: the book hides progress bars with `remove-stderr`.

# Headless Chromium for tools/check_book.py: installed with apt when missing and we are root.
ensure_chromium() {
  if command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
      || [ -n "${CHROMIUM:-}" ]; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[ccu] installing chromium (apt-get) for the browser check"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "[ccu] the browser check needs Chromium: apt-get update && apt-get install -y chromium" >&2
    return 1
  fi
}
