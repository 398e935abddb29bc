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
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[ccu] installing ccu[book,test,workflow] into .venv (first time: a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[book,test,workflow]'
  .venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
  echo "$want" > "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# One torch thread: two competing multi-threaded processes slow down 100x on 2 cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
export MPLBACKEND=Agg PYTHONHASHSEED=0
