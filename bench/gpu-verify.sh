#!/usr/bin/env bash
# Verifies perfkit's GPU paths on a machine with an NVIDIA GPU and a CUDA 13 driver that has no
# Rust toolchain, in two halves:
#
#   bench/gpu-verify.sh pack        # where cargo is: release binaries and the GPU test executables
#                                   # -> target/gpu-bundle/ (kept under 60 MiB)
#   bench/gpu-verify.sh run OUTDIR  # on the GPU machine, in a copy of this repository that has
#                                   # target/gpu-bundle/: every GPU test, the trainer's benchmark
#                                   # table, profiled runs of the trainer (tuned and each
#                                   # anti-pattern), `perfkit check` over them and the PyTorch
#                                   # fixtures -> OUTDIR/log.txt, OUTDIR/bench.txt, OUTDIR/runs.tgz
#
# Test executables built by cargo name their data by absolute build paths, so `run` links the
# build machine's repository path to the copy it runs in when the two differ (this needs the
# right to create that path, e.g. root). `run` keeps going after a failed step and ends with a
# table of every step's outcome; its exit status is 1 when any step failed.
# GPU_VERIFY_DEVICE=cpu runs the trainer steps on the CPU: a dry run of the script itself.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bundle=target/gpu-bundle

# The GPU test targets (cargo test names) and what each checks.
GPU_TESTS=(
  "gpu_kernels:every CUDA kernel against its CPU twin, the GPU trainer's falling loss"
  "cuda_recorder:recorded bytes, event times inside the host timeline, no extra synchronization"
  "cuda_bandwidth:pinned vs pageable host-to-device bandwidth"
  "gpu:the trainer through CUPTI injection vs its own trace: copies, module kernels by name, cuBLAS kernels and stream/event syncs bounded below"
  "real_cupti:the system's libcupti is found, version-checked and its callbacks named"
  "nvrtc_compile:NVRTC compiles every kernel to a CUBIN (PTX only for unknown targets)"
  "inject_cli:the PyTorch fixtures under perfkit profile"
  "devices_cli:perfkit devices against the driver"
)

pack() {
  set -e
  local packages=(-p perfkit -p perfkit-kernels -p perfkit-profiler -p perfkit-inject)
  cargo build --release "${packages[@]}"
  local json
  json=$(mktemp)
  cargo test --release --no-run "${packages[@]}" --message-format=json >"$json"
  rm -rf "$bundle"
  mkdir -p "$bundle/target/release/deps"
  for f in perfkit train libperfkit_inject.so; do
    cp "target/release/$f" "$bundle/target/release/$f"
  done
  # One executable per GPU test target, the newest build of each.
  local names=()
  for t in "${GPU_TESTS[@]}"; do names+=("${t%%:*}"); done
  python3 - "$json" "$bundle/target/release/deps" "${names[@]}" <<'EOF'
import json, os, shutil, sys
log, dest, names = sys.argv[1], sys.argv[2], set(sys.argv[3:])
found = {}
for line in open(log):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    if "test" in t["kind"] and t["name"] in names:
        found[t["name"]] = m["executable"]
missing = names - found.keys()
if missing:
    sys.exit("gpu-verify: no test executable for " + ", ".join(sorted(missing)))
for name, exe in sorted(found.items()):
    shutil.copy2(exe, os.path.join(dest, os.path.basename(exe)))
    print(f"  {name}: {os.path.basename(exe)}")
EOF
  rm -f "$json"
  # The trainer keeps its line tables, compressed (call sites are resolved to source lines,
  # and the symboliser reads compressed sections); the rest only needs its symbols.
  strip --strip-debug "$bundle"/target/release/deps/* "$bundle/target/release/perfkit" \
    "$bundle/target/release/libperfkit_inject.so"
  objcopy --compress-debug-sections=zlib "$bundle/target/release/train"
  printf '%s\n' "$root" >"$bundle/build-root"
  local size
  size=$(du -sm "$bundle" | cut -f1)
  echo "gpu-verify: $bundle is ${size} MiB"
  if [ "$size" -gt 60 ]; then
    echo "gpu-verify: the bundle is over 60 MiB" >&2
    exit 1
  fi
}

# Library directories of the CUDA toolkit (NVRTC, CUPTI) where they usually are.
cuda_library_path() {
  local dirs=()
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda-13*/lib64 \
    /usr/local/cuda-13*/extras/CUPTI/lib64; do
    [ -d "$d" ] && dirs+=("$d")
  done
  local IFS=:
  echo "${dirs[*]}"
}

