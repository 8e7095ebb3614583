#!/usr/bin/env bash
# Lint benchmark over a corpus of published crates.
#
# Fetches the sources of a fixed set of crates from crates.io with cargo (a throwaway Cargo project under
# target/bench-corpus/project whose dependency graph cargo resolves and unpacks), copies the crates to
# measure into target/bench-corpus/crates/, then runs the `corpus` bench target of perfkit-lint, which
# times a syn-parse-only pass and the full lint over the same files in the same run and prints a table.
#
# Usage: bench/lint-corpus.sh [--jobs N] [--runs N]     (defaults: 2 threads, 3 runs of each pass)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
corpus="$target_dir/bench-corpus"
project="$corpus/project"
crates="$corpus/crates"

# The crates to lint: the GPU training frameworks perfkit targets, plus large general-purpose crates.
selected=(candle-core candle-nn candle-transformers burn-core burn-train burn-tensor tch cudarc
          syn tokio regex regex-syntax serde_json clap_builder)

mkdir -p "$project/src"
cat > "$project/Cargo.toml" <<'TOML'
[package]
name = "perfkit-bench-corpus"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
candle-core = "0.11"
candle-nn = "0.11"
candle-transformers = "0.11"
burn-core = "0.22"
burn-train = "0.22"
burn-tensor = "0.22"
tch = "0.22"  # the version burn-tch links against: one `links = "tch"` per graph
cudarc = { version = "0.19", default-features = false, features = ["std", "driver", "nvrtc", "dynamic-loading", "cuda-13000"] }
syn = { version = "3", features = ["full"] }
tokio = { version = "1", features = ["full"] }
regex = "1"
regex-syntax = "0.8"
serde_json = "1"
clap_builder = "4"

[workspace]
TOML
: > "$project/src/lib.rs"

# `cargo metadata` resolves the graph and unpacks every package it needs into cargo's registry.
echo "resolving and fetching the corpus (first run downloads from crates.io)..." >&2
metadata="$(cargo metadata --manifest-path "$project/Cargo.toml" --format-version 1)"

rm -rf "$crates"
mkdir -p "$crates"
pattern="$(IFS='|'; echo "${selected[*]}")"
declare -A newest=()
while IFS= read -r manifest; do
    dir="$(dirname "$manifest")"
    base="$(basename "$dir")"
    name="${base%-[0-9]*}"
    # Several versions of one crate can be in the graph (syn 1, 2 and 3): keep the newest.
    newest[$name]="$dir"
done < <(printf '%s' "$metadata" | grep -oE '"manifest_path":"[^"]*"' | sed -e 's/^"manifest_path":"//' -e 's/"$//' \
          | grep -E "/($pattern)-[0-9][^/]*/Cargo.toml$" | sort -u -V)
found=0
for name in "${!newest[@]}"; do
    cp -R "${newest[$name]}" "$crates/"
    found=$((found + 1))
done
if [ "$found" -lt "${#selected[@]}" ]; then
    echo "expected ${#selected[@]} crates in the corpus, found $found" >&2
    exit 1
fi
# A published crate carries no .gitignore of its own that would hide its sources; drop any that a crate ships
# so that the lint walks the same files as the parse-only pass.
find "$crates" -name .gitignore -delete
echo "corpus: $(ls "$crates" | tr '\n' ' ')" >&2

cd "$root"
exec cargo bench -p perfkit-lint --bench corpus -- "$crates" "$@"
