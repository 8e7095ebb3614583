//! The lint run: walk, read and parse files in parallel, group them by crate, analyse, run the
//! rules, apply configuration and suppressions, sort.
//!
//! A crate is processed on one worker thread from parsing to diagnostics, because `syn` spans only
//! resolve to lines and columns on the thread that parsed them; crates run in parallel, largest first.
//! Workers have large stacks, and the analysis bounds its own recursion, so deeply nested input
//! becomes an error entry, never a stack overflow.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::analysis::{
    CrateAnalysis, CrateContext, CrateFile, ExternalFacts, FileId, Framework, Frameworks,
    SourceFile, collect_facts,
};
use crate::config::{self, Config};
use crate::diagnostic::{Diagnostic, FileError, Region, Severity};
use crate::suppress;
use crate::walk::{self, CrateFinder};
use crate::{LintError, LintOptions, LintReport};

/// Files larger than this are reported, not parsed: no hand-written training code is this big,
/// and a syntax tree takes about 120 times its source in memory (a 4 MiB generated file peaks
/// near 500 MB, a 16 MiB one near 1.9 GB).
pub(crate) const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Deepest bracket nesting parsed; deeper files are reported as errors.
pub(crate) const MAX_BRACKET_DEPTH: usize = 1024;
/// Most worker threads a run starts, whatever `--jobs` asks for: more only cost memory and
/// start-up time (each worker reserves [`WORKER_STACK_BYTES`] of stack).
pub const MAX_JOBS: usize = 256;
/// Stack size of the worker threads (parsing deep expressions recurses).
const WORKER_STACK_BYTES: usize = 512 * 1024 * 1024;

struct CrateJob {
    root: PathBuf,
    /// A Python package (`.py` files) rather than a Rust crate.
    python: bool,
    files: Vec<PathBuf>,
    config: Arc<Config>,
    bytes: u64,
    /// A Rust crate's `Cargo.toml`, read once for the run (see [`cargo_manifest`]); `Ok(None)`
    /// for a Python package or a crate without one.
    manifest: Result<Option<toml::Table>, FileError>,
}

#[derive(Default)]
struct CrateOutput {
    diagnostics: Vec<Diagnostic>,
    errors: Vec<FileError>,
    /// What the crate passes to the unpublished libraries of the run it depends on.
    exported: Option<ExternalFacts>,
}

/// The crates and packages of a run, each with its files and configuration, largest first (the
/// order they are linted in), and the paths that could not be walked.
fn plan(options: &LintOptions) -> Result<(Vec<CrateJob>, Vec<FileError>), LintError> {
    for (flag, list) in [("--select", &options.select), ("--ignore", &options.ignore)] {
        for code in list {
            if config::check_code(code).is_err() {
                return Err(LintError::UnknownCode {
                    flag,
                    code: code.clone(),
                });
            }
        }
    }
    if options.jobs == Some(0) {
        return Err(LintError::Threads("--jobs must be at least 1".to_string()));
    }
    let explicit = match &options.config_file {
        Some(path) => Some(Arc::new(Config::from_file(path)?)),
        None => None,
    };
    let paths = if options.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        options.paths.clone()
    };
    let walked = walk::walk(&paths);
    let mut errors = walked.errors;

    // Group files into crates, each with its configuration.
    let mut finder = CrateFinder::new();
    // By directory: its configuration, or the configuration file that is invalid (its files are
    // not linted, and it is reported once, as an error entry: one bad configuration does not
    // stop the run).
    let mut configs: HashMap<PathBuf, Result<Arc<Config>, PathBuf>> = HashMap::new();
    let mut broken: std::collections::BTreeMap<PathBuf, (String, usize)> =
        std::collections::BTreeMap::new();
    let mut crates = Crates::default();
    let mut python_roots = HashMap::new();
    let mut discovered = HashMap::new();
    // The package root and configuration of the last Python file's directory: the walk sorts files,
    // so a directory's files come one after another and are placed with one lookup.
    let mut last_python_dir: Option<(PathBuf, PathBuf, Arc<Config>)> = None;
    for file in walked.files {
        let python = is_python(&file);
        if python
            && let Some((dir, root, config)) = &last_python_dir
            && file.parent() == Some(dir.as_path())
        {
            let (root, config) = (root.clone(), config.clone());
            add_file(&mut crates, file, root, python, config);
            continue;
        }
        let root = if python {
            crate::python::package_root(&file, &mut python_roots)
        } else {
            finder.crate_of(&file)
        };
        let config = match &explicit {
            Some(config) => config.clone(),
            None => {
                // A Python package root is always a directory (no `stat` needed).
                let dir = if python || root.is_dir() {
                    root.clone()
                } else {
                    root.parent().map(Path::to_path_buf).unwrap_or_default()
                };
                let found = match configs.get(&dir) {
                    Some(found) => found.clone(),
                    None => {
                        let found = match config::discover_cached(&dir, &mut discovered) {
                            Some(path) => match Config::from_file(&path) {
                                Ok(config) => Ok(Arc::new(config)),
                                Err(error) => {
                                    broken
                                        .entry(path.clone())
                                        .or_insert_with(|| (config_error_detail(&error), 0));
                                    Err(path)
                                }
                            },
                            None => Ok(Arc::new(Config::default())),
                        };
                        configs.insert(dir, found.clone());
                        found
                    }
                };
                match found {
                    Ok(config) => config,
                    Err(path) => {
                        if let Some((_, files)) = broken.get_mut(&path) {
                            *files += 1;
                        }
                        continue;
                    }
                }
            }
        };
        if python && let Some(dir) = file.parent() {
            last_python_dir = Some((dir.to_path_buf(), root.clone(), config.clone()));
        }
        add_file(&mut crates, file, root, python, config);
    }
    for (path, (message, files)) in broken {
        let files = if files == 1 {
            "the file it configures was".to_string()
        } else {
            format!("the {files} files it configures were")
        };
        errors.push(FileError {
            path,
            message: format!("invalid configuration: {message}; {files} not linted"),
            line: None,
        });
    }
    let mut jobs = crates.jobs;
    // Largest first, so one big crate does not start last.
    jobs.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| a.root.cmp(&b.root))
            .then_with(|| a.python.cmp(&b.python))
    });
    for job in jobs.iter_mut().filter(|job| !job.python) {
        job.manifest = cargo_manifest(&job.root);
    }
    Ok((jobs, errors))
}

