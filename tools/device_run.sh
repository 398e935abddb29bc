#!/usr/bin/env bash
# Reference runs on a lent GPU machine (its own python3 with PyTorch; the project on PYTHONPATH).
#
#   bash tools/device_run.sh STAGE [budget seconds, stage cifar only]
#
#   stage         dataset (profile)                  methods
#   smoke         digits (smoke)                      all 11                       no data needed
#   mnist         mnist-offline (cpu)                 all 11
#   cifar         cifar10-offline (cpu)               CCU Base OE ..., --budget-seconds (300)
#   mnist-paper   mnist (paper; LeNet)                all 11                       time-boxed
#   fmnist-paper  fmnist (paper; ResNet18)            all 11, CCU Base OE first    time-boxed
#   cifar-paper   cifar10-jpeg (paper; ResNet18,      CCU Base OE                  time-boxed
#                 Tiny ImageNet out-distribution)
#   smoke-resume  digits (smoke, tiny)                Base CCU                     time-boxed; the
#                 paper stages' machinery in seconds, on any machine (tests/test_time_box.py)
# Every stage but smoke* reads the data packed by tools/pack_data.py --dataset <its dataset>
# (mnist-offline, cifar10-offline, mnist, fmnist, cifar10-jpeg), carried as below.
#
# Time-boxed stages run `ccu run --stop-after $STOP_AFTER` (default 480 s): the run stops at the
# next safe point (between methods, before the attack, after a saved epoch) with exit code 75,
# keeping per-method results and checkpoints in $CCU_RESULTS (/tmp/ccu-results), which stays on
# the machine while it is warm; the same stage run again resumes there. At $HARD_LIMIT (560 s)
# the run gets SIGINT (atomic writes: nothing half-written) so that a call always ends inside its
# 10 minutes with its files. Only small files come back: $OUT/<stage>.log and $OUT/<stage>.tgz
# (checked < 16 MiB) with reference-results/<profile>/<dataset>/ once the run is done, and
# progress/ (the per-method JSON files so far) on every call.
#
# A session's device calls (30 min of device time; 10 min per call; a machine stays warm ~30 s
# after a call, and what is on it stays only while it is warm):
#   1. here, once:  python tools/pack_data.py --dataset mnist    # fmnist, cifar10-jpeg
#      packs exactly the mirror files the run needs into .devdata/<dataset>/part-<k>/ (ignored)
#      and prints the carry entry of each call: mnist and fmnist fit one call, cifar10-jpeg
#      (85.8 MiB) takes two.
#   2. device call: command "bash tools/device_run.sh mnist-paper", timeout_s 600,
#      carry [".devdata/mnist/part-1"]. A dataset in two parts: the first call carries part-1
#      and only gathers it (exit 3, "carry [...part-2]"); the next call, at once, carries part-2
#      and starts the run. The parts gather in $CCU_DEVDATA/<dataset> (/tmp/ccu-devdata).
#   3. exit 75 "stopped for time": make the same call again at once (no carry needed while the
#      machine is warm). Repeat until it prints "done" (exit 0).
#   After EVERY call, here: python tools/device_state.py absorb <files_at> --stage mnist-paper
#      Each call sends back, besides the log and <stage>.tgz, the state it made that earlier
#      calls have not sent (trained models, epoch checkpoints; <stage>.state-*.part, at most
#      what fits beside the other files of a call: the small files, then what brings back the
#      most device seconds) and <stage>.ledger.json; absorb keeps them in .devstate/<stage>/
#      (ignored). A later lease on a fresh machine resumes from them instead of starting over:
#      `python tools/device_state.py plan --stage mnist-paper --dataset mnist --budget-s
#      <budget_left_s> --jobs 4` prints the calls, their carry lists (data parts, the ledger,
#      state batches, fewest calls within 64 MiB each) and their limits (timeout_s, STOP_AFTER,
#      HARD_LIMIT from the device time left); the run starts once all have come (exit 3 before).
#   4. here: tar xzf <files_at>/mnist-paper.tgz, then commit reference-results/paper/mnist/
#      (table1.json, per-method config and metrics, radii.csv, figure2.npz, data_manifest.json:
#      commit, device, torch version, data sha256, wall time per method).
#
# Reduced-epoch variant, where 100 epochs do not fit: EPOCHS=30 bash tools/device_run.sh
# mnist-paper (or OVERRIDES='{"epochs": 30}'). The profile is then named paper-e30
# (ccu.config.profile_label): its results live in $CCU_RESULTS/paper-e30/ and
# reference-results/paper-e30/<dataset>/, never among the paper profile's.
#
# Several processes on one GPU: JOBS=4 bash tools/device_run.sh mnist-paper trains the methods
# in 4 lanes at once (tools/device_lanes.py splits them; each lane runs `ccu train
# --stop-after` per method, THREADS/JOBS CPU threads each), then one `ccu run` loads them all
# and attacks. Same results folders, same exit codes, same resumption as JOBS=1 (the default).
#
# The lease's last minutes: when a call's log says "N still on the device only" (state that did
# not fit the call's 64 MiB back), SEND_ONLY=1 bash tools/device_run.sh mnist-paper trains
# nothing and sends the next share of it (seconds; exit 75); absorb it as after every call. A
# method too big for one call (DE: five LeNets, 62.5 MiB) comes back in parts over such calls.
# RESEND=1 (with carry [".devstate/<stage>/ledger.json"], the ledger as absorbed here) sends
# again all that ledger lacks: after a call whose files were not absorbed (absorb says so).
#
# Environment: STOP_AFTER, HARD_LIMIT, JOBS, METHODS (space-separated), EPOCHS or OVERRIDES (JSON),
# SEND_ONLY (0), RESEND (0), DEVICE (auto), THREADS (16), REFERENCE_OUT (reference-results),
# CCU_RESULTS, CCU_DEVDATA, CCU_OFFLINE_DATA (when set: used as is, nothing gathered), DEVSTATE
# (.devstate: the carried state), CCU_DEVSTATE (/tmp/ccu-devstate: where its batches gather),
# CCU_COMMIT=<sha> when the copied tree's .git is not current (the results record the commit).
# Exit codes: 0 done; 75 stopped for time, run the same stage again; 3 data or state missing
# (carry the parts named); 2 bad usage; anything else: the run failed (see the log).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg CCU_PROGRESS=0
export CCU_RESULTS=${CCU_RESULTS:-/tmp/ccu-results} CCU_DATA_ROOT=${CCU_DATA_ROOT:-/tmp/ccu-dataroot}
OUT=${OUT:-/tmp/ccu-out}
REFERENCE_OUT=$(realpath -m "${REFERENCE_OUT:-reference-results}")
THREADS=${THREADS:-16}
JOBS=${JOBS:-1}
STOP_AFTER=${STOP_AFTER:-480}
HARD_LIMIT=${HARD_LIMIT:-560}
case $JOBS in
  '' | *[!0-9]* | 0) echo "JOBS must be a positive integer (processes at once), not '$JOBS'" >&2; exit 2 ;;
