#!/usr/bin/env bash
# Reference runs of a reduced profile on a lent GPU machine, in one call each (its own python3
# with PyTorch; the project on PYTHONPATH): `ccu run` of every method, then the reference copy.
#
#   bash tools/device_run.sh STAGE [budget seconds, stage cifar only]
#
#   stage   dataset (profile)          methods
#   smoke   digits (smoke)             all 11                            no data needed
#   mnist   mnist-offline (cpu)        all 11
#   cifar   cifar10-offline (cpu)      CCU Base OE ..., --budget-seconds (default 300)
#
# The paper's protocol does not fit one call: its runs go method by method, each final and
# committed as it finishes (tools/lease_run.sh, planned and absorbed by tools/lease.py; README,
# "Runs on a lent GPU"). The stages mnist and cifar read the data packed by
# `python tools/pack_data.py --dataset mnist-offline|cifar10-offline`, carried as
# .devdata/<dataset>/part-<k>. What comes back: $OUT/<stage>.log and $OUT/<stage>.tgz (the
# reference results, reference-results/<profile>/<dataset>/); here, `tar xzf` it and commit.
# Environment: METHODS (space-separated), DEVICE (auto), THREADS (16), OUT (/tmp/ccu-out),
# REF ($OUT/ref: where the copy is written before it is packed), CCU_RESULTS, CCU_DEVDATA,
# CCU_OFFLINE_DATA (when set: used as is, nothing gathered).
# Exit codes: 0 done; 3 data missing (carry the parts named); 2 bad usage; other: the run failed.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg CCU_PROGRESS=0
export CCU_RESULTS=${CCU_RESULTS:-/tmp/ccu-results} CCU_DATA_ROOT=${CCU_DATA_ROOT:-/tmp/ccu-dataroot}
OUT=${OUT:-/tmp/ccu-out}
THREADS=${THREADS:-16}
mkdir -p "$OUT"
ALL="Base MCD EDL DE GAN ODIN Maha ACET ACET2 OE CCU"
stage=${1:-}
budget=${2:-300}
case $stage in
  smoke) ds=digits profile=smoke methods=$ALL ;;
  mnist) ds=mnist-offline profile=cpu methods=$ALL ;;
  # most informative first: what is left when the budget runs out is skipped and recorded
  cifar) ds=cifar10-offline profile=cpu methods="CCU Base OE Maha ODIN MCD EDL GAN DE ACET ACET2" ;;
  *) echo "unknown stage '$stage': choose smoke, mnist or cifar (the paper's runs:" \
          "tools/lease_run.sh)" >&2; exit 2 ;;
esac
methods=${METHODS:-$methods}
log=$OUT/$stage.log
: >"$log"

if [ "$ds" != digits ] && [ -z "${CCU_OFFLINE_DATA:-}" ]; then
  export CCU_OFFLINE_DATA=${CCU_DEVDATA:-/tmp/ccu-devdata}/$ds
  python3 tools/pack_data.py --gather ".devdata/$ds" --into "$CCU_OFFLINE_DATA" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "device_run: no run: the data of $ds is not complete (python tools/pack_data.py" \
         "--dataset $ds)" | tee -a "$log"
    exit "$rc"
  fi
fi
extra=()
[ "$stage" = cifar ] && extra=(--budget-seconds "$budget")
# shellcheck disable=SC2086  # methods: one word per method
# the copy goes to a folder of its own: the working tree's reference-results hold the committed
# run, which a copy of another run is never written over (ccu refuses it)
REF=${REF:-$OUT/ref}
rm -rf "$REF/reference-results/$profile/$ds"
python3 -m ccu run --dataset "$ds" --profile "$profile" --method $methods --seed 0 \
  --device "${DEVICE:-auto}" --threads "$THREADS" --reference-out "$REF/reference-results" \
  "${extra[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
tar czf "$OUT/$stage.tgz" -C "$REF" "reference-results/$profile/$ds" -C "$OUT" "$stage.log" \
  2>/dev/null
exit "$rc"