/// What is wrong with a configuration file, without its path (the error entry names it).
fn config_error_detail(error: &LintError) -> String {
    match error {
        LintError::Config { message, .. } => message.clone(),
        LintError::ConfigIo { source, .. } => format!("cannot read it: {source}"),
        other => other.to_string(),
    }
}

/// The jobs of [`plan`], as the library lists them.
pub(crate) fn plan_jobs(options: &LintOptions) -> Result<Vec<crate::PlannedJob>, LintError> {
    let (jobs, _) = plan(options)?;
    Ok(jobs
        .into_iter()
        .map(|job| crate::PlannedJob {
            root: job.root,
            python: job.python,
            files: job.files,
        })
        .collect())
}

pub(crate) fn run(options: &LintOptions) -> Result<LintReport, LintError> {
    let (jobs, mut errors) = plan(options)?;
    let total: usize = jobs.iter().map(|j| j.files.len()).sum();
    let done = AtomicUsize::new(0);
    let feeders = workspace_feeders(&jobs);
    let waves = waves_of(&feeders);
    let exports: Vec<bool> = {
        let mut exports = vec![false; jobs.len()];
        for list in &feeders {
            for &d in list {
                exports[d] = true;
            }
        }
        exports
    };

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let builder = rayon::ThreadPoolBuilder::new()
        .stack_size(WORKER_STACK_BYTES)
        .num_threads(pool_size(options.jobs, total, cores));
    let pool = builder
        .build()
        .map_err(|e| LintError::Threads(format!("cannot start worker threads: {e}")))?;
    // Longest job first onto whichever worker is free (a shared queue over the sorted jobs): the
    // run ends close to max(largest crate, total / workers). A library that only packages of the
    // run can call waits for them (a later wave), to take their device facts.
    let outputs: Mutex<Vec<(usize, CrateOutput)>> = Mutex::new(Vec::with_capacity(jobs.len()));
    let mut exported: HashMap<usize, ExternalFacts> = HashMap::new();
    for wave in &waves {
        let next = AtomicUsize::new(0);
        let inputs: Vec<ExternalFacts> = wave
            .iter()
            .map(|&j| {
                let mut facts = ExternalFacts::default();
                for d in &feeders[j] {
                    if let Some(given) = exported.get(d) {
                        facts.extend(given);
                    }
                }
                facts
            })
            .collect();
        let workers = pool.current_num_threads().min(wave.len()).max(1);
        pool.scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|_| {
                    loop {
                        let at = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&index) = wave.get(at) else {
                            break;
                        };
                        let output = lint_crate_guarded(
                            &jobs[index],
                            options,
                            &inputs[at],
                            exports[index],
                            &done,
                            total,
                        );
                        outputs
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .push((index, output));
                    }
                });
            }
        });
        let mut outputs = outputs.lock().unwrap_or_else(|p| p.into_inner());
        for (index, output) in outputs.iter_mut() {
            if let Some(facts) = output.exported.take() {
                exported.insert(*index, facts);
            }
        }
    }
    let mut outputs = outputs
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    outputs.sort_by_key(|(index, _)| *index);

    let mut diagnostics = Vec::new();
    for (_, output) in outputs {
        diagnostics.extend(output.diagnostics);
        errors.extend(output.errors);
    }
    diagnostics.sort_by(|a, b| {
        (
            &a.path,
            a.cell,
            a.region.line,
            a.region.column,
            a.code,
            &a.message,
        )
            .cmp(&(
                &b.path,
                b.cell,
                b.region.line,
                b.region.column,
                b.code,
                &b.message,
            ))
    });
    errors.sort_by(|a, b| (&a.path, a.line, &a.message).cmp(&(&b.path, b.line, &b.message)));
    Ok(LintReport {
        files_scanned: total,
        diagnostics,
        errors,
    })
}

/// Worker threads for a run of `files` files: `--jobs` (else one per core), never more than
/// there are files to parse nor more than [`MAX_JOBS`], and at least one.
fn pool_size(jobs: Option<usize>, files: usize, cores: usize) -> usize {
    jobs.unwrap_or(cores).min(files).clamp(1, MAX_JOBS)
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    #[test]
    fn the_pool_is_capped_at_the_files_and_the_maximum() {
        assert_eq!(pool_size(Some(65535), 3, 8), 3);
        assert_eq!(pool_size(Some(65535), 100_000, 8), MAX_JOBS);
        assert_eq!(pool_size(None, 100_000, 8), 8);
        assert_eq!(pool_size(Some(4), 0, 8), 1);
        assert_eq!(pool_size(Some(2), 10, 8), 2);
    }
}

