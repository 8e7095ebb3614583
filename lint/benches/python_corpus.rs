//! Python lint benchmark: `perfkit lint` over a corpus of real PyTorch code against the floor it
//! cannot beat, parsing the same files with Ruff's parser (read + parse + drop, same threads),
//! in the same run; a notebook's code cells are read from its JSON as the lint reads them, then
//! parsed. Prints one table, with the ratio of the best runs and the median of each round's own
//! ratio.
//!
//! Usage (through `bench/python-corpus.sh`, which fetches the corpus):
//! `cargo bench -p perfkit-lint --bench python_corpus -- [--jobs N] [--runs N] DIR...`
//!
//! For profilers (`perf`, `valgrind --tool=callgrind`), `--only PASS` runs one pass `--runs`
//! times and prints nothing: `none` (only the set-up every pass shares: listing and counting the
//! files), `plan` (the lint's walk and its grouping of the files into packages, each with its
//! configuration), `floor`, `retain` (the plan, then the floor over the packages as the lint
//! groups them, each package's trees kept until the whole package is parsed, as the lint keeps
//! them for its rules), `parse`, `facts` or `analysis` (the lint ended after that stage, see
//! `--stages`), `front` (no rules) or `lint`. A pass's own cost is its count less `none`'s.
//!
//! `--stages` measures, interleaved, the floor, the walk alone and the lint ended after each of
//! its stages (read and parse with the trees kept, each file's facts, the package-wide analysis,
//! the rules), and prints where the lint's time goes. The table shows the `retain` pass too (without the plan): the lint's ratio to it is
//! what the walk, the analysis and the rules cost, apart from keeping the trees.

mod shared;
use shared::{Best, process_cpu_time};

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use perfkit_lint::{LintOptions, Stage};
use rayon::prelude::*;

/// The Python files and notebooks under `dir`: what the lint parses, so the floor parses them too.
fn python_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            python_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "py" || e == "ipynb") {
            out.push(path);
        }
    }
}

/// The Python code of a file: its text, or a notebook's code cells joined into one module as the
/// lint reads them (the JSON decoded, outputs skipped), with the source type to parse it as.
fn python_code(file: &Path) -> Option<(String, ruff_python_ast::PySourceType)> {
    let text = std::fs::read_to_string(file).ok()?;
    if file.extension().is_some_and(|e| e == "ipynb") {
        let notebook = perfkit_lint::python::notebook::read(&text).ok()?;
        return Some((notebook.source, ruff_python_ast::PySourceType::Ipynb));
    }
    Some((text, ruff_python_ast::PySourceType::Python))
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration, Duration) {
    let cpu_start = process_cpu_time().unwrap_or_default();
    let start = Instant::now();
    let value = f();
    let wall = start.elapsed();
    let cpu = process_cpu_time()
        .unwrap_or_default()
        .saturating_sub(cpu_start);
    (value, wall, cpu)
}

/// Reads and parses one file as the floor does; `None` when it cannot be read or does not parse.
fn parse_one(file: &Path) -> Option<(String, ruff_python_ast::ModModule)> {
    let (text, source_type) = python_code(file)?;
    let options = ruff_python_parser::ParseOptions::from(source_type)
        .with_target_version(ruff_python_ast::PythonVersion::PY314);
    let parsed = ruff_python_parser::parse_unchecked(&text, options);
    if !parsed.errors().is_empty() {
        return None;
    }
    let module = parsed.try_into_module()?.into_syntax();
    Some((text, module))
}

/// Read and parse every file (what the lint cannot avoid); returns the files that did not parse.
fn parse_pass(pool: &rayon::ThreadPool, files: &[PathBuf]) -> usize {
    pool.install(|| {
        files
            .par_iter()
            // One file per task, so that an idle thread can always take the next file: left to
            // split the list in ranges, rayon may hand a thread a run of heavy files while the other
            // thread sleeps (the Rust bench's floor lost a fifth of its wall time that way).
            .with_max_len(1)
            // Each tree is dropped as soon as it is parsed.
            .map(|file| usize::from(parse_one(file).is_none()))
            .sum()
    })
}

