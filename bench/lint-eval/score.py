#!/usr/bin/env python3
"""Scores `perfkit lint --format json` output against the labels of bench/lint-eval/labels/ (Rust)
or bench/lint-eval/labels-python/ (Python).

A label is `NAME@COMMIT PATH LINE CODE EXPECTED` with EXPECTED one of error, warning, note (a real
problem the rule must report there, at that severity) or trap (a look-alike the rule must not report).
In a Jupyter notebook PATH is `nb.ipynb:cellN` and LINE the line within that cell.

Precision is over the findings at warning level or above (what fails a CI run): a warning on a line
labelled error/warning for its code is true; on a line labelled `trap` or `note` for its code it is false
(too severe); on a line with no label for its code it is unjudged, listed so that someone reads it and
labels it. Recall is over the labels at warning level or above: found when a finding of that code sits
on that line at warning level or above. Notes are scored separately (labelled notes found at any
severity). Exit status 0; the table is the result.
"""

import argparse
import collections
import json
import os
import sys

SEVERE = ("error", "warning")


def read_labels(directory, only):
    repos = {}
    labels = {}  # (repo, path, line, code) -> (expected, file:line of the label)
    problems = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".txt"):
            continue
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as f:
            for number, raw in enumerate(f, 1):
                text = raw.split("#", 1)[0].strip()
                if not text:
                    continue
                fields = text.split()
                where = f"{name}:{number}"
                if fields[0] == "repo":
                    if len(fields) != 4:
                        problems.append(f"{where}: `repo NAME OWNER/REPO COMMIT` expected")
                        continue
                    repos[fields[1]] = (fields[2], fields[3])
                    continue
                if len(fields) != 5 or "@" not in fields[0]:
                    problems.append(f"{where}: `NAME@COMMIT PATH LINE CODE EXPECTED` expected")
                    continue
                repo, commit = fields[0].split("@", 1)
                if repo not in repos:
                    problems.append(f"{where}: repository `{repo}` has no `repo` line above")
                    continue
                if not repos[repo][1].startswith(commit):
                    problems.append(f"{where}: commit {commit} is not {repo}'s {repos[repo][1]}")
                expected = fields[4]
                if expected not in ("error", "warning", "note", "trap"):
                    problems.append(f"{where}: expected must be error, warning, note or trap")
                    continue
                try:
                    line = int(fields[2])
                except ValueError:
                    problems.append(f"{where}: line `{fields[2]}` is not a number")
                    continue
                key = (repo, fields[1], line, fields[3].upper())
                if key in labels:
                    problems.append(f"{where}: duplicate of {labels[key][1]}")
                labels[key] = (expected, where)
    if only:
        keep = set(only.split(","))
        repos = {k: v for k, v in repos.items() if k in keep}
        labels = {k: v for k, v in labels.items() if k[0] in keep}
    return repos, labels, problems


def read_findings(directory, repos):
    findings = {}
    errors = {}
    for repo in repos:
        path = os.path.join(directory, f"{repo}.json")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            errors[repo] = [f"no usable lint output ({e})"]
            findings[repo] = []
            continue
        # A notebook's finding is labelled `nb.ipynb:cellN LINE` (LINE within the cell).
        findings[repo] = [
            (x["path"].removeprefix("./") + (f":cell{x['cell']}" if "cell" in x else ""),
             x["line"], x["code"], x["severity"], x["message"])
            for x in data["findings"]
            if x["code"] != "PK000"
        ]
        errors[repo] = [f"{e['path']}: {e['message']}" for e in data.get("errors", [])]
    return findings, errors