/// Lints one crate; an internal panic becomes an error entry for the crate's files instead of
/// taking the run down.
fn lint_crate_guarded(
    job: &CrateJob,
    options: &LintOptions,
    external: &ExternalFacts,
    export: bool,
    done: &AtomicUsize,
    total: usize,
) -> CrateOutput {
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        lint_crate(job, options, external, export)
    }));
    // Parsed files are gone now: release this thread's span table so memory stays bounded.
    proc_macro2::extra::invalidate_current_thread_spans();
    let finished = done.fetch_add(job.files.len(), Ordering::Relaxed) + job.files.len();
    if let Some(progress) = &options.progress {
        progress(finished, total);
    }
    result.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".to_string());
        CrateOutput {
            diagnostics: Vec::new(),
            exported: None,
            errors: job
                .files
                .iter()
                .map(|path| FileError {
                    path: path.clone(),
                    message: format!("internal error while linting this crate: {what}"),
                    line: None,
                })
                .collect(),
        }
    })
}

/// The crates and packages of a run, as their files are added.
#[derive(Default)]
struct Crates {
    jobs: Vec<CrateJob>,
    /// Index in `jobs` by root and language. A hash map: a tree ordered by path compared the
    /// (long, similar) paths component by component at every level, for every file.
    index: rustc_hash::FxHashMap<(PathBuf, bool), usize>,
}

/// Adds `file` to the job of its crate or package, unless its configuration excludes it.
fn add_file(crates: &mut Crates, file: PathBuf, root: PathBuf, python: bool, config: Arc<Config>) {
    if config.excludes_any() {
        let absolute = crate::walk::absolute_path(&file);
        if config.is_excluded(&absolute) {
            return;
        }
    }
    let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let Crates { jobs, index } = crates;
    let at = *index.entry((root.clone(), python)).or_insert_with(|| {
        jobs.push(CrateJob {
            root,
            python,
            files: Vec::new(),
            config,
            bytes: 0,
            manifest: Ok(None),
        });
        jobs.len() - 1
    });
    let job = &mut jobs[at];
    job.bytes += bytes;
    job.files.push(file);
}

/// Whether a walked file is Python source (a `.py` file or a Jupyter notebook).
pub(crate) fn is_python(path: &Path) -> bool {
    match path.extension().and_then(|e| e.to_str()) {
        Some("py" | "ipynb") => true,
        Some("rs") => false,
        Some(e)
            if ["py", "pyi", "pyw"]
                .iter()
                .any(|p| e.eq_ignore_ascii_case(p)) =>
        {
            true
        }
        // Only a file given by name gets here (the walk takes `.rs`, `.py` and `.ipynb`): a script
        // without the extension is Python when its first line runs Python, else it is read as Rust.
        _ => has_python_shebang(path),
    }
}

/// Whether a file starts with a `#!` line that runs Python (`#!/usr/bin/env python3`).
fn has_python_shebang(path: &Path) -> bool {
    let mut head = [0u8; 256];
    let Ok(mut file) = std::fs::File::open(path) else {
        // Unreadable: reported when it is read.
        return false;
    };
    let Ok(n) = std::io::Read::read(&mut file, &mut head) else {
        return false;
    };
    let first = head[..n].split(|&b| b == b'\n').next().unwrap_or_default();
    first.starts_with(b"#!") && memchr::memmem::find(first, b"python").is_some()
}

/// Largest notebook read: a notebook's JSON also holds its outputs (plots, tables), so it may be
/// much larger than its code; the code itself is held to [`MAX_FILE_BYTES`].
const MAX_NOTEBOOK_BYTES: u64 = 64 * 1024 * 1024;

/// Reads a `.py` file or a notebook's code cells and parses it.
fn read_python(path: &Path) -> Result<crate::python::PyFile, FileError> {
    if !crate::python::notebook::is_notebook(path) {
        return read_source(path)
            .and_then(|source| crate::python::PyFile::parse(path.to_path_buf(), source));
    }
    let text = read_source_limited(path, MAX_NOTEBOOK_BYTES)?;
    let file = crate::python::PyFile::parse_notebook(path.to_path_buf(), &text)?;
    if file.source.len() as u64 > MAX_FILE_BYTES {
        return Err(FileError {
            path: path.to_path_buf(),
            message: format!(
                "notebook code too large ({:.1} MiB; more than {} MiB of code is not linted)",
                file.source.len() as f64 / (1024.0 * 1024.0),
                MAX_FILE_BYTES / (1024 * 1024)
            ),
            line: None,
        });
    }
    Ok(file)
}