device=${GPU_VERIFY_DEVICE:-cuda}
declare -a OUTCOMES=()
step() {
  local name=$1
  shift
  echo
  echo "==== $name: $*"
  local start=$SECONDS
  "$@"
  local rc=$?
  OUTCOMES+=("$(printf '%-34s %-4s %5ss' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" $((SECONDS - start)))")
  return 0
}

# `perfkit check` must exit with $1.
check_exits() {
  local want=$1
  shift
  target/release/perfkit check "$@"
  local rc=$?
  echo "perfkit check exited $rc (expected $want)"
  [ "$rc" -eq "$want" ]
}

# The trainer's own "(X ms/step)" figure from a command's output.
ms_per_step() {
  "$@" 2>&1 | sed -n 's/.*(\([0-9.]*\) ms\/step).*/\1/p' | tail -1
}

# Mean step time of the trainer bare, recording itself under perfkit profile, and recording
# itself with the CUPTI injection beside it; appended to $2 as a table.
overhead() {
  local runs=$1 table=$2
  local args=(--device "$device" --steps 300)
  local bare linked injected
  bare=$(ms_per_step target/release/train "${args[@]}")
  linked=$(ms_per_step target/release/perfkit profile --no-inject --out "$runs/overhead-linked" \
    -- target/release/train "${args[@]}")
  injected=$(ms_per_step target/release/perfkit profile --inject --out "$runs/overhead-injected" \
    -- target/release/train "${args[@]}")
  [ -n "$bare" ] && [ -n "$linked" ] && [ -n "$injected" ] || {
    echo "no step time from one of the runs: bare '$bare', linked '$linked', injected '$injected'"
    return 1
  }
  {
    echo
    echo "| trainer, 300 steps | ms/step | vs bare |"
    echo "|---|---:|---:|"
    awk -v b="$bare" -v l="$linked" -v i="$injected" 'BEGIN {
      printf "| bare (no recording) | %.3f | 1.000 |\n", b
      printf "| perfkit-profiler (linked) | %.3f | %.3f |\n", l, l / b
      printf "| linked + CUPTI injection | %.3f | %.3f |\n", i, i / b
    }'
  } | tee -a "$table"
}

run() {
  local out=${1:?usage: bench/gpu-verify.sh run OUTDIR}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  exec > >(tee "$out/log.txt") 2>&1
  [ -f "$bundle/build-root" ] || {
    echo "gpu-verify: $bundle is missing: run \`bench/gpu-verify.sh pack\` where cargo is"
    exit 2
  }
  local build_root
  build_root=$(cat "$bundle/build-root")
  if [ "$build_root" != "$root" ] && [ ! -e "$build_root" ]; then
    mkdir -p "$(dirname "$build_root")" && ln -s "$root" "$build_root" ||
      echo "gpu-verify: cannot link $build_root to $root: tests that read fixtures will fail"
  fi
  cp -a "$bundle/target/." target/
  export LD_LIBRARY_PATH="$(cuda_library_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local cupti
  cupti=$(find /usr/local/cuda*/ -name 'libcupti.so*' 2>/dev/null | sort | tail -1)
  export PERFKIT_TEST_CUPTI=${PERFKIT_TEST_CUPTI:-$cupti}
  local runs
  runs=$(mktemp -d)

  step "machine" sh -c 'nvidia-smi; uname -a'
  # First: the kernels must load. The trainer must not fall back to the CPU on a GPU machine
  # (a CUBIN for the device's sm_XX loads whatever NVRTC's minor version; PTX from an NVRTC
  # newer than the driver does not).
  step "nvrtc vs driver" sh -c 'nvidia-smi --query-gpu=driver_version,compute_cap --format=csv;
    ls -l $(echo "$LD_LIBRARY_PATH" | tr : "\n" | sed "s|\$|/libnvrtc.so*|") 2>/dev/null || true'
  step "auto trains on the GPU" bash -c \
    'out=$(target/release/train --device auto --steps 5 2>&1) || { echo "$out"; exit 1; }
     echo "$out"; ! grep -q "training on the CPU" <<<"$out"'
  step "perfkit devices" sh -c 'target/release/perfkit devices && target/release/perfkit devices --json'
  local t exe
  for t in "${GPU_TESTS[@]}"; do
    exe=$(ls -t target/release/deps/"${t%%:*}"-* 2>/dev/null | head -1)
    step "test ${t%%:*}" "${exe:-missing-test-executable-${t%%:*}}" --include-ignored --test-threads=1 --nocapture
  done
  # The injection's exit path: the flusher stopped in time, nothing dropped or undecodable.
  step "inject exit clean" bash -c \
    "out=\$(target/release/perfkit profile --inject --out '$runs/inject-exit' -- \
       target/release/train --device $device --steps 200 2>&1) || { echo \"\$out\"; exit 1; }
     echo \"\$out\"; ! grep -E 'did not stop within|could not be decoded|CUPTI dropped' <<<\"\$out\""
  step "train --bench" bash -o pipefail -c "target/release/train --bench | tee '$out/bench.txt'"

  # The tuned trainer and each anti-pattern, about 50 steps each, as fixture traces.
  local name args
  for name in tuned readback-every-step sync-every-step cpu-then-copy alloc-every-step \
    per-sample-upload pageable; do
    args=(--device "$device" --steps 50)
    [ "$name" = tuned ] || args+=("--$name")
    step "profile $name" target/release/perfkit profile --out "$runs/$name" -- \
      target/release/train "${args[@]}"
  done
  step "profile readback+pageable" target/release/perfkit profile --out "$runs/readback-pageable" \
    -- target/release/train --device "$device" --steps 100 --readback-every-step --pageable
  step "check anti vs tuned fails" check_exits 1 --baseline "$runs/tuned" \
    --candidate "$runs/readback-pageable"
  step "check tuned vs itself passes" check_exits 0 --baseline "$runs/tuned" \
    --candidate "$runs/tuned"
  step "overhead table" overhead "$runs" "$out/bench.txt"
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    for name in train_bad train_good; do
      step "python $name" target/release/perfkit profile --out "$runs/python-$name" -- \
        python3 "fixtures/python/$name.py"
    done
    step "python frames train_bad" python_frames "$runs/python-train_bad" \
      fixtures/python/train_bad.py
    local depth
    for depth in 0 32; do
      step "python overhead depth $depth" python_overhead "$depth" "$runs" "$out/bench.txt"
    done
  else
    echo "gpu-verify: no PyTorch with CUDA here: the PyTorch fixtures were not run"
  fi

  # Chrome traces are large and rebuilt by `perfkit report`; keep the rest.
  find "$runs" -name 'trace.chrome.json' -delete
  tar -czf "$out/runs.tgz" -C "$runs" .
  echo
  echo "==== outcomes"
  local failed=0 line
  for line in "${OUTCOMES[@]}"; do
    echo "$line"
    case "$line" in *" FAIL "*) failed=1 ;; esac
  done
  echo "runs: $out/runs.tgz ($(du -h "$out/runs.tgz" | cut -f1))"
  return $failed
}

