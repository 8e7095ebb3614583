#!/usr/bin/env bash
# Python benchmarks over a corpus of real PyTorch code.
#
# The corpus: the Python sources of published PyTorch packages fetched from PyPI with pip (wheels of
# timm, lightning, accelerate and transformers, pinned), unpacked into target/bench-corpus/python/,
# plus any directories given on the command line (for instance a checkout of pytorch/examples).
#
#   bench/python-corpus.sh [--runs N] [--jobs N] [DIR...]     lint vs parse-only floor (perfkit-lint's
#                                                             `python_corpus` bench)
#       --stages          where the lint's time goes: the lint ended after each of its stages
#       --without-wheels  only the directories given (say, training scripts), not the wheels
#   bench/python-corpus.sh --parsers [--runs N] [DIR...]      compare the candidate Python parsers
#                                                             (bench/python-parsers, its own project)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
corpus="$target_dir/bench-corpus/python"
wheels=("timm==1.0.15" "lightning==2.5.1" "accelerate==1.6.0" "transformers==4.51.3")

mode=lint
runs=3
jobs=2
extra=()
flags=()
wheels=yes
while [[ $# -gt 0 ]]; do
    case "$1" in
        --parsers) mode=parsers ;;
        --runs) runs="$2"; shift ;;
        --jobs) jobs="$2"; shift ;;
        --stages) flags+=(--stages) ;;
        --without-wheels) wheels=no ;;
        -h|--help) sed -n 2,14p "${BASH_SOURCE[0]}"; exit 0 ;;
        *) extra+=("$(cd "$1" && pwd)") ;;
    esac
    shift
done

if [[ "$wheels" == yes && ! -d "$corpus/src" ]]; then
    echo "fetching the corpus from PyPI (first run)..." >&2
    mkdir -p "$corpus/wheels" "$corpus/src.tmp"
    python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$corpus/wheels" "${wheels[@]}"
    for wheel in "$corpus"/wheels/*.whl; do
        name="$(basename "$wheel" .whl)"
        python3 - "$wheel" "$corpus/src.tmp/$name" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for member in z.namelist():
        if member.endswith(".py"):
            z.extract(member, sys.argv[2])
PY
    done
    mv "$corpus/src.tmp" "$corpus/src"
fi

if [[ "$wheels" == yes ]]; then
    dirs=("$corpus/src" "${extra[@]}")
elif [[ ${#extra[@]} -gt 0 ]]; then
    dirs=("${extra[@]}")
else
    echo "--without-wheels needs at least one directory" >&2
    exit 2
fi
if [[ "$mode" == parsers ]]; then
    cargo run --quiet --release --manifest-path "$root/bench/python-parsers/Cargo.toml" \
        --target-dir "$target_dir/python-parsers" -- "${dirs[@]}" --runs "$runs"
else
    cd "$root"
    cargo bench --quiet -p perfkit-lint --bench python_corpus -- --jobs "$jobs" --runs "$runs" "${flags[@]}" "${dirs[@]}"
fi
