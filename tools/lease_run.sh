#!/usr/bin/env bash
# One device call of a GPU lease (on the lent machine: its own python3 with PyTorch; the project
# on PYTHONPATH). Each method runs in a lane, start to finish: train -> attack in CCU's certified
# balls -> its part (config, metrics, attack row and worst points, provenance; no weights), and
# every finished part comes back at once in $OUT/<label>-<dataset>.parts.tgz, rewritten whole
# (atomic rename) after each method, so a call cut short still brings back what finished.
#
#   bash tools/lease_run.sh DATASET METHOD...
#
# The methods' lanes are split here (lease.py call), or written out with "/" between them as
# `lease.py plan` prints them (`CCU / Base ODIN Maha / ACET`): then as given. A method written
# `MCD@50` runs as a reduced variant: 50 epochs, its own label (paper-e50) and results, its part
# in its own folder of the archive; it is attacked in the balls of the call's profile (copied
# into its results: CCU's certified regions do not depend on the method attacked in them).
# A variant that its epochs 2 and 3 say would not finish in time (`ccu train --finish-by`) starts
# again at once, once, with as many epochs as fit (FINISH_ATTACK_S, below).
#
# `python tools/lease.py plan --dataset DATASET --budget-s <budget_left_s>` prints the exact calls
# (command, carry, timeout_s) from git's state; after each call, here:
# `python tools/lease.py absorb <files_at> --dataset DATASET` commits the parts (README, "Runs on
# a lent GPU").
#
# CCU goes first in lane 1: right after its training, in the same process (`ccu train --balls`),
# it certifies and saves the balls, and every other lane waits for them before its attack.
# Without CCU in the call, the balls committed with CCU's part
# (reference-results/<label>/<dataset>/balls.json|npz) are used.
# ODIN and Maha follow Base in its lane (they are built on it). DE's members train at once, each
# in a process of its own (`ccu train --method DE --member I`; MEMBER_LANES=0: one after another
# in DE's lane); DE's own training then resumes each from its final checkpoint (and trains any
# member whose process failed).
#
# Environment: PROFILE (paper), OVERRIDES (JSON profile fields: a reduced variant, e.g.
# '{"epochs": 30}' is paper-e30, never mixed with paper), JOBS (lanes at once, default 4),
# HARD_LIMIT (seconds from the start after which every lane is stopped, default 560: the methods
# not finished by then are lost and run again in a later call), DEVICE (auto), THREADS (16),
# OUT (/tmp/ccu-out), CCU_RESULTS (/tmp/ccu-results), PARTS (/tmp/ccu-parts), REFERENCE
# (reference-results: the committed parts), CCU_INIT_CARRIED (.devinit/DATASET: CCU's carried
# initial fit, checked before CCU trains), CCU_OFFLINE_DATA (when set: used as is; else the
# data carried as .devdata/<dataset>/part-* are gathered), CCU_COMMIT=<sha> when the copied
# tree's .git is not current. LEASE_KILL_AFTER_PARTS=N ends the call like a lease that runs out
# (SIGKILL to every lane) once N parts are packed: what the tests use to cut a lease short.
# A training that would not end before HARD_LIMIT stops by itself after a saved epoch
# (`ccu train --stop-after`: HARD_LIMIT less STOP_MARGIN, 20 s, less the time spent; at most
# TRAIN_STOP_AFTER seconds when set, as the tests do; a variant's `--finish-by`: at most
# TRAIN_FINISH_BY seconds when set, as the tests do) and continues from that checkpoint in
# the next call of the same lease: the machine keeps CCU_RESULTS while it is warm (it is wiped
# after 30 s idle: a training whose machine was wiped starts over, and says so). Such a method
# sends no part; it is listed, with its epochs done, in $OUT/<label>-<dataset>.inflight
# ("METHOD EPOCHS_DONE EPOCHS SECONDS"), which `lease.py absorb` keeps for `lease.py plan --warm`.
# Its part counts the seconds of every call it trained in (train_wall_seconds, train_calls).
# Exit codes: 0 every method finished; 75 some were stopped at HARD_LIMIT (run them again);
# 3 data or balls missing, or CCU's carried fit not this machine's; 2 bad usage; other: a lane
# failed (see the log).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg CCU_PROGRESS=0
export CCU_RESULTS=${CCU_RESULTS:-/tmp/ccu-results} CCU_DATA_ROOT=${CCU_DATA_ROOT:-/tmp/ccu-dataroot}
OUT=${OUT:-/tmp/ccu-out}
PARTS=${PARTS:-/tmp/ccu-parts}
REFERENCE=$(realpath -m "${REFERENCE:-reference-results}")
PROFILE=${PROFILE:-paper}
OVERRIDES=${OVERRIDES:-}
THREADS=${THREADS:-16}
JOBS=${JOBS:-4}
HARD_LIMIT=${HARD_LIMIT:-560}
KILL_AFTER=${LEASE_KILL_AFTER_PARTS:-0}
MEMBER_LANES=${MEMBER_LANES:-1}
STOP_MARGIN=${STOP_MARGIN:-20}
TRAIN_STOP_AFTER=${TRAIN_STOP_AFTER:-}
# a reduced variant is timed over its first epochs (`ccu train --finish-by`): one that would not
# leave its attack's planned seconds (`lease.py call`; FINISH_ATTACK_S when not said) before the
# stop starts again at once with as many epochs as fit after its restart (15 s more), a
# multiple of 5 from 10 on, at least VARIANT_MIN_EPOCHS; once
FINISH_ATTACK_S=${FINISH_ATTACK_S:-120}
SCORE_S=${SCORE_S:-15}  # a training's scoring after its last epoch, or a restart's start
owed=0  # per lane: the planned seconds of its trained methods' attacks still to come
VARIANT_MIN_EPOCHS=${VARIANT_MIN_EPOCHS:-5}
TRAIN_FINISH_BY=${TRAIN_FINISH_BY:-}
for v in JOBS HARD_LIMIT STOP_MARGIN FINISH_ATTACK_S VARIANT_MIN_EPOCHS SCORE_S; do
  case ${!v} in
    '' | *[!0-9]* | 0) echo "$v must be a positive whole number, not '${!v}'" >&2; exit 2 ;;
  esac