/// Moves the findings of notebooks from lines of the module built from their code cells to the
/// cell and the line within it, and drops their fixes: perfkit does not rewrite notebooks.
fn map_notebook_findings(units: &[crate::python::PyUnit<'_>], diagnostics: &mut [Diagnostic]) {
    let notebooks: HashMap<&Path, &crate::python::notebook::CellIndex> = units
        .iter()
        .filter_map(|u| Some((u.file.path.as_path(), u.file.notebook.as_ref()?)))
        .collect();
    if notebooks.is_empty() {
        return;
    }
    for d in diagnostics.iter_mut() {
        let Some(index) = notebooks.get(d.path.as_path()) else {
            continue;
        };
        let Some((cell, line)) = index.locate(d.region.line) else {
            continue;
        };
        let (end_line, end_column) = match index.locate(d.region.end_line) {
            Some((end_cell, end_line)) if end_cell == cell => (end_line, d.region.end_column),
            _ => (line, d.region.column + 1),
        };
        d.cell = Some(cell);
        d.region = Region {
            line,
            column: d.region.column,
            end_line,
            end_column,
        };
        d.fix = None;
    }
}

/// Turns a rule's findings into diagnostics of `path_of(file)`, with the configured severity.
fn push_findings<'s>(
    meta: &crate::RuleMeta,
    config: &Config,
    findings: &mut Vec<crate::Finding>,
    path_of: &dyn Fn(FileId) -> PathBuf,
    source_of: &dyn Fn(FileId) -> &'s str,
    out: &mut Vec<Diagnostic>,
) {
    // Findings come file by file: the fingerprint of the last file is kept.
    let mut fingerprint: Option<(FileId, u64)> = None;
    for mut finding in findings.drain(..) {
        if let Some(fix) = &mut finding.fix {
            let linted = match fingerprint {
                Some((file, linted)) if file == finding.file => linted,
                _ => {
                    let linted = crate::diagnostic::source_fingerprint(source_of(finding.file));
                    fingerprint = Some((finding.file, linted));
                    linted
                }
            };
            fix.linted = Some(linted);
        }
        let severity = if finding.lowered {
            Severity::Note
        } else {
            config.severity_of(meta.code, meta.default_severity)
        };
        out.push(Diagnostic {
            code: meta.code,
            name: meta.name,
            severity,
            path: path_of(finding.file),
            cell: None,
            region: finding.region,
            message: finding.message,
            help: finding.help,
            notes: finding.notes,
            fix: finding.fix,
        });
    }
}

/// Lints one Python package: parse every file (a file that does not parse is an error entry and
/// the others are still linted), lower to facts, analyse step loops, run each rule's Python check.
fn lint_python(job: &CrateJob, options: &LintOptions) -> CrateOutput {
    let mut output = CrateOutput::default();
    // Each file's facts are collected right after it is parsed, while its tree is still in cache;
    // the arena keeps the trees alive (and in place) for the rules.
    let parsed: typed_arena::Arena<crate::python::PyFile> =
        typed_arena::Arena::with_capacity(job.files.len());
    let mut units: Vec<crate::python::PyUnit<'_>> = Vec::with_capacity(job.files.len());
    for path in &job.files {
        match read_python(path) {
            Ok(file) => {
                let file: &crate::python::PyFile = parsed.alloc(file);
                if options.stop_after == Some(crate::Stage::Parse) {
                    continue;
                }
                let facts = crate::python::facts::collect(file);
                if let Some(at) = facts.too_deep {
                    let limit = crate::python::facts::MAX_NESTING;
                    let error = match file.notebook {
                        Some(_) => FileError {
                            path: file.path.clone(),
                            message: format!(
                                "nesting too deep in {} (more than {limit} levels), not linted",
                                file.line_name(at)
                            ),
                            line: None,
                        },
                        None => FileError {
                            path: file.path.clone(),
                            message: format!(
                                "nesting too deep (more than {limit} levels), not linted"
                            ),
                            line: Some(file.line_of(at)),
                        },
                    };
                    output.errors.push(partial_package(error, job));
                    continue;
                }
                units.push(crate::python::PyUnit { file, facts });
            }
            Err(err) => output.errors.push(partial_package(err, job)),
        }
    }
    let config = &job.config;
    if options
        .stop_after
        .is_some_and(|s| s != crate::Stage::Analysis)
    {
        return output;
    }
    let cx = crate::python::PyContext::build(&units, config);
    if options.stop_after.is_some() {
        return output;
    }
    let enabled = |code: &str| config.is_enabled(code, &options.select, &options.ignore);
    let mut findings = Vec::new();
    let path_of = |file: FileId| units[file.0].file.path.clone();
    for rule in crate::rules() {
        let meta = rule.meta();
        if meta.code == "PK000" || !enabled(meta.code) {
            continue;
        }
        rule.check_python(&cx, &mut findings);
        push_findings(
            meta,
            config,
            &mut findings,
            &path_of,
            &|file: FileId| units[file.0].file.source.as_str(),
            &mut output.diagnostics,
        );
    }
    let mut by_path: HashMap<&Path, Vec<suppress::Suppression>> = HashMap::new();
    for unit in &units {
        let found = crate::python::suppress::parse(unit.file);
        if !found.is_empty() {
            by_path.insert(unit.file.path.as_path(), found);
        }
    }
    apply_suppression_lists(by_path, &mut output.diagnostics, &enabled);
    map_notebook_findings(&units, &mut output.diagnostics);
    output
}

/// A file of a package (or crate) with other files that could not be read or parsed: the others
/// are linted without its functions, so a step loop that runs through them, and the findings
/// that follow from it, may be missing. The error says so.
fn partial_package(mut err: FileError, job: &CrateJob) -> FileError {
    if job.files.len() > 1 {
        let kind = if job.python { "package" } else { "crate" };
        err.message
            .push_str(&format!("; the rest of its {kind} was linted without it"));
    }
    err
}

