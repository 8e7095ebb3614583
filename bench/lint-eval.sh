#!/usr/bin/env bash
# Linter accuracy on real repositories, against labels kept in bench/lint-eval/labels/.
#
# Each label file names one public repository and the commit it was labelled at
# (`repo NAME OWNER/REPO COMMIT`), then one line per labelled source line:
#   NAME@COMMIT PATH LINE CODE SEVERITY|trap   # reason
# SEVERITY (error, warning, note) marks a real problem that the rule must report there; `trap` marks a
# look-alike that the rule must not report. docs/lint-eval.md explains how they were labelled.
#
# Sources: each repository must be a directory SRC/NAME holding the repository's files at that commit.
# With network access to GitHub the script makes them itself (git clone, checkout of the commit); on a
# machine without it, put them there by hand (any way of getting the tree at that commit will do, e.g.
# `git archive COMMIT | tar -x -C SRC/NAME` from a mirror) and run again: the script says which are missing.
#
# Then it builds perfkit (release), lints each repository from its root (`perfkit lint --format json .`),
# and scores the findings against the labels: per rule and per repository, precision over the warnings
# (every warning must be labelled: unlabelled ones are listed as "unjudged"), recall on the labelled
# lines, traps hit, files that failed to lint. Output: a table on stdout; the raw findings under
# OUT (default target/lint-eval/).
#
# Usage: bench/lint-eval.sh [--python] [--src DIR] [--out DIR] [--only NAME,...] [--no-build]
#   --python  score the Python (PyTorch) repositories of bench/lint-eval/labels-python/ instead
#             (default src and out: target/lint-eval-python/); docs/python.md has the results
#   --src   where the repositories are (default: target/lint-eval/src)
#   PERFKIT=path/to/perfkit in the environment scores that binary instead of building one.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
src="$target_dir/lint-eval/src"
out="$target_dir/lint-eval"
only=""
build=1
labels="$root/bench/lint-eval/labels"
while [ $# -gt 0 ]; do
    case "$1" in
        --python)
            labels="$root/bench/lint-eval/labels-python"
            [ "$src" = "$target_dir/lint-eval/src" ] && src="$target_dir/lint-eval-python/src"
            [ "$out" = "$target_dir/lint-eval" ] && out="$target_dir/lint-eval-python"
            shift ;;
        --src) src="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$src" "$out/findings"

# The repositories: one `repo` line per label file.
missing=()
repos=()
while read -r _ name slug commit; do
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
        continue
    fi
    repos+=("$name")
    dir="$src/$name"
    if [ ! -d "$dir" ]; then
        if command -v git >/dev/null && git clone --quiet --no-checkout "https://github.com/$slug" "$dir" 2>/dev/null \
            && git -C "$dir" checkout --quiet "$commit" 2>/dev/null; then
            echo "fetched $slug at $commit" >&2
        else
            rm -rf "$dir"
            missing+=("$name ($slug at $commit)")
        fi
    fi
done < <(grep -h '^repo ' "$labels"/*.txt | sort)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "missing sources under $src (put each repository's files at its commit there):" >&2
    printf '  %s\n' "${missing[@]}" >&2
    exit 2
fi

if [ -z "${PERFKIT:-}" ] && [ "$build" = 1 ]; then
    cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p perfkit
fi
# PERFKIT: another perfkit binary to score (an older build, a debug build).
perfkit="$(realpath "${PERFKIT:-$target_dir/release/perfkit}")"

: > "$out/findings/.runs"
for name in "${repos[@]}"; do
    start=$(date +%s%N)
    status=0
    (cd "$src/$name" && "$perfkit" lint --format json --exit-zero --jobs 2 .) \
        > "$out/findings/$name.json" 2> "$out/findings/$name.stderr" || status=$?
    end=$(date +%s%N)
    echo "$name $status $(( (end - start) / 1000000 ))" >> "$out/findings/.runs"
done

exec python3 "$root/bench/lint-eval/score.py" --labels "$labels" --findings "$out/findings" ${only:+--only "$only"}