esac
SEND_ONLY=${SEND_ONLY:-0} RESEND=${RESEND:-0}
case $SEND_ONLY in
  0 | 1) ;;
  *) echo "SEND_ONLY must be 0 or 1 (1: train nothing, only send the state), not '$SEND_ONLY'" >&2; exit 2 ;;
esac
case $RESEND in
  0 | 1) ;;
  *) echo "RESEND must be 0 or 1 (1: send again all the carried ledger lacks), not '$RESEND'" >&2; exit 2 ;;
esac
case $HARD_LIMIT in
  '' | *[!0-9]* | 0) echo "HARD_LIMIT must be a positive whole number of seconds, not '$HARD_LIMIT'" >&2; exit 2 ;;
esac
awk -v s="$STOP_AFTER" 'BEGIN { exit !(s + 0 > 0 && s ~ /^[0-9]*\.?[0-9]+$/) }' ||
  { echo "STOP_AFTER must be a positive number of seconds, not '$STOP_AFTER'" >&2; exit 2; }
TGZ_LIMIT=$((16 * 1024 * 1024))
mkdir -p "$OUT"
ALL="Base MCD EDL DE GAN ODIN Maha ACET ACET2 OE CCU"
stage=${1:-}
budget=${2:-300}
overrides=${OVERRIDES:-}
if [ -n "${EPOCHS:-}" ]; then
  [ -z "$overrides" ] || { echo "give EPOCHS or OVERRIDES, not both" >&2; exit 2; }
  overrides="{\"epochs\": $EPOCHS}"