fn lint_crate(
    job: &CrateJob,
    options: &LintOptions,
    external: &ExternalFacts,
    export: bool,
) -> CrateOutput {
    if job.python {
        return lint_python(job, options);
    }
    let mut output = CrateOutput::default();
    // Each file's facts are collected right after it is parsed, while its tree is still in cache;
    // the arena keeps the trees alive (and in place) for the rules.
    let parsed: typed_arena::Arena<SourceFile> = typed_arena::Arena::new();
    let mut files: Vec<CrateFile<'_>> = Vec::with_capacity(job.files.len());
    for path in &job.files {
        let file: &SourceFile = match read_and_parse(path) {
            Ok(file) => parsed.alloc(file),
            Err(err) => {
                output.errors.push(partial_package(err, job));
                continue;
            }
        };
        if options.stop_after == Some(crate::Stage::Parse) {
            continue;
        }
        let facts = collect_facts(file, is_test_target(&job.root, &file.path));
        if let Some(span) = facts.too_deep {
            let line = span.start().line;
            let error = FileError {
                path: file.path.clone(),
                message: format!(
                    "nesting too deep (more than {} levels), not linted",
                    crate::analysis::MAX_NESTING
                ),
                line: (line > 0).then_some(line),
            };
            output.errors.push(partial_package(error, job));
            continue;
        }
        files.push(CrateFile {
            id: FileId(files.len()),
            file,
            facts,
        });
    }
    let manifest = match &job.manifest {
        Ok(table) => table.as_ref(),
        Err(err) => {
            output.errors.push(err.clone());
            None
        }
    };
    if options
        .stop_after
        .is_some_and(|s| s != crate::Stage::Analysis)
    {
        return output;
    }
    let (mut crate_frameworks, framework_package) = package_frameworks(manifest);
    let analysis = CrateAnalysis::build(
        &job.root,
        &files,
        &job.config.step_markers,
        framework_package,
        external,
    );
    if export {
        output.exported = Some(analysis.export(&files));
    }
    analysis.mark_test_code(&mut files);
    if options.stop_after.is_some() {
        return output;
    }
    for file in &files {
        crate_frameworks = crate_frameworks.union(file.facts.frameworks);
    }
    let cx = CrateContext {
        root: &job.root,
        files: &files,
        config: &job.config,
        analysis: &analysis,
        crate_frameworks,
    };
    let config = &job.config;
    let enabled = |code: &str| config.is_enabled(code, &options.select, &options.ignore);
    let mut findings = Vec::new();
    for rule in crate::rules() {
        let meta = rule.meta();
        if meta.code == "PK000" || !enabled(meta.code) {
            continue;
        }
        rule.check(&cx, &mut findings);
        let path_of = |file: FileId| files[file.0].file.path.clone();
        push_findings(
            meta,
            config,
            &mut findings,
            &path_of,
            &|file: FileId| files[file.0].file.source.as_str(),
            &mut output.diagnostics,
        );
    }
    apply_suppressions(&files, &mut output.diagnostics, &enabled);
    output
}

fn apply_suppressions(
    files: &[CrateFile<'_>],
    diagnostics: &mut Vec<Diagnostic>,
    enabled: &dyn Fn(&str) -> bool,
) {
    let mut by_path: HashMap<&Path, Vec<suppress::Suppression>> = HashMap::new();
    for file in files {
        let found = suppress::parse(file.source());
        if !found.is_empty() {
            by_path.insert(file.path(), found);
        }
    }
    apply_suppression_lists(by_path, diagnostics, enabled);
}

/// Removes the diagnostics that suppression comments cover and reports the unused ones as PK000.
fn apply_suppression_lists(
    mut by_path: HashMap<&Path, Vec<suppress::Suppression>>,
    diagnostics: &mut Vec<Diagnostic>,
    enabled: &dyn Fn(&str) -> bool,
) {
    if by_path.is_empty() {
        return;
    }
    diagnostics.retain(|d| {
        let Some(list) = by_path.get_mut(d.path.as_path()) else {
            return true;
        };
        let mut suppressed = false;
        for s in list.iter_mut() {
            suppressed |= s.covers(d.code, d.region.line);
        }
        !suppressed
    });
    if !enabled("PK000") {
        return;
    }
    let meta = crate::rules::pk000::UnusedSuppression::meta_static();
    for (path, list) in by_path {
        for s in list {
            for (code, used) in s.codes.iter().zip(&s.used) {
                if *used {
                    continue;
                }
                let known = crate::rule_by_code(code).is_some();
                // A disabled rule cannot use its suppressions; that is not a reason to report them.
                if known && !enabled(code) {
                    continue;
                }
                let (message, help) = if known {
                    (
                        format!("unused suppression of `{code}`"),
                        format!("remove `{code}` from the comment: nothing here triggers it"),
                    )
                } else if crate::rules()
                    .iter()
                    .any(|rule| rule.meta().code.starts_with(code.as_str()))
                {
                    (
                        format!("suppression names the prefix `{code}`, not a rule code"),
                        "name each rule in full (`PK101`); `perfkit rules` lists the codes"
                            .to_string(),
                    )
                } else {
                    (
                        format!("suppression names unknown rule code `{code}`"),
                        "fix the code or remove it; `perfkit rules` lists the codes".to_string(),
                    )
                };
                diagnostics.push(Diagnostic {
                    code: meta.code,
                    name: meta.name,
                    severity: Severity::Note,
                    path: path.to_path_buf(),
                    cell: None,
                    region: Region {
                        line: s.line,
                        column: s.column,
                        end_line: s.line,
                        end_column: s.end_column,
                    },
                    message,
                    help,
                    notes: Vec::new(),
                    fix: None,
                });
            }
        }
    }
}

/// For each job, the jobs whose device facts it takes: the Rust packages of the run that depend
/// on it by path (directly or through `workspace = true`) when it is not published
/// (`publish = false`), so that they are the only code that can call it.
fn workspace_feeders(jobs: &[CrateJob]) -> Vec<Vec<usize>> {
    let mut feeders = vec![Vec::new(); jobs.len()];
    let manifests: Vec<Option<Manifest>> = jobs
        .iter()
        .map(|j| {
            // A manifest that cannot be read is reported once, by the crate's own lint.
            let table = j.manifest.as_ref().ok()?.as_ref()?;
            Manifest::from_table(&j.root, table)
        })
        .collect();
    let unpublished: HashMap<PathBuf, usize> = manifests
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let m = m.as_ref()?;
            (!m.publish).then(|| Some((std::fs::canonicalize(&jobs[i].root).ok()?, i)))?
        })
        .collect();
    if unpublished.is_empty() {
        return feeders;
    }
    for (d, manifest) in manifests.iter().enumerate() {
        let Some(manifest) = manifest else { continue };
        for dep in &manifest.path_deps {
            if let Ok(dep) = std::fs::canonicalize(dep)
                && let Some(&lib) = unpublished.get(&dep)
                && lib != d
                && !feeders[lib].contains(&d)
            {
                feeders[lib].push(d);
            }
        }
    }
    feeders
}

