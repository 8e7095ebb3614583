//! Lint throughput on a corpus of real crates, against a syn-parse-only pass over the same files.
//!
//! ```text
//! cargo bench -p perfkit-lint --bench corpus -- [CORPUS_DIR] [--jobs N] [--runs N]
//! ```
//!
//! `bench/lint-corpus.sh` fetches the corpus (published crates, with cargo) into
//! `target/bench-corpus/crates`, the default CORPUS_DIR, and runs this. Each pass is
//! run `--runs` times (default 3), alternating, and the fastest run of each is reported, by wall time and
//! by the process's CPU time (steadier than wall time on a shared machine): the parse-only
//! pass reads and parses every `.rs` file with `syn` on a pool of `--jobs` threads (default 2), the lint
//! pass is `perfkit_lint::lint` over the corpus directory with the same number of threads. The ratio of
//! the two is what the linter costs on top of parsing. Panics are counted, never hidden: every file is
//! parsed under `catch_unwind`; the lint catches a panic per crate and reports that crate's files as
//! errors, which are counted here; a lint run that panics anyway is re-run crate by crate to name the
//! crates that panic. The run exits with a failure status when anything panicked.
//!
//! For profilers (`perf`, `valgrind --tool=callgrind`), `--only PASS` runs one pass `--runs` times
//! and prints nothing: `none` (only the set-up every pass shares: listing the files and counting
//! their lines), `floor` (the parse-only pass), `retain` (the parse-only pass over the crates as the
//! lint groups them, each crate's trees kept until the whole crate is parsed, as the lint keeps them
//! for its rules), `parse`, `facts` or `analysis` (the lint ended after that stage), `front` (the
//! lint with no rule selected: walk, parse, facts, crate-wide analysis) or `lint`. `--stages`
//! measures those stages, interleaved with the floor, and prints where the lint's time goes. A pass's own cost is its count less `none`'s. The table shows the `retain` pass too:
//! the lint's ratio to it is what the analysis and the rules cost, apart from keeping the trees.

mod shared;
use shared::process_cpu_time;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use perfkit_lint::{LintOptions, LintReport};
use rayon::prelude::*;

/// How the engine reports a file of a crate whose analysis panicked.
const CAUGHT_PANIC: &str = "internal error while linting";

struct Args {
    corpus: PathBuf,
    jobs: usize,
    runs: usize,
    /// `--only PASS`: run only that pass, print nothing.
    only: Option<Only>,
    /// `--stages`: measure the lint ended after each of its stages, print where its time goes.
    stages: bool,
}

/// The names of the passes `--only` takes.
const PASSES: &str = "none, floor, retain, parse, facts, analysis, front or lint";

/// The passes `--only` can run on their own.
#[derive(Clone, Copy)]
enum Only {
    None,
    Floor,
    Retain,
    Front,
    Lint,
    /// The lint ended after a stage (`parse`, `facts`, `analysis`).
    Stage(perfkit_lint::Stage),
}

enum ArgError {
    /// A bad flag or value.
    Bad(String),
    /// No corpus given and none fetched yet.
    Missing(PathBuf),
}

impl From<String> for ArgError {
    fn from(message: String) -> Self {
        ArgError::Bad(message)
    }
}

