#!/usr/bin/env bash
# Benchmark of the regression gate itself (`perfkit check`), on this machine.
#
# 1. False failures: RUNS profiled runs of the same binary (the reference trainer on the CPU, a
#    short fixed workload), then `perfkit check` on every pair (RUNS*(RUNS-1)/2 pairs, one run per
#    side) at the default settings. Also the largest step-time change seen between two runs, and
#    3-vs-3 checks over interleaved triples of the same runs.
# 2. Detection: a known per-step delay (`train --step-delay-us`, 2, 5, 10, 20 and 50 % of the median
#    step of phase 1) is injected into candidate runs, interleaved with fresh baseline runs
#    (base, cand, base, cand, ...), and checked with 1 run per side (each adjacent pair) and with
#    3 runs per side (disjoint triples).
#
# Prints a Markdown table. Usage:
#   bench/gate.sh [--runs N] [--steps N] [--pairs N]
# (defaults: 20 runs, 100 steps per run, 6 interleaved base/candidate pairs per delay).
# Everything is written under target/bench-gate/ (deleted and recreated on each run).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
work="$target_dir/bench-gate"
runs=20
steps=100
pairs=6
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --pairs) pairs="$2"; shift 2 ;;
    *) echo "bench/gate.sh: unknown argument $1 (expected --runs N, --steps N, --pairs N)" >&2; exit 2 ;;
  esac
done

cargo build --release --quiet -p perfkit -p perfkit-kernels --bins --manifest-path "$root/Cargo.toml"
perfkit="$target_dir/release/perfkit"
train="$target_dir/release/train"
# The workload: the default model (784 -> 1024 -> 10, batch 256), batches generated inline (no
# loader threads to fight over two cores); a run takes a few seconds.
workload=(--device cpu --steps "$steps" --workers 0 --log-every 1000)

rm -rf "$work"
mkdir -p "$work"
cd "$work"

profile() { # DIR [extra trainer args]
  local dir="$1"; shift
  "$perfkit" profile --quiet --no-lint --out "$dir" -- "$train" "${workload[@]}" "$@" >/dev/null 2>"$dir.err" \
    || { echo "profiling $dir failed:" >&2; cat "$dir.err" >&2; exit 1; }
}

# `perfkit check` exit status (0 pass, 1 fail) and the step-time change it printed.
check() { # --baseline ... --candidate ...
  local out rc=0
  out="$("$perfkit" check "$@")" || rc=$?
  if [ "$rc" -gt 1 ]; then echo "perfkit check $* failed with $rc:" >&2; echo "$out" >&2; exit 1; fi
  local change
  change="$(printf '%s\n' "$out" | sed -n 's/^median step time: .*(\([-+][0-9.]*\)% of the baseline step).*/\1/p')"
  echo "$rc $change"
}

start=$(date +%s)
echo "phase 1: $runs runs of the same binary ($steps steps each)" >&2
for i in $(seq -w 0 $((runs - 1))); do profile "same$i"; done
medians=()
for i in $(seq -w 0 $((runs - 1))); do
  medians+=("$(sed -n 's/.*"median_ns": *\([0-9]*\).*/\1/p' "same$i/summary.json" | head -1)")
done
median_step_ns="$(printf '%s\n' "${medians[@]}" | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : int((v[NR/2]+v[NR/2+1])/2)}')"

# Every pair, the earlier run as the baseline; then the same pairs the other way round.
fails=0; total=0; rfails=0; maxup=0
for i in $(seq 0 $((runs - 1))); do
  for j in $(seq $((i + 1)) $((runs - 1))); do
    a="same$(printf %02d "$i")"; b="same$(printf %02d "$j")"
    read -r rc change < <(check --baseline "$a" --candidate "$b")
    total=$((total + 1)); fails=$((fails + rc))
    maxup="$(awk -v a="$maxup" -v c="$change" 'BEGIN {print (c > a) ? c : a}')"
    read -r rc change < <(check --baseline "$b" --candidate "$a")
    rfails=$((rfails + rc))
    maxup="$(awk -v a="$maxup" -v c="$change" 'BEGIN {print (c > a) ? c : a}')"
  done
done
fails3=0; total3=0
for k in $(seq 0 $((runs - 6))); do
  b=(); c=()
  for o in 0 2 4; do b+=("same$(printf %02d $((k + o)))"); c+=("same$(printf %02d $((k + o + 1)))"); done
  read -r rc _ < <(check --baseline "${b[@]}" --candidate "${c[@]}")
  total3=$((total3 + 1)); fails3=$((fails3 + rc))
done

echo "phase 2: injected delays, $pairs interleaved base/candidate pairs per delay" >&2
rows=()
for pct in 2 5 10 20 50; do
  delay_us=$((median_step_ns * pct / 100 / 1000))
  for p in $(seq 0 $((pairs - 1))); do
    profile "base$pct-$p"
    profile "cand$pct-$p" --step-delay-us "$delay_us"
  done
  hit1=0; meas=()
  for p in $(seq 0 $((pairs - 1))); do
    read -r rc change < <(check --baseline "base$pct-$p" --candidate "cand$pct-$p")
    hit1=$((hit1 + rc)); meas+=("$change")
  done
  hit3=0; n3=0
  for g in $(seq 0 3 $((pairs - 3))); do
    read -r rc _ < <(check --baseline "base$pct-$g" "base$pct-$((g + 1))" "base$pct-$((g + 2))" \
      --candidate "cand$pct-$g" "cand$pct-$((g + 1))" "cand$pct-$((g + 2))")
    hit3=$((hit3 + rc)); n3=$((n3 + 1))
  done
  mean_change="$(printf '%s\n' "${meas[@]}" | awk '{s += $1} END {printf "%+.1f", s / NR}')"
  rows+=("| +$pct % ($delay_us us/step) | $mean_change % | $hit1 / $pairs | $hit3 / $n3 |")
done
elapsed=$(( $(date +%s) - start ))

echo
echo "Workload: \`train ${workload[*]}\` under \`perfkit profile\`, release build; median step $((median_step_ns / 1000)) us; $(nproc) cores; $elapsed s in all."
echo
echo "| same binary, default settings | checks | failed (false failures) |"
echo "|---|---|---|"
echo "| 1 run per side, every pair of $runs runs (earlier run as baseline) | $total | $fails |"
echo "| 1 run per side, the same pairs the other way round | $total | $rfails |"
echo "| 3 runs per side, interleaved triples of the same runs | $total3 | $fails3 |"
echo
echo "Largest slowdown between two runs of the same binary (either order): +${maxup#+} % of the baseline step; run-to-run standard deviation of the per-run medians: $(printf '%s\n' "${medians[@]}" | awk '{s += $1; q += $1 * $1} END {m = s / NR; printf "%.1f", sqrt((q - NR * m * m) / (NR - 1)) / m * 100}') %."
echo
echo "| injected delay | mean measured change (1 vs 1) | detected, 1 run per side | detected, 3 runs per side |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