/// The jobs in waves: a job runs in a later wave than every job that feeds it.
fn waves_of(feeders: &[Vec<usize>]) -> Vec<Vec<usize>> {
    fn level(j: usize, feeders: &[Vec<usize>], memo: &mut [Option<usize>], depth: usize) -> usize {
        if let Some(l) = memo[j] {
            return l;
        }
        // Cargo forbids dependency cycles; a malformed tree stops here.
        if depth > feeders.len() {
            return 0;
        }
        let l = feeders[j]
            .iter()
            .map(|&d| level(d, feeders, memo, depth + 1) + 1)
            .max()
            .unwrap_or(0);
        memo[j] = Some(l);
        l
    }
    let mut memo = vec![None; feeders.len()];
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for j in 0..feeders.len() {
        let l = level(j, feeders, &mut memo, 0);
        if waves.len() <= l {
            waves.resize(l + 1, Vec::new());
        }
        waves[l].push(j);
    }
    waves
}

/// What the engine reads of a package's `Cargo.toml`: whether it is published, and the
/// directories of its path dependencies.
struct Manifest {
    publish: bool,
    path_deps: Vec<PathBuf>,
}

impl Manifest {
    /// What the `Cargo.toml` of the package at `root` says; `None` for a workspace root without
    /// a package.
    fn from_table(root: &Path, table: &toml::Table) -> Option<Manifest> {
        let package = table.get("package")?;
        let mut workspace: Option<Option<(PathBuf, toml::Table)>> = None;
        let mut workspace_table = || -> Option<(PathBuf, toml::Table)> {
            workspace
                .get_or_insert_with(|| {
                    root.ancestors().skip(1).find_map(|dir| {
                        let text = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
                        let table = text.parse::<toml::Table>().ok()?;
                        table
                            .contains_key("workspace")
                            .then(|| (dir.to_path_buf(), table))
                    })
                })
                .clone()
        };
        // `publish = false`, or `publish = []` (no registry): not published.
        let publishes = |value: &toml::Value| match value {
            toml::Value::Boolean(b) => Some(*b),
            toml::Value::Array(registries) => Some(!registries.is_empty()),
            _ => None,
        };
        let publish = match package.get("publish") {
            Some(toml::Value::Table(t))
                if t.get("workspace").and_then(|w| w.as_bool()) == Some(true) =>
            {
                workspace_table()
                    .and_then(|(_, ws)| {
                        publishes(ws.get("workspace")?.get("package")?.get("publish")?)
                    })
                    .unwrap_or(true)
            }
            Some(value) => publishes(value).unwrap_or(true),
            None => true,
        };
        let mut path_deps = Vec::new();
        let mut deps_of = |deps: Option<&toml::Value>| {
            let Some(deps) = deps.and_then(|d| d.as_table()) else {
                return;
            };
            for (name, spec) in deps {
                if let Some(path) = spec.get("path").and_then(|p| p.as_str()) {
                    path_deps.push(root.join(path));
                } else if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true)
                    && let Some((dir, ws)) = workspace_table()
                    && let Some(path) = ws
                        .get("workspace")
                        .and_then(|w| w.get("dependencies"))
                        .and_then(|d| d.get(name))
                        .and_then(|d| d.get("path"))
                        .and_then(|p| p.as_str())
                {
                    path_deps.push(dir.join(path));
                }
            }
        };
        deps_of(table.get("dependencies"));
        if let Some(targets) = table.get("target").and_then(|t| t.as_table()) {
            for target in targets.values() {
                deps_of(target.get("dependencies"));
            }
        }
        Some(Manifest { publish, path_deps })
    }
}

/// A package's `Cargo.toml` as a table: `Ok(None)` where the package has none (a lone file); an
/// error naming the manifest, and its line, where it cannot be read or is not valid TOML.
fn cargo_manifest(root: &Path) -> Result<Option<toml::Table>, FileError> {
    if !root.is_dir() {
        return Ok(None);
    }
    let path = root.join("Cargo.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(FileError {
                path,
                message: format!(
                    "cannot read the package manifest ({err}): the crate is linted without its dependencies"
                ),
                line: None,
            });
        }
    };
    text.parse::<toml::Table>().map(Some).map_err(|err| {
        let line = err
            .span()
            .map(|span| crate::diagnostic::line_at_offset(text.as_bytes(), span.start));
        FileError {
            path,
            message: format!(
                "the package manifest is not valid TOML ({}): the crate is linted without its dependencies",
                err.message().trim_end()
            ),
            line,
        }
    })
}