fn parse_args() -> Result<Args, ArgError> {
    let mut corpus = None;
    let mut jobs = 2;
    let mut runs = 3;
    let mut only = None;
    let mut stages = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--jobs" | "-j" => jobs = number(args.next(), "--jobs")?,
            "--runs" => runs = number(args.next(), "--runs")?,
            "--only" => {
                only = Some(match args.next().as_deref() {
                    Some("none") => Only::None,
                    Some("floor") => Only::Floor,
                    Some("retain") => Only::Retain,
                    Some("front") => Only::Front,
                    Some("lint") => Only::Lint,
                    Some("parse") => Only::Stage(perfkit_lint::Stage::Parse),
                    Some("facts") => Only::Stage(perfkit_lint::Stage::Facts),
                    Some("analysis") => Only::Stage(perfkit_lint::Stage::Analysis),
                    Some(other) => {
                        return Err(ArgError::Bad(format!(
                            "--only: unknown pass `{other}` ({PASSES})"
                        )));
                    }
                    None => {
                        return Err(ArgError::Bad(format!("--only needs a pass: {PASSES}")));
                    }
                });
            }
            "--stages" => stages = true,
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            other if other.starts_with('-') => {
                return Err(ArgError::Bad(format!("unknown flag `{other}`")));
            }
            other => corpus = Some(PathBuf::from(other)),
        }
    }
    let corpus = match corpus {
        Some(corpus) if corpus.is_dir() => corpus,
        Some(corpus) => {
            return Err(ArgError::Bad(format!(
                "{}: not a directory",
                corpus.display()
            )));
        }
        // Without an argument: the corpus that bench/lint-corpus.sh fetches.
        None if default_corpus().is_dir() => default_corpus(),
        None => return Err(ArgError::Missing(default_corpus())),
    };
    Ok(Args {
        corpus,
        jobs: jobs.max(1),
        runs: runs.max(1),
        only,
        stages,
    })
}

/// `target/bench-corpus/crates` of the workspace (or of `CARGO_TARGET_DIR`).
fn default_corpus() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("bench-corpus").join("crates")
}

fn number(value: Option<String>, flag: &str) -> Result<usize, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a number"))?;
    value
        .parse()
        .map_err(|_| format!("{flag}: `{value}` is not a number"))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[derive(Default, Clone, Copy)]
struct ParsePass {
    parsed: usize,
    failed: usize,
    panics: usize,
}

fn parse_pass(pool: &rayon::ThreadPool, files: &[PathBuf]) -> ParsePass {
    pool.install(|| {
        files
            .par_iter()
            // One file per task, so that an idle thread can always take the next file: left to
            // split the list in ranges, rayon hands a thread a run of the heaviest files (the generated
            // bindings lie together in one crate) while the other thread sleeps.
            .with_max_len(1)
            .map(|file| {
                let Ok(text) = std::fs::read_to_string(file) else {
                    return ParsePass {
                        failed: 1,
                        ..ParsePass::default()
                    };
                };
                let parsed = catch_unwind(|| syn::parse_file(&text).is_ok());
                // Free this thread's span table as the lint does, so memory stays bounded.
                proc_macro2::extra::invalidate_current_thread_spans();
                match parsed {
                    Ok(true) => ParsePass {
                        parsed: 1,
                        ..ParsePass::default()
                    },
                    Ok(false) => ParsePass {
                        failed: 1,
                        ..ParsePass::default()
                    },
                    Err(_) => ParsePass {
                        panics: 1,
                        ..ParsePass::default()
                    },
                }
            })
            .reduce(ParsePass::default, |a, b| ParsePass {
                parsed: a.parsed + b.parsed,
                failed: a.failed + b.failed,
                panics: a.panics + b.panics,
            })
    })
}

/// The parse-only pass over the crates as the lint groups them, each crate's trees kept until the
/// crate is parsed (see `shared::retain_pass`); returns the files that did not parse.
fn retain_pass(pool: &rayon::ThreadPool, plan: &[perfkit_lint::PlannedJob]) -> usize {
    let parse = |file: &Path| {
        let text = std::fs::read_to_string(file).ok()?;
        let tree = catch_unwind(|| syn::parse_file(&text)).ok()?.ok()?;
        Some((text, tree))
    };
    // The lint frees a thread's span table after each crate.
    let after = proc_macro2::extra::invalidate_current_thread_spans;
    shared::retain_pass(pool, plan, &parse, &after)
}

fn lint_options(paths: Vec<PathBuf>, jobs: usize) -> LintOptions {
    let mut options = LintOptions::default();
    options.paths = paths;
    options.jobs = Some(jobs);
    options
}

/// One lint run; `None` when it panicked.
fn lint_pass(corpus: &Path, jobs: usize) -> Result<Option<LintReport>, String> {
    let options = lint_options(vec![corpus.to_path_buf()], jobs);
    match catch_unwind(AssertUnwindSafe(|| perfkit_lint::lint(&options))) {
        Ok(Ok(report)) => Ok(Some(report)),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Ok(None),
    }
}

