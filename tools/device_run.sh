#!/usr/bin/env bash
# Reference runs on a lent GPU machine (its own python3 with PyTorch; the project on PYTHONPATH).
# Usage: bash tools/device_run.sh smoke|mnist|cifar [budget seconds for cifar]
# Needs the offline mirrors in $CCU_OFFLINE_DATA (default .devdata/: `cp -r ../shared/data .devdata`,
# git-ignored; pass it in the device call's carry list, since ../shared does not travel).
# Writes $OUT/<stage>.tgz with reference-results/ and the logs. Set CCU_COMMIT=<sha> when the
# copied tree's .git is not current (the results record the commit).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg CCU_PROGRESS=0
export CCU_OFFLINE_DATA=${CCU_OFFLINE_DATA:-$PWD/.devdata} CCU_RESULTS=${CCU_RESULTS:-/tmp/ccu-results}
OUT=${OUT:-/tmp/ccu-out}
mkdir -p "$OUT"
ALL="Base MCD EDL DE GAN ODIN Maha ACET ACET2 OE CCU"
stage=$1
case $stage in
  smoke) args=(--dataset digits --profile smoke --methods $ALL) ;;
  mnist) args=(--dataset mnist-offline --profile cpu --methods $ALL) ;;
  # most informative first: what is left when the budget runs out is skipped and recorded
  cifar) args=(--dataset cifar10-offline --profile cpu --budget-seconds "${2:-300}"
               --methods CCU Base OE Maha ODIN MCD EDL GAN DE ACET ACET2) ;;
  *) echo "unknown stage $stage: choose smoke, mnist or cifar" >&2; exit 2 ;;
esac
python3 tools/reference_run.py "${args[@]}" --threads 16 2>&1 | tee "$OUT/$stage.log"
rc=${PIPESTATUS[0]}
tar czf "$OUT/$stage.tgz" reference-results "$OUT/$stage.log" 2>/dev/null
exit "$rc"