/// The frameworks a package depends on, and whether the package is itself one of them (the
/// framework's own repository: its examples call its library as users call the published crate).
fn package_frameworks(table: Option<&toml::Table>) -> (Frameworks, bool) {
    let mut found = Frameworks::NONE;
    let Some(table) = table else {
        return (found, false);
    };
    let is_framework = table
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .and_then(Framework::from_crate_name)
        .is_some();
    let mut add_deps = |deps: Option<&toml::Value>| {
        let Some(deps) = deps.and_then(|d| d.as_table()) else {
            return;
        };
        for (name, spec) in deps {
            let package = spec.get("package").and_then(|p| p.as_str()).unwrap_or(name);
            if let Some(framework) = Framework::from_crate_name(package) {
                found.insert(framework);
            }
        }
    };
    add_deps(table.get("dependencies"));
    if let Some(targets) = table.get("target").and_then(|t| t.as_table()) {
        for target in targets.values() {
            add_deps(target.get("dependencies"));
        }
    }
    (found, is_framework)
}

/// Whether `path` belongs to an integration-test or benchmark target of the package at `root`: it
/// lies under the package's own `tests/` or `benches/` directory (`src/tests/` is library code).
fn is_test_target(root: &Path, path: &Path) -> bool {
    let absolute = crate::walk::absolute_path(path);
    let Ok(relative) = absolute.strip_prefix(root) else {
        return false;
    };
    let mut parts = relative.components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(dir)), Some(_)) if dir == "tests" || dir == "benches"
    )
}

fn read_and_parse(path: &Path) -> Result<SourceFile, FileError> {
    let source = read_source(path)?;
    let error = |message: String, line: Option<usize>| FileError {
        path: path.to_path_buf(),
        message,
        line,
    };
    if let Some(line) = too_deep_line(&source) {
        return Err(error(
            format!(
                "nesting too deep (more than {MAX_BRACKET_DEPTH} levels of brackets), not linted"
            ),
            Some(line),
        ));
    }
    if let Some(line) = crate::nesting::too_deep_line(&source) {
        return Err(error(
            format!(
                "nesting too deep (more than {} tokens nested without a `,` or `;`), not linted",
                crate::nesting::MAX_NEST_TOKENS
            ),
            Some(line),
        ));
    }
    SourceFile::parse(path.to_path_buf(), source).map_err(|err| {
        let line = err.span().start().line;
        // A file named on the command line is read as Rust unless its name says Python: say so
        // when its name does not say Rust either (`perfkit lint README.md`).
        let read_as = if path.extension().is_some_and(|e| e == "rs") {
            ""
        } else {
            " (read as Rust: a file given by name is Rust unless it ends in .py or .ipynb)"
        };
        error(
            format!("syntax error: {err}{read_as}"),
            (line > 0).then_some(line),
        )
    })
}

/// Reads a source file as UTF-8 text, or says why not (missing, too large, binary, not UTF-8).
fn read_source(path: &Path) -> Result<String, FileError> {
    read_source_limited(path, MAX_FILE_BYTES)
}

/// [`read_source`] with its own size limit.
fn read_source_limited(path: &Path, limit: u64) -> Result<String, FileError> {
    let error = |message: String, line: Option<usize>| FileError {
        path: path.to_path_buf(),
        message,
        line,
    };
    // One open and one `fstat` per file (not a `stat` of the path and then `std::fs::read`'s own).
    let mut file = std::fs::File::open(path).map_err(|e| error(walk::io_message(&e), None))?;
    let meta = file
        .metadata()
        .map_err(|e| error(walk::io_message(&e), None))?;
    if meta.len() > limit {
        return Err(error(
            format!(
                "file too large ({:.1} MiB; files over {} MiB are not linted)",
                meta.len() as f64 / (1024.0 * 1024.0),
                limit / (1024 * 1024)
            ),
            None,
        ));
    }
    // Read into a buffer of the size `fstat` gave (plus the byte that shows the end): `File`'s
    // own `read_to_end` would `fstat` the file again and `lseek` for its position, and a reader
    // without a size hint reads in 8 KiB steps; both cost system calls per file. The buffer is
    // not zeroed first: the reads fill it. A file that grows meanwhile is still read whole, up to
    // the limit.
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, limit + 1), &mut bytes)
        .map_err(|e| error(walk::io_message(&e), None))?;
    if bytes.len() as u64 > limit {
        return Err(error(
            format!(
                "file too large (it grew while being read; files over {} MiB are not linted)",
                limit / (1024 * 1024)
            ),
            None,
        ));
    }
    if bytes[..bytes.len().min(8192)].contains(&0) {
        return Err(error(
            "binary file (contains NUL bytes), not linted".into(),
            None,
        ));
    }
    let source = match String::from_utf8(bytes) {
        Ok(source) => source,
        Err(err) => {
            let valid = err.utf8_error().valid_up_to();
            let line = crate::diagnostic::line_at_offset(err.as_bytes(), valid);
            return Err(error("invalid UTF-8".into(), Some(line)));
        }
    };
    Ok(source)
}

