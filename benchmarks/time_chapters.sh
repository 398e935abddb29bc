#!/usr/bin/env bash
# Times every chapter on the smoke profile with papermill, as the README runs them: per dataset a
# fresh results folder, chapters in the book's order (so the experiment chapters after
# `training` load the Base and CCU runs it saved). Appends "chapter<TAB>dataset<TAB>seconds<TAB>
# exit code" lines to OUT/times.tsv; the executed notebooks and their logs stay in OUT.
#
#   bash benchmarks/time_chapters.sh OUT DATASET...        # e.g. _build/chapter-times fmnist
#   CHAPTERS="training field_terms" bash benchmarks/time_chapters.sh OUT digits
#
# The README's table "smoke on every dataset" is benchmarks/timings/chapters_smoke_cpu.tsv.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "$1"); shift
CHAPTERS="${CHAPTERS:-theorem1 corollary1 training ood_detection adversarial_noise field_terms own_density}"
export MPLBACKEND=Agg CCU_PROGRESS=0
mkdir -p "$OUT"
for d in "$@"; do
  export CCU_RESULTS="$OUT/results-$d"
  for c in $CHAPTERS; do
    start=$(date +%s.%N)
    .venv/bin/papermill --cwd book "book/$c.ipynb" "$OUT/$c-$d.ipynb" -p dataset "$d" \
      > "$OUT/$c-$d.log" 2>&1
    rc=$?
    seconds=$(python3 -c "print(round($(date +%s.%N) - $start))")
    printf '%s\t%s\t%s\t%s\n' "$c" "$d" "$seconds" "$rc" | tee -a "$OUT/times.tsv"
  done
done
