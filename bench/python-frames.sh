#!/usr/bin/env bash
# Host cost of reading Python frames in the CUPTI callbacks, without a GPU: a Python loop plays
# kernel-launch callbacks (enter and exit) through the stand-in CUDA driver and CUPTI of the
# injection tests, with the GIL held, at two Python stack depths, and prints the best of five
# rounds in ns per call for: no injection, injection without Python frames
# (PERFKIT_INJECT_PYTHON_DEPTH=0), and with 8 and 32 frames kept.
#
#   cargo build --release -p perfkit-inject && bench/python-frames.sh [CALLS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lib=$root/target/release/libperfkit_inject.so
[ -f "$lib" ] || { echo "build it first: cargo build --release -p perfkit-inject" >&2; exit 2; }
calls=${1:-20000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
support=$root/profiler/inject/tests/support
cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$tmp/libcuda.so.1" "$support/fake_cuda.c" -ldl
cc -shared -fPIC -O1 -Wl,-soname,libcupti.so.13 -o "$tmp/libcupti.so.13" "$support/fake_cupti.c"
cat >"$tmp/loop.py" <<'PY'
import ctypes, os, sys, time

ctypes.PyDLL("libcuda.so.1").cuInit(0)
held = ctypes.PyDLL(os.environ["PERFKIT_CUPTI_PATH"])
calls, nest = int(sys.argv[1]), int(sys.argv[2])


def loop():
    best = None
    for _ in range(5):
        t = time.perf_counter_ns()
        for i in range(calls):
            held.fake_api(2, 2, 10 + i, 0)
            held.fake_api(2, 2, 10 + i, 1)
        ns = (time.perf_counter_ns() - t) / calls
        best = ns if best is None else min(best, ns)
    return best


def nested(n):
    return loop() if n == 0 else nested(n - 1)


print(f"{nested(nest):.0f}")
PY
export LD_LIBRARY_PATH=$tmp PERFKIT_CUPTI_PATH=$tmp/libcupti.so.13
run() { python3 "$tmp/loop.py" "$calls" "$1"; }
inject() {
  CUDA_INJECTION64_PATH=$lib PERFKIT_TRACE=$tmp/trace PERFKIT_INJECT_PYTHON_DEPTH=$2 \
    python3 "$tmp/loop.py" "$calls" "$1" 2>/dev/null
}
echo "$(python3 --version), $calls calls per round, ns per call (enter + exit callbacks)"
printf '| %-13s | %10s | %10s | %10s | %10s |\n' "Python stack" "no inject" "frames off" "8 frames" "32 frames"
printf '|%s|%s|%s|%s|%s|\n' "---------------" "-----------:" "-----------:" "-----------:" "-----------:"
for nest in 0 20; do
  printf '| %-13s | %10s | %10s | %10s | %10s |\n' "$((nest + 3)) frames" "$(run $nest)" \
    "$(inject $nest 0)" "$(inject $nest 8)" "$(inject $nest 32)"
done