fn main() -> ExitCode {
    let mut jobs = 2;
    let mut runs = 3;
    let mut dirs = Vec::new();
    let mut only = None;
    let mut stages = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--jobs" => jobs = args.next().and_then(|n| n.parse().ok()).unwrap_or(2),
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).unwrap_or(3),
            "--only" => only = args.next(),
            "--stages" => stages = true,
            // `cargo bench` passes `--bench`.
            flag if flag.starts_with("--") => {}
            dir => dirs.push(PathBuf::from(dir)),
        }
    }
    if dirs.is_empty() {
        eprintln!(
            "usage: python_corpus [--jobs N] [--runs N] [--stages] DIR...  (see bench/python-corpus.sh)"
        );
        return ExitCode::from(2);
    }
    let mut files = Vec::new();
    for dir in &dirs {
        python_files(dir, &mut files);
    }
    files.sort();
    let lines: usize = files
        .iter()
        .filter_map(|f| python_code(f))
        .map(|(code, _)| code.lines().count())
        .sum();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .expect("thread pool");
    let mut options = LintOptions::new(dirs.clone());
    options.jobs = Some(jobs);

    let (mut parse_wall, mut parse_cpu) = (Duration::MAX, Duration::MAX);
    let (mut lint_wall, mut lint_cpu) = (Duration::MAX, Duration::MAX);
    let (mut front_wall, mut front_cpu) = (Duration::MAX, Duration::MAX);
    let (mut retain_wall, mut retain_cpu) = (Duration::MAX, Duration::MAX);
    // The same run with no rule selected: walk, parse, facts, step-loop analysis, suppressions.
    let mut front_options = options.clone();
    front_options.select = vec!["PK000".to_string()];
    // The lint ended after one of its stages.
    let stage_options = |stage: Stage| {
        let mut cut = options.clone();
        cut.stop_after = Some(stage);
        cut
    };
    if stages {
        let (mut floor, mut plan) = (Best::default(), Best::default());
        let mut best = [Best::default(); 4];
        for _ in 0..runs {
            // Interleaved, so that every pass sees the same machine.
            floor.time(|| parse_pass(&pool, &files));
            if let Err(e) = plan.time(|| perfkit_lint::lint_plan(&options)) {
                eprintln!("lint failed: {e}");
                return ExitCode::FAILURE;
            }
            for ((stage, _), best) in shared::STAGES.iter().zip(&mut best) {
                let cut = match stage {
                    Some(stage) => stage_options(*stage),
                    None => options.clone(),
                };
                if let Err(e) = best.time(|| perfkit_lint::lint(&cut)) {
                    eprintln!("lint failed: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        println!(
            "corpus: {} Python files and notebooks, {lines} lines of code; {jobs} threads, best of {runs} runs",
            files.len()
        );
        shared::print_stages(floor, plan, &best);
        return ExitCode::SUCCESS;
    }
    if let Some(pass) = only {
        for _ in 0..runs {
            let done = match pass.as_str() {
                "none" => Ok(()),
                "floor" => {
                    parse_pass(&pool, &files);
                    Ok(())
                }
                "plan" => perfkit_lint::lint_plan(&options).map(drop),
                "retain" => perfkit_lint::lint_plan(&options).map(|plan| {
                    shared::retain_pass(&pool, &plan, &parse_one, &|| {});
                }),
                "front" => perfkit_lint::lint(&front_options).map(drop),
                "lint" => perfkit_lint::lint(&options).map(drop),
                "parse" => perfkit_lint::lint(&stage_options(Stage::Parse)).map(drop),
                "facts" => perfkit_lint::lint(&stage_options(Stage::Facts)).map(drop),
                "analysis" => perfkit_lint::lint(&stage_options(Stage::Analysis)).map(drop),
                other => {
                    eprintln!(
                        "--only: unknown pass `{other}` (none, plan, floor, retain, parse, facts, \
                         analysis, front or lint)"
                    );
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = done {
                eprintln!("lint failed: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    // The packages as the lint groups them, for the pass that keeps each package's trees.
    let plan = match perfkit_lint::lint_plan(&options) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("lint failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = 0;
    let mut report = None;
    let mut lint_rounds = shared::Rounds::default();
    for _ in 0..runs {
        // Interleaved, so that both passes see the same machine.
        let (f, floor_wall, floor_cpu) = timed(|| parse_pass(&pool, &files));
        failed = f;
        parse_wall = parse_wall.min(floor_wall);
        parse_cpu = parse_cpu.min(floor_cpu);
        let (_, wall, cpu) = timed(|| shared::retain_pass(&pool, &plan, &parse_one, &|| {}));
        retain_wall = retain_wall.min(wall);
        retain_cpu = retain_cpu.min(cpu);
        let (r, wall, cpu) = timed(|| perfkit_lint::lint(&options));
        lint_wall = lint_wall.min(wall);
        lint_cpu = lint_cpu.min(cpu);
        lint_rounds.push(floor_wall, floor_cpu, wall, cpu);
        let (_, wall, cpu) = timed(|| perfkit_lint::lint(&front_options));
        front_wall = front_wall.min(wall);
        front_cpu = front_cpu.min(cpu);
        match r {
            Ok(r) => report = Some(r),
            Err(e) => {
                eprintln!("lint failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let report = report.expect("at least one run");
    println!(
        "corpus: {} Python files and notebooks, {lines} lines of code; {jobs} threads, best of {runs} runs; \
         load average {}",
        files.len(),
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| t.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| "-".into())
    );
    println!();
    println!(
        "| pass | files | lines | wall s | lines/s | CPU s | lines/CPU-s | ratio (wall) | ratio (CPU) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let rate = |t: Duration| lines as f64 / t.as_secs_f64().max(1e-9);
    println!(
        "| ruff_python_parser parse only (floor) | {} | {lines} | {:.3} | {:.0} | {:.3} | {:.0} | 1.00 | 1.00 |",
        files.len(),
        parse_wall.as_secs_f64(),
        rate(parse_wall),
        parse_cpu.as_secs_f64(),
        rate(parse_cpu)
    );
    // One row of a pass measured against the floor.
    let row = |name: &str, files: usize, wall: Duration, cpu: Duration| {
        println!(
            "| {name} | {files} | {lines} | {:.3} | {:.0} | {:.3} | {:.0} | {:.2} | {:.2} |",
            wall.as_secs_f64(),
            rate(wall),
            cpu.as_secs_f64(),
            rate(cpu),
            wall.as_secs_f64() / parse_wall.as_secs_f64().max(1e-9),
            cpu.as_secs_f64() / parse_cpu.as_secs_f64().max(1e-9),
        );
    };
    row(
        "ruff_python_parser parse, each package's trees kept until the package is parsed",
        plan.iter().map(|job| job.files.len()).sum::<usize>(),
        retain_wall,
        retain_cpu,
    );
    row(
        "perfkit lint, no rules (front end + step-loop analysis)",
        report.files_scanned,
        front_wall,
        front_cpu,
    );
    row("perfkit lint", report.files_scanned, lint_wall, lint_cpu);
    println!();
    println!(
        "the lint over the pass that keeps each package's trees: {:.2} in wall time, {:.2} in CPU time \
         (what the analysis and the rules cost; the rest of the lint's ratio is the cost of keeping \
         the trees)",
        lint_wall.as_secs_f64() / retain_wall.as_secs_f64().max(1e-9),
        lint_cpu.as_secs_f64() / retain_cpu.as_secs_f64().max(1e-9),
    );
    println!(
        "each round's own ratio of the lint to the floor run of the same round, median (lowest to \
         highest): {}",
        lint_rounds.text()
    );
    println!(
        "files that did not parse: {failed}; lint errors: {}; findings: {}",
        report.errors.len(),
        report.diagnostics.len()
    );
    for error in &report.errors {
        println!("error: {}: {}", error.path.display(), error.message);
    }
    let mut by_code = std::collections::BTreeMap::new();
    for d in &report.diagnostics {
        *by_code.entry(d.code).or_insert(0usize) += 1;
    }
    println!("findings by code: {by_code:?}");
    ExitCode::SUCCESS
}