/// The line where bracket nesting first exceeds [`MAX_BRACKET_DEPTH`], if it does. Brackets in
/// strings and comments count too: a conservative, linear pre-check before the recursive parser.
///
/// Runs over every byte of every file, so it works in 64-byte blocks: a block can raise the depth
/// by at most 64, so while the depth is far below the limit only the block's net change is needed
/// (a sum of byte comparisons the compiler vectorizes); near the limit it goes byte by byte.
fn too_deep_line(source: &str) -> Option<usize> {
    const BLOCK: usize = 64;
    let bytes = source.as_bytes();
    let limit = MAX_BRACKET_DEPTH as i64;
    let mut depth: i64 = 0;
    let mut start = 0;
    while start < bytes.len() {
        let end = (start + BLOCK).min(bytes.len());
        let block = &bytes[start..end];
        if depth + (BLOCK as i64) <= limit {
            // Counts in u8 lanes (at most 64 each): vectorized.
            let (mut opens, mut closes) = (0u8, 0u8);
            for &b in block {
                opens += u8::from((b == b'(') | (b == b'[') | (b == b'{'));
                closes += u8::from((b == b')') | (b == b']') | (b == b'}'));
            }
            depth = (depth + i64::from(opens) - i64::from(closes)).max(0);
        } else {
            for &b in block {
                let open = i64::from((b == b'(') | (b == b'[') | (b == b'{'));
                let close = i64::from((b == b')') | (b == b']') | (b == b'}'));
                depth = (depth + open - close).max(0);
                if depth > limit {
                    // Brackets in comments and literals count here: the exact count decides.
                    let at = crate::nesting::code_bracket_too_deep(bytes, MAX_BRACKET_DEPTH)?;
                    return Some(crate::diagnostic::line_at_offset(bytes, at));
                }
            }
        }
        start = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_read_whole_at_every_size_and_held_to_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        for len in [0, 1, 4095, 8192, 8193, 100_000] {
            let text: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            let path = dir.path().join(format!("f{len}.py"));
            std::fs::write(&path, &text).unwrap();
            assert_eq!(read_source(&path).expect("readable"), text, "{len} bytes");
            // At the limit it is read; one byte over, it is an error naming the limit.
            assert_eq!(read_source_limited(&path, len as u64).unwrap(), text);
            if len > 0 {
                let err = read_source_limited(&path, len as u64 - 1).unwrap_err();
                assert!(err.message.contains("too large"), "{}", err.message);
                assert_eq!(err.path, path);
            }
        }
    }

    #[test]
    fn manifests_say_publish_and_path_dependencies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"core\", \"app\"]\n[workspace.package]\npublish = false\n[workspace.dependencies]\ncore = { path = \"core\" }\n",
        );
        write(
            "core/Cargo.toml",
            "[package]\nname = \"core\"\npublish.workspace = true\n",
        );
        write(
            "app/Cargo.toml",
            "[package]\nname = \"app\"\npublish = [\"internal\"]\n[dependencies]\ncore.workspace = true\nother = { path = \"../other\" }\nserde = \"1\"\n",
        );
        let read = |dir: &Path| {
            let table = cargo_manifest(dir).expect("valid").expect("present");
            Manifest::from_table(dir, &table)
        };
        let core = read(&root.join("core")).expect("core manifest");
        assert!(!core.publish);
        assert!(core.path_deps.is_empty());
        let app = read(&root.join("app")).expect("app manifest");
        assert!(app.publish);
        assert_eq!(
            app.path_deps,
            vec![root.join("core"), root.join("app").join("../other")]
        );
        // A workspace root without a package is no package.
        assert!(read(root).is_none());
    }

    #[test]
    fn a_library_runs_after_the_packages_that_feed_it() {
        // 0 is fed by 1, 1 by 2; 3 stands alone.
        let feeders = vec![vec![1], vec![2], vec![], vec![]];
        assert_eq!(waves_of(&feeders), vec![vec![2, 3], vec![1], vec![0]]);
        assert_eq!(waves_of(&[vec![], vec![]]), vec![vec![0, 1]]);
    }

    #[test]
    fn bracket_depth_precheck() {
        let ok = format!(
            "{}{}",
            "(".repeat(MAX_BRACKET_DEPTH),
            ")".repeat(MAX_BRACKET_DEPTH)
        );
        assert_eq!(too_deep_line(&ok), None);
        let deep = format!("fn f() {{}}\n\n{}", "[".repeat(MAX_BRACKET_DEPTH + 1));
        assert_eq!(too_deep_line(&deep), Some(3));
        // Balanced text of any length never trips it.
        let long = "fn f() { g(h[1], {2}) }\n".repeat(10_000);
        assert_eq!(too_deep_line(&long), None);
        // Brackets in literals and comments are text.
        let open = "(".repeat(MAX_BRACKET_DEPTH + 100);
        for text in [
            format!("const S: &str = \"{open}\";\n"),
            format!("const S: &str = r#\"{open}\"#;\n"),
            format!("// {open}\nfn f() {{}}\n"),
            format!("/* {open} */ fn f() {{}}\n"),
            "const C: char = '{';\n".repeat(MAX_BRACKET_DEPTH + 100),
        ] {
            assert_eq!(too_deep_line(&text), None, "{}", &text[..60]);
        }
        // Code after such text is still counted.
        let deep = format!(
            "// (((\nconst S: &str = \"((\";\n{}",
            "[".repeat(MAX_BRACKET_DEPTH + 1)
        );
        assert_eq!(too_deep_line(&deep), Some(3));
    }
}