fi
case $stage in
  smoke) ds=digits profile=smoke methods=$ALL kind=reference ;;
  mnist) ds=mnist-offline profile=cpu methods=$ALL kind=reference ;;
  # most informative first: what is left when the budget runs out is skipped and recorded
  cifar) ds=cifar10-offline profile=cpu methods="CCU Base OE Maha ODIN MCD EDL GAN DE ACET ACET2"
         kind=reference ;;
  mnist-paper) ds=mnist profile=paper methods=$ALL kind=timeboxed ;;
  fmnist-paper) ds=fmnist profile=paper kind=timeboxed
                methods="CCU Base OE Maha ODIN MCD EDL GAN DE ACET ACET2" ;;
  cifar-paper) ds=cifar10-jpeg profile=paper methods="CCU Base OE" kind=timeboxed ;;
  smoke-resume) ds=digits profile=smoke methods="Base CCU" kind=timeboxed
                overrides=${overrides:-'{"epochs": 2, "n_train": 400, "n_centres": 8, "attack_steps": 5, "attack_restarts": 1}'} ;;
  *) echo "unknown stage '$stage': choose smoke, mnist, cifar, mnist-paper, fmnist-paper," \
          "cifar-paper or smoke-resume" >&2; exit 2 ;;
esac
methods=${METHODS:-$methods}
log=$OUT/$stage.log
: >"$log"
say() { echo "device_run: $*" | tee -a "$log"; }

# the data: parts carried in this call and earlier ones (while warm) gathered in one folder;
# a time-boxed stage gathers its carried state too before it stops for what is missing (a
# call of the plan may carry state batches while a data part is still to come)
data_rc=0
if [ "$ds" != digits ] && [ -z "${CCU_OFFLINE_DATA:-}" ]; then
  export CCU_OFFLINE_DATA=${CCU_DEVDATA:-/tmp/ccu-devdata}/$ds
  python3 tools/pack_data.py --gather ".devdata/$ds" --into "$CCU_OFFLINE_DATA" 2>&1 | tee -a "$log"
  data_rc=${PIPESTATUS[0]}
  if [ "$data_rc" != 0 ]; then
    say "no run: the data of $ds is not complete (pack it: python tools/pack_data.py --dataset $ds)"
    [ "$kind" = timeboxed ] || exit "$data_rc"
  fi
fi

if [ "$kind" = reference ]; then
  extra=()
  [ "$stage" = cifar ] && extra=(--budget-seconds "$budget")
  # shellcheck disable=SC2086  # methods: one word per method
  python3 -m ccu run --dataset "$ds" --profile "$profile" --method $methods --seed 0 \
    --device auto --threads "$THREADS" --reference-out "$PWD/reference-results" "${extra[@]}" \
    2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  tar czf "$OUT/$stage.tgz" reference-results "$log" 2>/dev/null
  exit "$rc"
fi

# a fresh machine resumes from the state earlier leases sent back (tools/device_state.py):
# carried as .devstate/<stage>/ledger.json and its batch-<k> folders
DEVSTATE=${DEVSTATE:-.devstate}
if [ -f "$DEVSTATE/$stage/ledger.json" ]; then
  python3 tools/device_state.py restore --stage "$stage" --carried "$DEVSTATE/$stage" \
    --results "$CCU_RESULTS" --gather "${CCU_DEVSTATE:-/tmp/ccu-devstate}/$stage" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { say "no run: the carried state is not complete (see above)"; exit "$rc"; }
fi
[ "$data_rc" = 0 ] || exit "$data_rc"