done
case $KILL_AFTER in '' | *[!0-9]*) echo "LEASE_KILL_AFTER_PARTS must be a number" >&2; exit 2 ;; esac
[ $# -ge 2 ] || { echo "usage: bash tools/lease_run.sh DATASET METHOD..." >&2; exit 2; }
ds=$1
shift
methods=("$@")
mkdir -p "$OUT" "$PARTS"
t0=$SECONDS
# the profile's label, DE's members and the lanes (CCU alone in the first when JOBS > 1, its
# balls are what every other lane attacks in; ODIN and Maha after Base), from one process
call=$(python3 tools/lease.py call "$PROFILE" "$OVERRIDES" "$ds" --jobs "$JOBS" \
  --methods "${methods[@]}") || { echo "bad PROFILE/OVERRIDES/DATASET or lanes" >&2; exit 2; }
read -r label ensemble <<<"$call"
# reduced variants among the methods (`MCD@50`: MCD for 50 epochs, label paper-e50, its part in
# its own folder): their label and profile fields, from the same process ("@ TOKEN LABEL JSON")
declare -A vlabel=() vfields=() vattack=()
while read -r _ token vl vf va; do
  vlabel[$token]=$vl
  vfields[$token]=$vf
  vattack[$token]=$va  # its attack's and part's planned seconds: left for them after training
done < <(grep '^@ ' <<<"$call")
log=$OUT/$label-$ds.log
tgz=$OUT/$label-$ds.parts.tgz
inflight=$OUT/$label-$ds.inflight
rm -f "$inflight"
# a training's seconds and calls so far, kept on this machine between the calls of a lease
spans=$CCU_RESULTS/.lease-spans/$label-$ds
mkdir -p "$spans"
say() { echo "lease_run: $*" | tee -a "$log"; }
say "$label/$ds: ${methods[*]} in up to $JOBS lanes (hard limit ${HARD_LIMIT} s)"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
say "on ${gpu:-cpu}, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit ${CCU_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"

# the data: the parts carried in this call and earlier ones (while warm), gathered in one folder
if [ "$ds" != digits ] && [ -z "${CCU_OFFLINE_DATA:-}" ]; then
  export CCU_OFFLINE_DATA=${CCU_DEVDATA:-/tmp/ccu-devdata}/$ds
  python3 tools/pack_data.py --gather ".devdata/$ds" --into "$CCU_OFFLINE_DATA" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { say "no run: the data of $ds is not complete (python tools/pack_data.py --dataset $ds)"; exit "$rc"; }
fi

# CCU's initial fit made here before the lease (python tools/lease.py prepare), when carried:
# the build loads it instead of fitting (only if its inputs' key matches; else it fits). The
# plan counted on it: when CCU trains in this call, it is checked first against this machine's
# decode of the data (~15 s); a fit that does not match would be made again inside CCU's lane
# (~125 s on MNIST, more than the call holds, and every lane waits for CCU's balls), so the
# call stops at once instead (exit 3).
init=${CCU_INIT_CARRIED:-.devinit/$ds}
with_ccu=0
for m in "${methods[@]}"; do [ "$m" = CCU ] && with_ccu=1; done
if [ -d "$init" ]; then
  export CCU_INIT_DIR=$(realpath "$init")
  if [ "$with_ccu" = 1 ]; then
    check=(python3 tools/lease.py prepare --dataset "$ds" --profile "$PROFILE" --check)
    [ -n "$OVERRIDES" ] && check+=(--overrides "$OVERRIDES")
    "${check[@]}" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then
      say "no run: CCU's carried fit in $init is not this machine's (above); plan again without it (move $init away) or prepare it where the data decode the same"
      exit 3
    fi
  fi
fi
# every 10 epochs a line of how far each training got: a call cut short still measures
export CCU_EPOCH_LOG=${CCU_EPOCH_LOG:-10}
# epoch checkpoints every 25 epochs and after the last, not after each (speed: no weights
# travel between leases); a training that stops for time (above) saves the epoch it stops
# after all the same, which the next call of the lease continues from (DE's own training
# resumes its members from their last)
export CCU_CHECKPOINT_EVERY=${CCU_CHECKPOINT_EVERY:-25}

adv=$CCU_RESULTS/$label/$ds/seed0/adversarial
ref=$REFERENCE/$label/$ds
if [ "$with_ccu" = 1 ]; then
  rm -f "$adv/balls.json"  # none left from an earlier call: this call's CCU certifies them
elif [ -f "$ref/balls.json" ] && [ -f "$ref/balls.npz" ]; then
  # the committed balls: a part attacked in others would not be absorbed
  mkdir -p "$adv" && cp "$ref/balls.npz" "$adv/" && cp "$ref/balls.json" "$adv/"
  say "attacks in the committed balls of $ref"
elif [ -f "$adv/balls.json" ] && [ -f "$adv/balls.npz" ]; then
  # an earlier call of this lease certified them on this machine, and this call was made at
  # once, before they were committed: absorbed with CCU's part, which brings them
  say "attacks in the balls an earlier call certified on this machine"
else
  say "no balls: run CCU in this call, or commit its part with balls.npz first"
  exit 3
fi

threads=$((THREADS / JOBS > 0 ? THREADS / JOBS : 1))
common=(--dataset "$ds" --profile "$PROFILE" --seed 0 --device "${DEVICE:-auto}" --no-progress
        --threads "$threads")
# the profile fields of the method a lane runs now: the call's, or its reduced variant's
fields=$OVERRIDES
export OMP_NUM_THREADS=$threads CCU_LANES=$JOBS
lanes=$(mktemp -d)
tail -n +2 <<<"$call" | grep -v '^@ ' >"$lanes/lanes"

pack() {  # lane k: its staged parts join the others, all in one archive replaced atomically
  (
    flock 9
    cp -r "$lanes/stage-$k/." "$PARTS/" &&
      for dir in "$PARTS"/*/*/; do  # each folder's sha256 sums: absorb checks every file
        (cd "$dir" && find . -maxdepth 1 -type f ! -name '.*' ! -name table1.json \
          ! -name figure2.npz ! -name 'SHA256SUMS*' -printf '%P\0' | sort -z |
          xargs -0 -r sha256sum >SHA256SUMS.tmp && mv -f SHA256SUMS.tmp SHA256SUMS) ||
          { echo "lease_run: packing failed (the sha256 sums of $dir)" >&2; exit 1; }
      done &&
      tar czf "$tgz.tmp" --exclude='*/.[!.]*' --exclude=table1.json --exclude=figure2.npz \
        -C "$PARTS" . &&
      mv -f "$tgz.tmp" "$tgz" || { echo "lease_run: packing failed" >&2; exit 1; }
    n=$(find "$PARTS" -name '*.attack.json' | wc -l)
    if [ "$KILL_AFTER" -gt 0 ] && [ "$n" -ge "$KILL_AFTER" ]; then
      echo "lease_run: LEASE_KILL_AFTER_PARTS=$KILL_AFTER: the lease ends here" >>"$log"
      kill -KILL 0
    fi
  ) 9>"$PARTS.lock"
}

one() {  # one step of a lane, cut at the hard limit
  local left=$((HARD_LIMIT - (SECONDS - t0)))
  [ "$left" -gt 0 ] || return 124
  local more=()
  [ -n "$fields" ] && more=(--overrides "$fields")
  timeout -s INT -k 20 "$left" python3 -m ccu "$@" "${common[@]}" ${more[@]+"${more[@]}"}
}

variant() {  # the profile fields of lane token $1 (the call's for a method, else its variant's)
  fields=${vfields[$1]:-$OVERRIDES}
}

borrow_balls() {  # a reduced variant (token $1) is attacked in the balls of the call's profile
  local vl=${vlabel[$1]:-}
  [ -n "$vl" ] || return 0
  local vadv=$CCU_RESULTS/$vl/$ds/seed0/adversarial f
  mkdir -p "$vadv" || return 1
  # each file replaced whole (another lane's variant of the same label may be reading them),
  # and not at all when it is the same; balls.json, the marker, last
  for f in balls.npz balls.json; do
    cmp -s "$adv/$f" "$vadv/$f" && continue
    cp "$adv/$f" "$vadv/.$f.$k.tmp" && mv -f "$vadv/.$f.$k.tmp" "$vadv/$f" || return 1
  done
}

train() {  # lane k: one training, stopped after a saved epoch before the hard limit (75)
  local m=$1 rc  # a method, or a variant's token (`MCD@50`)
  shift
  variant "$m"
  local until=$((HARD_LIMIT - STOP_MARGIN - (SECONDS - t0)))
  [ "$until" -gt 0 ] || return 124
  [ -n "$TRAIN_STOP_AFTER" ] && until=$TRAIN_STOP_AFTER
  local by=()
  if [ -n "${vlabel[$m]:-}" ] && [ -z "${resized[$m]:-}" ]; then  # a variant, not yet resized
    # its attack, the attacks of the lane's trained methods still waiting for the balls
    # (they go first), and its scoring after the last epoch (SCORE_S)
    local finish=$((${until%.*} - ${vattack[$m]:-$FINISH_ATTACK_S} - owed - SCORE_S))
    [ -n "$TRAIN_FINISH_BY" ] && finish=$TRAIN_FINISH_BY
    [ "${finish%.*}" -gt 0 ] 2>/dev/null || [ -n "$TRAIN_FINISH_BY" ] && by=(--finish-by "$finish")
  fi
  one train --method "${m%%@*}" --stop-after "$until" ${by[@]+"${by[@]}"} "$@" 2>&1 |
    tee "$lanes/train-$m.out"
  rc=${PIPESTATUS[0]}
  # a training that continued from this machine's checkpoint adds to the seconds and calls
  # kept from the calls before; one that started afresh starts them again
  grep -q "continues from its epoch checkpoint" "$lanes/train-$m.out" || rm -f "$spans/$m"
  return "$rc"
}

declare -A resized=()
resize() {  # variant token $1 would not finish (`not in time`): the token that fits, in $new
  local m=$1 es n0 left n line
  es=$(grep -oE "not in time: [0-9.]+ s an epoch" "$lanes/train-$m.out" | tail -1 | cut -d' ' -f4)
  [ -n "$es" ] || return 1
  n0=${m##*@}
  # its restart (process, data: as long as its scoring), epochs, scoring, its attack and those
  # waiting before it
  left=$((HARD_LIMIT - STOP_MARGIN - (SECONDS - t0) - ${vattack[$m]:-$FINISH_ATTACK_S} - owed - 2 * SCORE_S))
  # 5 % to spare on the measured epochs; a multiple of 5 from 10 on; fewer than before
  n=$(awk -v l="$left" -v e="$es" -v n0="$n0" 'BEGIN { n = int(l / (1.05 * e));
    if (n >= 10) n -= n % 5; if (n >= n0) n = n0 - 1; print (n > 0 ? n : 0) }')
  if [ "$n" -lt "$VARIANT_MIN_EPOCHS" ]; then
    echo "lease_run: $m would not finish in this call ($es s an epoch), not even at $VARIANT_MIN_EPOCHS epochs"
    return 1
  fi
  new=${m%%@*}@$n
  line=$(python3 tools/lease.py call "$PROFILE" "$OVERRIDES" "$ds" --jobs 1 --methods "$new" |
    grep '^@ ') || return 1
  read -r _ _ "vlabel[$new]" "vfields[$new]" "vattack[$new]" <<<"$line"
  resized[$new]=$m
  echo "lease_run: $m would not finish in this call ($es s an epoch): it runs as $new instead"
}

spanned() {  # "SECONDS CALLS" of method $1 with this call's $2 seconds
  local before=0 calls=0
  [ -f "$spans/$1" ] && read -r before calls <"$spans/$1"
  echo "$((before + $2)) $((calls + 1))"
}

await() {  # wait for file $1 unless $2 appears first (then 3) or the hard limit passes (124)
  while [ ! -f "$1" ]; do
    [ -f "$2" ] && return 3
    [ $((HARD_LIMIT - (SECONDS - t0))) -gt 0 ] || return 124
    sleep 2
  done
}

finish() {  # lane k: attack a trained method in the balls, write its part, send it with the rest
  local m=$1 rc  # a method, or a variant's token
  variant "$m"
  borrow_balls "$m" || { echo "1 $m (the balls could not be copied for its variant)" >"$lanes/rc-$k"; return 1; }
  # one process: the attack, then the part (`ccu attack --part-out`, as `ccu part` writes it)
  read -r wall calls <"$lanes/train-seconds-$m"
  CCU_TRAIN_WALL_SECONDS=$wall CCU_TRAIN_CALLS=$calls \
    one attack --method "${m%%@*}" --part-out "$lanes/stage-$k" ||
    { echo "$? $m attack (or its part)" >"$lanes/rc-$k"; return 1; }
  if [ "$with_ccu" = 1 ] && [ "$m" != CCU ]; then  # CCU's part (with the balls) goes first
    await "$lanes/ccu-packed" "$lanes/ccu-ended"
    rc=$?
    [ "$rc" = 0 ] || { echo "$rc $m (CCU's part, its balls, did not come)" >"$lanes/rc-$k"; return 1; }
  fi
  pack || { echo "1 $m pack" >"$lanes/rc-$k"; return 1; }
  [ "$m" = CCU ] && : >"$lanes/ccu-packed"
  echo "lease_run: $m finished at $((SECONDS - t0)) s"
  rm -f "$spans/$m"  # sent: a later call of the lease trains it afresh, if ever
  if [ "$m" = CCU ]; then  # its guarantees (GAUC) join its part once it is sent
    CCU_TRAIN_WALL_SECONDS=$wall CCU_TRAIN_CALLS=$calls \
      one evaluate --method CCU --guarantees --part-out "$lanes/stage-$k" >/dev/null && pack
  fi
  return 0
}

k=0
while read -r lane; do
  k=$((k + 1))
  mkdir -p "$lanes/stage-$k"
  (
    # CCU's lane says when it ends, however it ends: the others stop waiting for its balls
    case " $lane " in *" CCU "*) trap ': >"$lanes/ccu-ended"' EXIT ;; esac
    # train one method after another; attack each at once when the balls are there, else
    # after the lane's last training, once CCU's lane has certified them
    pending=()
    owed=0  # planned seconds of the pending methods' attacks (each FINISH_ATTACK_S)
    for m in $lane; do
      began=$SECONDS
      if [ "${m%%@*}" = DE ] && [ "$MEMBER_LANES" = 1 ]; then  # every member at once, then DE
        members=()
        variant "$m"
        for i in $(seq 0 $((ensemble - 1))); do
          one train --method DE --member "$i" &
          members+=($!)
        done
        wait "${members[@]}"  # a failed member is trained again by DE's own training below
      fi
      if [ "$m" = CCU ]; then  # its balls certified and saved right after, in the same process
        train CCU --balls
      else
        train "$m"
      fi
      rc=$?
      if [ "$rc" = 75 ] && resize "$m"; then  # a variant sized anew from its measured epochs
        m=$new
        began=$SECONDS
        train "$m"
        rc=$?
      fi
      if [ "$rc" = 75 ]; then  # stopped after a saved epoch: the next call continues it
        spanned "$m" $((SECONDS - began)) >"$spans/$m"
        read -r secs _ <"$spans/$m"
        epochs_done=$(grep -oE "after [0-9]+ of [0-9]+" "$lanes/train-$m.out" | tail -1 | cut -d' ' -f2,4)
        echo "$m ${epochs_done:-0 0} $secs" >"$lanes/inflight-$m"
        echo "75 $m stopped for time after epoch ${epochs_done%% *}: continues in the next call" >"$lanes/rc-$k"
        exit
      fi
      [ "$rc" = 0 ] || { echo "$rc $m train$([ "$m" = CCU ] && echo ' (or its balls)')" >"$lanes/rc-$k"; exit; }
      # the members' time included; CCU's: its balls too (one process); earlier calls' too
      spanned "$m" $((SECONDS - began)) >"$lanes/train-seconds-$m"
      if [ -f "$adv/balls.json" ] && [ ${#pending[@]} = 0 ]; then
        finish "$m" || exit
      else
        pending+=("$m")
        owed=$((owed + FINISH_ATTACK_S))
      fi
    done
    for m in ${pending[@]+"${pending[@]}"}; do
      await "$adv/balls.json" "$lanes/ccu-ended"  # CCU's lane certifies them
      rc=$?
      if [ "$rc" = 3 ] && [ -f "$lanes/inflight-CCU" ]; then  # CCU continues next call
        echo "75 $m trained; attacked in the next call, in the balls CCU certifies then" >"$lanes/rc-$k"
        exit
      fi
      [ "$rc" = 0 ] || { echo "$rc $m (no balls: CCU's lane ended without them)" >"$lanes/rc-$k"; exit; }
      finish "$m" || exit
    done
    echo 0 >"$lanes/rc-$k"
  ) >>"$lanes/log-$k" 2>&1 &
done <"$lanes/lanes"
wait
rc=0
for j in $(seq 1 "$k"); do
  read -r lrc what <"$lanes/rc-$j" 2>/dev/null || lrc=1 what="(died without saying)"
  say "lane $j ($(sed -n "${j}p" "$lanes/lanes")): exit $lrc ${what:-}"
  sed "s/^/  [lane $j] /" "$lanes/log-$j" >>"$log"
  case $lrc in
    0) ;;
    75 | 124 | 130 | 137) [ "$rc" = 0 ] && rc=75 ;;
    *) rc=$lrc ;;
  esac
done
if compgen -G "$lanes/inflight-*" >/dev/null; then
  { echo "# $label $ds"; cat "$lanes"/inflight-*; } >"$inflight"
  say "in flight on this machine (continued by the next call while it is warm): $(tail -n +2 "$inflight" | paste -sd,)"
fi
rm -rf "$lanes"
say "$label/$ds: $(find "$PARTS" -name '*.attack.json' | wc -l) parts in $tgz after $((SECONDS - t0)) s (exit $rc)"
exit "$rc"