/// `--only PASS`: that pass `--runs` times, nothing printed; a failure or panic fails the run.
fn run_only(only: Only, pool: &rayon::ThreadPool, files: &[PathBuf], args: &Args) -> ExitCode {
    let mut front = lint_options(vec![args.corpus.clone()], args.jobs);
    front.select = vec!["PK000".to_string()];
    let lint = lint_options(vec![args.corpus.clone()], args.jobs);
    for _ in 0..args.runs {
        let done = match only {
            Only::None => Ok(()),
            Only::Floor => {
                let pass = parse_pass(pool, files);
                if pass.panics > 0 {
                    eprintln!("corpus: {} files made the parser panic", pass.panics);
                    return ExitCode::FAILURE;
                }
                Ok(())
            }
            Only::Retain => perfkit_lint::lint_plan(&lint).map(|plan| {
                retain_pass(pool, &plan);
            }),
            Only::Front => perfkit_lint::lint(&front).map(drop),
            Only::Lint => perfkit_lint::lint(&lint).map(drop),
            Only::Stage(stage) => {
                let mut cut = lint.clone();
                cut.stop_after = Some(stage);
                perfkit_lint::lint(&cut).map(drop)
            }
        };
        if let Err(error) = done {
            eprintln!("corpus: the lint failed: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// `--stages`: the floor, the walk and the lint ended after each stage, interleaved, `--runs`
/// times; prints where the lint's time goes.
fn run_stages(pool: &rayon::ThreadPool, files: &[PathBuf], args: &Args) -> ExitCode {
    let lint = lint_options(vec![args.corpus.clone()], args.jobs);
    let (mut floor, mut plan) = (shared::Best::default(), shared::Best::default());
    let mut best = [shared::Best::default(); 4];
    for _ in 0..args.runs {
        floor.time(|| parse_pass(pool, files));
        if let Err(error) = plan.time(|| perfkit_lint::lint_plan(&lint)) {
            eprintln!("corpus: the lint failed: {error}");
            return ExitCode::FAILURE;
        }
        for ((stage, _), best) in shared::STAGES.iter().zip(&mut best) {
            let mut cut = lint.clone();
            cut.stop_after = *stage;
            if let Err(error) = best.time(|| perfkit_lint::lint(&cut)) {
                eprintln!("corpus: the lint failed: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    shared::print_stages(floor, plan, &best);
    ExitCode::SUCCESS
}

/// Lints each crate directory of the corpus on its own and names those that panic.
fn panicking_crates(corpus: &Path, jobs: usize) -> Vec<String> {
    let mut crates: Vec<PathBuf> = std::fs::read_dir(corpus)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    crates.sort();
    crates
        .into_iter()
        .filter(|dir| {
            let options = lint_options(vec![dir.clone()], jobs);
            catch_unwind(AssertUnwindSafe(|| perfkit_lint::lint(&options))).is_err()
        })
        .map(|dir| dir.display().to_string())
        .collect()
}

/// The 1-minute load average, from `/proc/loadavg`.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next().map(str::to_string)
}

/// Runs `f`, returning its result with the wall time and CPU time it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration, Option<Duration>) {
    let cpu_start = process_cpu_time();
    let start = Instant::now();
    let value = f();
    let wall = start.elapsed();
    let cpu = cpu_start
        .zip(process_cpu_time())
        .map(|(a, b)| b.saturating_sub(a));
    (value, wall, cpu)
}

fn lines_per_second(lines: usize, time: Duration) -> f64 {
    lines as f64 / time.as_secs_f64().max(1e-9)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(ArgError::Missing(corpus)) => {
            // Nothing to measure is not a failure (`cargo test --benches` runs this with no corpus).
            eprintln!(
                "corpus: no corpus at {}; bench/lint-corpus.sh fetches one and runs this benchmark",
                corpus.display()
            );
            return ExitCode::SUCCESS;
        }
        Err(ArgError::Bad(message)) => {
            eprintln!("corpus: {message}");
            return ExitCode::from(2);
        }
    };
    let files = rust_files(&args.corpus);
    let lines: usize = files
        .iter()
        .map(|file| {
            std::fs::read(file)
                .map(|bytes| bytecount_lines(&bytes))
                .unwrap_or(0)
        })
        .sum();
    let crates = std::fs::read_dir(&args.corpus)
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    eprintln!(
        "corpus: {} crates, {} files, {} lines; {} threads, {} runs of each pass",
        crates,
        files.len(),
        lines,
        args.jobs,
        args.runs
    );
    let load_before = load_average();
    // Silence the default panic message: panics are counted, not printed per file.
    std::panic::set_hook(Box::new(|_| {}));
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(args.jobs)
        .build()
    {
        Ok(pool) => pool,
        Err(error) => {
            eprintln!("corpus: cannot start {} threads: {error}", args.jobs);
            return ExitCode::from(2);
        }
    };

    if let Some(only) = args.only {
        return run_only(only, &pool, &files, &args);
    }
    if args.stages {
        return run_stages(&pool, &files, &args);
    }

    // The crates as the lint groups them, for the pass that keeps each crate's trees.
    let plan = match perfkit_lint::lint_plan(&lint_options(vec![args.corpus.clone()], args.jobs)) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("corpus: the lint cannot plan the run: {error}");
            return ExitCode::from(2);
        }
    };
    let mut parse = Best::default();
    let mut retain = Best::default();
    let mut lint = Best::default();
    let mut parse_result = ParsePass::default();
    let mut lint_report = None;
    let mut lint_panicked = false;
    let (mut retain_rounds, mut lint_rounds) =
        (shared::Rounds::default(), shared::Rounds::default());
    for _ in 0..args.runs {
        let (result, floor_wall, floor_cpu) = timed(|| parse_pass(&pool, &files));
        parse_result = result;
        parse.record(floor_wall, floor_cpu);
        // The rounds' own ratios need both clocks of the round.
        let round = |rounds: &mut shared::Rounds, wall: Duration, cpu: Option<Duration>| {
            if let (Some(floor_cpu), Some(cpu)) = (floor_cpu, cpu) {
                rounds.push(floor_wall, floor_cpu, wall, cpu);
            }
        };

        let (_, wall, cpu) = timed(|| retain_pass(&pool, &plan));
        retain.record(wall, cpu);
        round(&mut retain_rounds, wall, cpu);

        let (result, wall, cpu) = timed(|| lint_pass(&args.corpus, args.jobs));
        match result {
            Ok(Some(report)) => {
                lint.record(wall, cpu);
                round(&mut lint_rounds, wall, cpu);
                lint_report = Some(report);
            }
            Ok(None) => {
                lint_panicked = true;
                break;
            }
            Err(message) => {
                eprintln!("corpus: the lint failed: {message}");
                return ExitCode::from(2);
            }
        }
    }
    let _ = std::panic::take_hook();

    // The engine catches a panic per crate and reports the crate's files as errors with this message.
    let caught: Vec<&perfkit_lint::FileError> = lint_report
        .iter()
        .flat_map(|report| &report.errors)
        .filter(|error| error.message.starts_with(CAUGHT_PANIC))
        .collect();
    for error in &caught {
        eprintln!("corpus: {}: {}", error.path.display(), error.message);
    }
    let uncaught = if lint_panicked {
        let crates = panicking_crates(&args.corpus, args.jobs);
        for name in &crates {
            eprintln!("corpus: the lint panicked on {name}");
        }
        crates.len().max(1)
    } else {
        0
    };
    let lint_panics = caught.len() + uncaught;

    println!(
        "| pass | files | lines | wall s | lines/s | CPU s | lines/CPU-s | ratio (wall) | ratio (CPU) | panics |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| syn parse only (floor) | {} | {} | {:.3} | {:.0} | {} | {} | 1.00 | 1.00 | {} |",
        files.len(),
        lines,
        parse.wall.as_secs_f64(),
        lines_per_second(lines, parse.wall),
        parse.cpu_text(),
        parse.cpu_rate_text(lines),
        parse_result.panics
    );
    let cpu_ratio = |pass: &Best| match (pass.cpu, parse.cpu) {
        (Some(l), Some(p)) if !p.is_zero() => format!("{:.2}", l.as_secs_f64() / p.as_secs_f64()),
        _ => "-".to_string(),
    };
    // One row of a pass measured against the floor.
    let row = |name: &str, files: usize, pass: &Best, panics: &str| {
        println!(
            "| {name} | {files} | {lines} | {:.3} | {:.0} | {} | {} | {:.2} | {} | {panics} |",
            pass.wall.as_secs_f64(),
            lines_per_second(lines, pass.wall),
            pass.cpu_text(),
            pass.cpu_rate_text(lines),
            pass.wall.as_secs_f64() / parse.wall.as_secs_f64().max(1e-9),
            cpu_ratio(pass),
        );
    };
    row(
        "syn parse, each crate's trees kept until the crate is parsed",
        plan.iter().map(|job| job.files.len()).sum::<usize>(),
        &retain,
        "-",
    );
    match &lint_report {
        Some(report) if !lint_panicked => {
            row(
                "perfkit lint",
                report.files_scanned,
                &lint,
                &lint_panics.to_string(),
            );
            if let (Some(l), Some(r)) = (lint.cpu, retain.cpu) {
                println!();
                println!(
                    "the lint over the pass that keeps each crate's trees: {:.2} in wall time, {:.2} in CPU \
                     time (what the analysis and the rules cost; the rest of the lint's ratio is the \
                     cost of keeping the trees)",
                    lint.wall.as_secs_f64() / retain.wall.as_secs_f64().max(1e-9),
                    l.as_secs_f64() / r.as_secs_f64().max(1e-9),
                );
            }
            println!();
            println!(
                "each round's own ratio to the floor run just before it, median (lowest to highest): \
                 the lint {}; the pass that keeps the trees {}",
                lint_rounds.text(),
                retain_rounds.text()
            );
            println!();
            println!(
                "{} threads, best of {} runs of each pass (alternating); {} findings; files syn could \
                 not parse: {}; files the lint reported as errors: {}",
                args.jobs,
                args.runs,
                report.diagnostics.len(),
                parse_result.failed,
                report.errors.len()
            );
            if let (Some(before), Some(after)) = (&load_before, load_average()) {
                println!(
                    "load average (1 min) before and after: {before} and {after}, on {} cores: other \
                     work on the machine slows the wall times; the CPU-time columns are steadier",
                    std::thread::available_parallelism().map_or(0, usize::from)
                );
            }
            if report.files_scanned != files.len() {
                println!(
                    "note: the lint scanned {} files, the parse-only pass {} (the lint skips ignored files)",
                    report.files_scanned,
                    files.len()
                );
            }
        }
        _ => println!("| perfkit lint | - | {lines} | - | - | - | - | - | - | {lint_panics} |"),
    }
    if parse_result.panics + lint_panics > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The fastest of several runs of one pass, by wall time and by CPU time (each its own minimum).
struct Best {
    wall: Duration,
    cpu: Option<Duration>,
}

impl Default for Best {
    fn default() -> Best {
        Best {
            wall: Duration::MAX,
            cpu: None,
        }
    }
}

impl Best {
    fn record(&mut self, wall: Duration, cpu: Option<Duration>) {
        self.wall = self.wall.min(wall);
        self.cpu = match (self.cpu, cpu) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    fn cpu_rate_text(&self, lines: usize) -> String {
        self.cpu
            .filter(|cpu| !cpu.is_zero())
            .map_or("-".to_string(), |cpu| {
                format!("{:.0}", lines_per_second(lines, cpu))
            })
    }

    fn cpu_text(&self) -> String {
        self.cpu
            .map_or("-".to_string(), |cpu| format!("{:.3}", cpu.as_secs_f64()))
    }
}

fn bytecount_lines(bytes: &[u8]) -> usize {
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count();
    if bytes.last().is_some_and(|&b| b != b'\n') {
        newlines + 1
    } else {
        newlines
    }
}