# the profile's name: paper, or paper-e30 &c. when overrides change it; the trained methods lie
# under the name of its training fields alone (train_label: the same unless the attack changes)
labels=$(python3 -c 'import json, sys
from ccu.config import get_profile
p = get_profile(sys.argv[1], sys.argv[3], **json.loads(sys.argv[2] or "{}"))
print(p.label, p.training_label)' "$profile" "$overrides" "$ds") ||
  { say "bad OVERRIDES: $overrides"; exit 2; }
read -r label train_label <<<"$labels"
t0=$SECONDS
left() { awk -v s="$STOP_AFTER" -v e=$((SECONDS - t0)) 'BEGIN { print s - e }'; }
spent() { awk -v l="$1" 'BEGIN { exit !(l <= 0) }'; }
rc=0
worked=0
if [ "$SEND_ONLY" = 1 ]; then
  say "$stage: SEND_ONLY=1: no training, no attack; only the state not sent yet"
  rc=75
elif [ "$JOBS" -gt 1 ]; then
  # lanes: JOBS processes at once on the GPU, each training its methods one after another
  # (ccu train --stop-after, tools/device_lanes.py); then one ccu run loads them and attacks
  lane_threads=$((THREADS / JOBS > 0 ? THREADS / JOBS : 1))
  targs=(train --dataset "$ds" --profile "$profile" --seed 0 --device "${DEVICE:-auto}"
         --threads "$lane_threads" --no-progress)
  [ -n "$overrides" ] && targs+=(--overrides "$overrides")
  lanes=$(mktemp -d)
  # shellcheck disable=SC2086  # methods: one word per method
  python3 tools/device_lanes.py --jobs "$JOBS" --methods $methods >"$lanes/lanes" || exit 2
  k=0
  while read -r lane; do
    k=$((k + 1))
    (
      lrc=0 lworked=0
      # the CPU's share of this lane, for torch and for scikit-learn's EM (OpenMP, BLAS)
      export OMP_NUM_THREADS=$lane_threads
      for m in $lane; do
        t=$(left)
        if spent "$t"; then
          # every lane makes progress in a call, however short its time: one saved epoch
          [ "$lworked" = 1 ] && { lrc=75; break; }
          t=0.001
        fi
        hard=$((HARD_LIMIT - (SECONDS - t0)))
        [ "$hard" -gt 0 ] || { lrc=75; break; }
        timeout -s INT -k 20 "$hard" python3 -m ccu "${targs[@]}" --method "$m" --stop-after "$t" \
          >"$lanes/out-$k" 2>&1
        mrc=$?
        cat "$lanes/out-$k" >>"$lanes/log-$k"
        case $mrc in
          0) grep -q ": trained in" "$lanes/out-$k" && lworked=1 ;;
          75 | 124 | 130 | 137) lrc=75 lworked=1; break ;;  # stopped; 137: killed after SIGINT
          *) lrc=$mrc; break ;;
        esac
      done
      echo "$lrc $lworked" >"$lanes/rc-$k"
    ) &
  done <"$lanes/lanes"
  wait
  for j in $(seq 1 "$k"); do
    say "lane $j ($(sed -n "${j}p" "$lanes/lanes")): exit $(cut -d' ' -f1 "$lanes/rc-$j")"
    sed "s/^/  [lane $j] /" "$lanes/log-$j" | tee -a "$log"
    lrc=1 lworked=0  # a lane that died without saying: a failure
    [ -f "$lanes/rc-$j" ] && read -r lrc lworked <"$lanes/rc-$j"
    [ "$lworked" = 1 ] && worked=1
    if [ "$lrc" != 0 ] && [ "$lrc" != 75 ]; then rc=$lrc; elif [ "$lrc" = 75 ] && [ "$rc" = 0 ]; then rc=75; fi
  done
  rm -rf "$lanes"
fi
if [ "$rc" = 0 ]; then
  t=$(left)
  if spent "$t"; then
    [ "$worked" = 1 ] && rc=75  # the lanes used the time: the attack comes in the next call
    t=0.001
  fi
fi
if [ "$JOBS" -gt 1 ] && [ "$SEND_ONLY" = 0 ]; then
  # the lanes in the run's calls: table1.json's wall time and calls include them
  then_run=0
  [ "$rc" = 0 ] && then_run=1
  python3 -c 'import json, sys
