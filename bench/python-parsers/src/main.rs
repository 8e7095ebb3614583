//! Compares the Rust Python parsers perfkit could use, on a corpus of real PyTorch code and on
//! snippets of recent syntax.
//!
//! Usage: `cargo run --release -- DIR... [--runs N]` (see `bench/python-parsers.sh`).
//!
//! For each parser: files and lines per second over the corpus (best of N runs, files read into
//! memory first, one thread), how many corpus files it rejects, which Python 3.12-3.14 constructs
//! it accepts, and whether it still gives a tree for the rest of a file with a syntax error in it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Corpus {
    files: Vec<(PathBuf, String)>,
    lines: usize,
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "py") {
            out.push(path);
        }
    }
}

fn load(dirs: &[PathBuf]) -> Corpus {
    let mut paths = Vec::new();
    for dir in dirs {
        collect(dir, &mut paths);
    }
    paths.sort();
    let mut files = Vec::new();
    let mut lines = 0;
    for path in paths {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        lines += text.lines().count();
        files.push((path, text));
    }
    Corpus { files, lines }
}

/// A parser under test: parses a module, says whether it reported a syntax error, and how many
/// top-level statements (or nodes) it still produced.
trait Candidate {
    fn name(&self) -> &'static str;
    /// (ok, top-level statements produced)
    fn parse(&mut self, source: &str) -> (bool, usize);
}

struct Ruff;
impl Candidate for Ruff {
    fn name(&self) -> &'static str {
        "ruff_python_parser 0.0.10"
    }
    fn parse(&mut self, source: &str) -> (bool, usize) {
        // Target the newest Python the parser knows, so that 3.12-3.14 syntax is not reported
        // as unsupported by an older default target.
        let options = ruff_python_parser::ParseOptions::from(ruff_python_ast::PySourceType::Python)
            .with_target_version(ruff_python_ast::PythonVersion::PY314);
        let parsed = ruff_python_parser::parse_unchecked(source, options);
        let ok = parsed.errors().is_empty() && parsed.unsupported_syntax_errors().is_empty();
        let statements = parsed.syntax().as_module().map_or(0, |m| m.body.len());
        (ok, statements)
    }
}

struct RustPython;
impl Candidate for RustPython {
    fn name(&self) -> &'static str {
        "rustpython-parser 0.4.0"
    }
    fn parse(&mut self, source: &str) -> (bool, usize) {
        match rustpython_parser::parse(source, rustpython_parser::Mode::Module, "<corpus>") {
            Ok(rustpython_parser::ast::Mod::Module(m)) => (true, m.body.len()),
            Ok(_) => (true, 0),
            Err(_) => (false, 0),
        }
    }
}

struct TreeSitter(tree_sitter::Parser);
impl Candidate for TreeSitter {
    fn name(&self) -> &'static str {
        "tree-sitter 0.25 + tree-sitter-python 0.25"
    }
    fn parse(&mut self, source: &str) -> (bool, usize) {
        match self.0.parse(source, None) {
            Some(tree) => {
                let root = tree.root_node();
                (!root.has_error(), root.named_child_count())
            }
            None => (false, 0),
        }
    }
}

const SYNTAX: &[(&str, &str)] = &[
    ("match (3.10)", "match x:\n    case [a, *rest]:\n        pass\n    case {'k': v}:\n        pass\n"),
    ("except* (3.11)", "try:\n    f()\nexcept* ValueError as eg:\n    pass\n"),
    ("PEP 695 type params (3.12)", "def first[T](xs: list[T]) -> T:\n    return xs[0]\nclass Box[T: int]:\n    pass\n"),
    ("PEP 695 `type` alias (3.12)", "type Pair[T] = tuple[T, T]\n"),
    ("PEP 701 f-string quotes (3.12)", "name = f\"{d[\"key\"]} {f\"{x!r:>{w}}\"}\"\n"),
    ("PEP 696 type param defaults (3.13)", "class A[T = int]:\n    pass\n"),
    ("PEP 758 except without parens (3.14)", "try:\n    f()\nexcept ValueError, TypeError:\n    pass\n"),
    ("PEP 750 t-strings (3.14)", "greeting = t\"hello {name}\"\n"),
];

/// A file with one broken statement in the middle: a parser that recovers still gives the
/// statements around it.
const BROKEN: &str = "import torch\n\ndef a():\n    return torch.zeros(3)\n\nx = (1, \n\ndef b(t):\n    return t.item()\n\nfor i in range(3):\n    b(a())\n";

fn time_pass(candidate: &mut dyn Candidate, corpus: &Corpus, runs: usize) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut rejected = 0;
    for _ in 0..runs {
        rejected = 0;
        let start = Instant::now();
        for (_, text) in &corpus.files {
            let (ok, _) = candidate.parse(text);
            if !ok {
                rejected += 1;
            }
        }
        best = best.min(start.elapsed());
    }
    (best, rejected)
}

fn main() {
    let mut dirs = Vec::new();
    let mut runs = 3;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--runs" {
            runs = args.next().and_then(|n| n.parse().ok()).unwrap_or(3);
        } else {
            dirs.push(PathBuf::from(arg));
        }
    }
    if dirs.is_empty() {
        eprintln!("usage: python-parsers DIR... [--runs N]");
        std::process::exit(2);
    }
    let corpus = load(&dirs);
    let mut ts = tree_sitter::Parser::new();
    ts.set_language(&tree_sitter_python::LANGUAGE.into())
        .expect("tree-sitter-python grammar matches the tree-sitter ABI");
    let mut candidates: Vec<Box<dyn Candidate>> =
        vec![Box::new(Ruff), Box::new(TreeSitter(ts)), Box::new(RustPython)];

    println!(
        "corpus: {} files, {} lines; best of {runs} runs, one thread\n",
        corpus.files.len(),
        corpus.lines
    );
    println!("| parser | wall s | files/s | lines/s | corpus files rejected | broken file: statements kept (of 5) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for candidate in &mut candidates {
        let (time, rejected) = time_pass(candidate.as_mut(), &corpus, runs);
        let secs = time.as_secs_f64();
        let (_, kept) = candidate.parse(BROKEN);
        println!(
            "| {} | {:.3} | {:.0} | {:.0} | {} | {} |",
            candidate.name(),
            secs,
            corpus.files.len() as f64 / secs,
            corpus.lines as f64 / secs,
            rejected,
            kept
        );
    }
    println!();
    print!("| syntax |");
    for candidate in &candidates {
        print!(" {} |", candidate.name());
    }
    println!();
    print!("|---|");
    for _ in &candidates {
        print!("---|");
    }
    println!();
    for (what, source) in SYNTAX {
        print!("| {what} |");
        for candidate in &mut candidates {
            let (ok, _) = candidate.parse(source);
            print!(" {} |", if ok { "yes" } else { "no" });
        }
        println!();
    }
    // Which corpus files each rejects (the first few), to tell real breakage from parser gaps.
    for candidate in &mut candidates {
        let rejected: Vec<&PathBuf> = corpus
            .files
            .iter()
            .filter(|(_, text)| !candidate.parse(text).0)
            .map(|(path, _)| path)
            .take(5)
            .collect();
        if !rejected.is_empty() {
            eprintln!("{} rejects e.g. {:?}", candidate.name(), rejected);
        }
    }
}