# The runtime findings of a profiled Python fixture point at the script's own lines: PK101 at
# its `total += loss.item()` line and PK303 at a line of the script (not inside torch), and the GPU
# flamegraph shows the script's frames.
python_frames() {
  python3 - "$1" "$2" <<'CHECK'
import json, os, sys
run, script = sys.argv[1], sys.argv[2]
name = os.path.basename(script)
lines = open(script).read().splitlines()
item = next(i + 1 for i, l in enumerate(lines) if "+= loss.item()" in l)
summary = json.load(open(os.path.join(run, "summary.json")))
found = {(f["code"], f.get("location") or "") for f in summary["findings"] if f["origin"] == "runtime"}
print("runtime findings:", sorted(found))
ok = True
if not any(c == "PK101" and l.endswith(f"{name}:{item}") for c, l in found):
    print(f"FAIL: no PK101 at {name}:{item}")
    ok = False
if not any(c == "PK303" and f"{name}:" in l for c, l in found):
    print(f"FAIL: no PK303 at a line of {name}")
    ok = False
folded = open(os.path.join(run, "stacks-gpu.folded")).read()
if f"{name}:" not in folded:
    print(f"FAIL: no frame of {name} in stacks-gpu.folded")
    ok = False
sys.exit(0 if ok else 1)
CHECK
}

# Wall time of train_bad.py (200 steps) under perfkit profile with PERFKIT_INJECT_PYTHON_DEPTH=$1,
# three runs, appended to $3.
python_overhead() {
  local depth=$1 runs=$2 table=$3 i start end
  for i in 1 2 3; do
    start=$(date +%s.%N)
    PERFKIT_INJECT_PYTHON_DEPTH=$depth target/release/perfkit profile --quiet \
      --out "$runs/python-depth-$depth-$i" -- python3 fixtures/python/train_bad.py --steps 200 \
      >/dev/null || return 1
    end=$(date +%s.%N)
    echo "train_bad.py --steps 200, PERFKIT_INJECT_PYTHON_DEPTH=$depth, run $i: $(python3 -c "print(round($end - $start, 2))") s" |
      tee -a "$table"
  done
}

case "${1:-}" in
pack) pack ;;
run)
  shift
  run "$@"
  ;;
*)
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
  ;;
esac