from ccu.config import get_profile
from ccu.steps import record_lanes_call
ds, profile, overrides, seconds, rc, jobs, then_run = sys.argv[1:]
profile = get_profile(profile, ds, **json.loads(overrides or "{}"))
record_lanes_call(profile, ds, 0, float(seconds), f"lanes (exit {rc})", int(jobs), then_run == "1")' \
    "$ds" "$profile" "$overrides" $((SECONDS - t0)) "$rc" "$JOBS" "$then_run" 2>&1 | tee -a "$log"
fi
if [ "$rc" = 0 ]; then
  args=(run --dataset "$ds" --profile "$profile" --seed 0 --device "${DEVICE:-auto}"
        --threads "$THREADS" --no-progress --stop-after "$t" --reference-out "$REFERENCE_OUT")
  [ -n "$overrides" ] && args+=(--overrides "$overrides")
  # shellcheck disable=SC2206  # methods: one word per method
  args+=(--method $methods)
  hard=$((HARD_LIMIT - (SECONDS - t0)))
  if [ "$hard" -gt 0 ]; then
    say "$stage: ccu ${args[*]} (profile $label; results in $CCU_RESULTS; SIGINT in ${hard} s)"
    timeout -s INT -k 20 "$hard" python3 -m ccu "${args[@]}" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
  else
    rc=75
  fi
fi

# bring back small files: the reference results once done, the per-method JSON files so far
ref=$REFERENCE_OUT/$label/$ds
items=()
if [ "$rc" = 0 ] && [ -d "$ref" ]; then
  manifest=${CCU_OFFLINE_DATA:-}/MANIFEST.json
  [ -f "$manifest" ] && cp "$manifest" "$ref/data_manifest.json"
  items+=(-C "$(dirname "$REFERENCE_OUT")" "$(basename "$REFERENCE_OUT")/$label/$ds")
fi
work=$(mktemp -d)
for name in $(printf '%s\n' "$label" "$train_label" | sort -u); do
  [ -d "$CCU_RESULTS/$name/$ds" ] || continue
  (cd "$CCU_RESULTS" && find "$name/$ds" -type f \( -name '*.json' -o -path '*/tables/*' \) \
    ! -name 'config.pending.json' -size -2M) | while read -r f; do
    mkdir -p "$work/progress/$(dirname "$f")" && cp "$CCU_RESULTS/$f" "$work/progress/$f"
  done
done
mkdir -p "$work/progress"
tar czf "$OUT/$stage.tgz" -C "$work" progress "${items[@]}"
if [ "$(stat -c %s "$OUT/$stage.tgz")" -gt "$TGZ_LIMIT" ]; then
  say "$OUT/$stage.tgz is over 16 MiB: sending it without progress/"
  tar czf "$OUT/$stage.tgz" -C "$work" --exclude='progress/*' progress "${items[@]}"
fi
rm -rf "$work"
# the state (models, checkpoints) not yet sent: the small files, then what brings back the most
# device seconds, as much as fits (tools/device_state.py)
send_args=()
[ -f "$DEVSTATE/$stage/ledger.json" ] && send_args=(--ledger "$DEVSTATE/$stage/ledger.json")
[ "$RESEND" = 1 ] && send_args+=(--forget-sent)
python3 tools/device_state.py send --results "$CCU_RESULTS" --stage "$stage" --out "$OUT" \
  --names "$label/$ds" "$train_label/$ds" "${send_args[@]}" 2>&1 | tee -a "$log"
case $rc in
  0) say "$stage done: $ref in $OUT/$stage.tgz" ;;
  75) if [ "$SEND_ONLY" = 1 ]; then
        say "$stage: sent what fits; SEND_ONLY=1 again for more, or without it to train on"
      else
        say "$stage stopped for time; run the same stage again to continue (resumes while this" \
            "machine is warm)"
      fi ;;
  124 | 130 | 137) say "$stage interrupted at the hard limit (${HARD_LIMIT} s); finished work is saved;" \
                "run the same stage again to continue"; rc=75 ;;
  *) say "$stage failed (exit $rc); see $log" ;;
esac
exit "$rc"
