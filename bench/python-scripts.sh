#!/usr/bin/env bash
# Assembles the training-script corpus of the Python speed measurement (bench/python-scripts/
# manifest.txt: pytorch/examples, Lightning's examples, transformers' PyTorch example scripts, each
# pinned by commit) under target/speed-scripts/OWNER+REPO/PATH, then runs the Python lint benchmark
# over it alone:
#
#   bench/python-scripts.sh [--git DIR] [--files DIR] [--runs N] [--jobs N] [--stages]
#
# Each repository is read from a git clone: DIR/OWNER+REPO when --git DIR is given (any clone or
# bare mirror holding the pinned commits), else a blobless clone from GitHub made under
# target/speed-scripts-git/ on the first run. --files DIR takes an entry from DIR/OWNER+REPO/PATH
# instead, where that exists (copies made by hand at the pinned commits, for a repository too
# large to clone). Entries found nowhere are named and left out; the run says how many. Files
# too large to be stored in a mirror (data, images) are not Python and are not needed. The corpus
# directory is this script's own (it holds a marker file): it replaces nothing else.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$target_dir/speed-scripts"
clones="$target_dir/speed-scripts-git"
git_dir=""
files_dir=""
bench_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --git) git_dir="$2"; shift ;;
        --files) files_dir="$2"; shift ;;
        --runs|--jobs) bench_args+=("$1" "$2"); shift ;;
        --stages) bench_args+=("$1") ;;
        -h|--help) sed -n 2,16p "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

# The git directory of one repository (cloned without blobs on first use when no --git is given).
repo_git() {
    local slug="$1" name="${1/\//+}"
    if [[ -n "$git_dir" ]]; then
        for candidate in "$git_dir/$name" "$git_dir/$name/repo" "$git_dir/$name/.git"; do
            if git --git-dir="$candidate" rev-parse --git-dir >/dev/null 2>&1; then
                echo "$candidate"
                return
            fi
        done
        echo "no git directory for $slug under $git_dir" >&2
        return 1
    fi
    if [[ ! -d "$clones/$name" ]]; then
        mkdir -p "$clones"
        git clone --quiet --bare --filter=blob:none "https://github.com/$slug" "$clones/$name" >&2
    fi
    echo "$clones/$name"
}

# The corpus directory is replaced on each run, so it must be this script's: made by it, with
# its marker, or absent.
marker=".perfkit-speed-scripts"
for dir in "$out" "$out.tmp"; do
    if [[ -e "$dir" && ! -e "$dir/$marker" ]]; then
        echo "$dir exists and was not made by this script (no $marker in it): move it away first" >&2
        exit 2
    fi
done
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
: >"$out.tmp/$marker"
missing=0
entries=0
while read -r slug commit path; do
    [[ -z "$slug" || "$slug" == \#* ]] && continue
    entries=$((entries + 1))
    dest="$out.tmp/${slug/\//+}"
    loose="$files_dir/${slug/\//+}/$path"
    if [[ -n "$files_dir" && -e "$loose" ]]; then
        mkdir -p "$(dirname "$dest/$path")"
        cp -R "$loose" "$dest/$path"
        continue
    fi
    gd="$(repo_git "$slug")" || { missing=$((missing + 1)); continue; }
    mkdir -p "$dest"
    # `.` is the whole repository.
    spec="$commit:$path"
    filter=(-- "$path")
    if [[ "$path" == "." ]]; then
        spec="$commit^{tree}"
        filter=()
    fi
    kind="$(git --git-dir="$gd" cat-file -t "$spec" 2>/dev/null || true)"
    case "$kind" in
        blob)
            mkdir -p "$(dirname "$dest/$path")"
            git --git-dir="$gd" cat-file blob "$commit:$path" >"$dest/$path" ;;
        tree)
            # Python files and notebooks only: the rest of a tree (data, images) is not linted,
            # and a mirror may not hold its largest files.
            git --git-dir="$gd" ls-tree -r -z --full-name "$commit" "${filter[@]}" |
                while IFS= read -r -d '' entry; do
                    meta="${entry%%$'\t'*}"
                    file="${entry#*$'\t'}"
                    [[ "$file" == *.py || "$file" == *.ipynb ]] || continue
                    [[ "$meta" == 100* ]] || continue
                    mkdir -p "$(dirname "$dest/$file")"
                    git --git-dir="$gd" cat-file blob "${meta##* }" >"$dest/$file"
                done ;;
        *)
            echo "missing: $slug $commit $path" >&2
            missing=$((missing + 1)) ;;
    esac
done <"$root/bench/python-scripts/manifest.txt"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "corpus: $((entries - missing)) of $entries manifest entries under $out" >&2
exec "$root/bench/python-corpus.sh" --without-wheels "${bench_args[@]}" "$out"