def ratio(num, den):
    return f"{num / den:.2f}" if den else "  - "


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", required=True)
    parser.add_argument("--findings", required=True)
    parser.add_argument("--only", default="")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()

    repos, labels, problems = read_labels(args.labels, args.only)
    for p in problems:
        print(f"label error: {p}", file=sys.stderr)
    findings, errors = read_findings(args.findings, repos)
    runs = {}
    runs_file = os.path.join(args.findings, ".runs")
    if os.path.exists(runs_file):
        with open(runs_file) as f:
            for line in f:
                name, status, ms = line.split()
                runs[name] = (int(status), int(ms))

    # Per (repo, code): tp, fp, unjudged warnings; recall found/total; notes found/total; traps hit.
    stats = collections.defaultdict(collections.Counter)
    false_pos, unjudged, missed, traps_hit = [], [], [], []
    found_keys = set()
    for repo, items in findings.items():
        for path, line, code, severity, message in items:
            key = (repo, path, line, code)
            found_keys.add((key, severity in SEVERE))
            label = labels.get(key)
            if label and label[0] == "trap":
                traps_hit.append((key, severity, message, label[1]))
                stats[(repo, code)]["traps_hit"] += 1
            if severity not in SEVERE:
                continue
            if label is None:
                unjudged.append((key, severity, message))
                stats[(repo, code)]["unjudged"] += 1
            elif label[0] in SEVERE:
                stats[(repo, code)]["tp"] += 1
            else:
                false_pos.append((key, severity, message, label))
                stats[(repo, code)]["fp"] += 1
    found_severe = {k for k, severe in found_keys if severe}
    found_any = {k for k, _ in found_keys}
    for key, (expected, where) in labels.items():
        repo, _, _, code = key
        if expected in SEVERE:
            stats[(repo, code)]["expected"] += 1
            if key in found_severe:
                stats[(repo, code)]["found"] += 1
            else:
                missed.append((key, expected, where, key in found_any))
        elif expected == "note":
            stats[(repo, code)]["notes"] += 1
            if key in found_any:
                stats[(repo, code)]["notes_found"] += 1
        else:
            stats[(repo, code)]["traps"] += 1

    def table(group):
        rows = collections.defaultdict(collections.Counter)
        for (repo, code), c in stats.items():
            rows[group(repo, code)].update(c)
        total = collections.Counter()
        print(f"{'':<18} {'warn':>5} {'true':>5} {'false':>5} {'unjdg':>5} {'prec':>5}   {'lbl':>4} {'found':>5} {'recall':>6}   {'notes':>7}   {'traps':>5} {'hit':>4}")
        for name in sorted(rows):
            c = rows[name]
            total.update(c)
            line(name, c)
        line("all", total)

    def line(name, c):
        warned = c["tp"] + c["fp"] + c["unjudged"]
        print(
            f"{name:<18} {warned:>5} {c['tp']:>5} {c['fp']:>5} {c['unjudged']:>5} {ratio(c['tp'], c['tp'] + c['fp'] + c['unjudged']):>5}"
            f"   {c['expected']:>4} {c['found']:>5} {ratio(c['found'], c['expected']):>6}"
            f"   {c['notes_found']:>3}/{c['notes']:<3}   {c['traps']:>5} {c['traps_hit']:>4}"
        )

    print("== by repository (precision counts unjudged warnings as false until labelled)")
    table(lambda repo, code: repo)
    print()
    print("== by rule")
    table(lambda repo, code: code)
    print()
    labelled = len(labels)
    n_traps = sum(1 for v in labels.values() if v[0] == "trap")
    print(f"labels: {labelled} lines ({n_traps} traps) in {len(repos)} repositories")
    crashed = [r for r, (status, _) in runs.items() if status not in (0, 1)]
    file_errors = sum(len(v) for v in errors.values())
    print(f"lint runs: {len(runs)}, exit status 2 or worse: {len(crashed)} {crashed}, files that failed: {file_errors}")
    if runs:
        print("lint wall time: " + ", ".join(f"{r} {ms} ms" for r, (_, ms) in sorted(runs.items())))

    def show(title, items, fmt):
        if not items:
            return
        print(f"\n== {title} ({len(items)})")
        for item in sorted(items):
            print("  " + fmt(item))

    show("false positives (warning on a trap or note line)", false_pos,
         lambda x: f"{x[0][0]} {x[0][1]}:{x[0][2]} {x[0][3]} {x[1]} [{x[3][0]} {x[3][1]}] {x[2]}")
    show("unjudged warnings (label them)", unjudged,
         lambda x: f"{x[0][0]} {x[0][1]}:{x[0][2]} {x[0][3]} {x[1]}: {x[2]}")
    show("traps hit at any severity", traps_hit,
         lambda x: f"{x[0][0]} {x[0][1]}:{x[0][2]} {x[0][3]} {x[1]} [{x[3]}]")
    show("missed (labelled at warning level, not reported at warning level)", missed,
         lambda x: f"{x[0][0]} {x[0][1]}:{x[0][2]} {x[0][3]} expected {x[1]} [{x[2]}]{' (reported as note)' if x[3] else ''}")
    for repo, errs in sorted(errors.items()):
        for e in errs:
            print(f"  error {repo}: {e}")


if __name__ == "__main__":
    main()
