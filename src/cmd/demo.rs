//! `perfkit demo`: profile the reference trainer tuned and with its anti-patterns, lint it, and
//! write both reports and their diff.
//!
//! ```text
//! cargo run --release -- demo            # GPU when one is usable, else the CPU
//! perfkit demo --device cpu --steps 60 --out perfkit-out/demo
//! ```
//!
//! Nothing is built by hand: the trainer (`perfkit-kernels`) is linked into `perfkit`, and the
//! demo runs it under `perfkit profile` in a child process of this same executable
//! (`perfkit demo --run-trainer ...`, hidden). The tuned run sizes its loader workers to the
//! machine; the anti-pattern run loads data inline and allocates its buffers every step, the
//! two anti-patterns a CPU pays for too. On a CPU the demo measures those two from the spans of
//! both runs (`data`, `alloc_buffers`) and says which findings need a GPU to be measured.
//!
//! The sources it lints (the trainer and the lint fixtures) are those of the current directory
//! when it is perfkit's source tree, else the copies built into the binary, written under
//! `<out>/sources/`: the demo works from an installed binary with no source tree around.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use perfkit_kernels::data::RecordFormat;
use perfkit_kernels::train::{AntiPatterns, DeviceChoice, Progress, TrainConfig, train};
use perfkit_lint::output::normalize as clean;
use perfkit_lint::output::{self, Format as LintFormat, RenderOptions as LintRender};
use perfkit_lint::{LintOptions, RuleMeta};
use perfkit_profiler::launch::{
    DIFF_FILES, REPORT_FILES, ReportDir, check_for_reports, take_for_reports,
};
use perfkit_reports::render::{self, Format, RenderOptions};
use perfkit_reports::rules::{self, ProfileConfig};
use perfkit_reports::{AnalyzeOptions, Finding};

/// Arguments of `perfkit demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to write the two runs, the lint results and the diff.
    #[arg(
        long,
        short = 'o',
        value_name = "DIR",
        default_value = "perfkit-out/demo"
    )]
    out: PathBuf,
    /// Where to train: `auto` (a usable CUDA GPU, else the CPU), `cpu` or `cuda`.
    #[arg(long, value_enum, default_value_t = DemoDevice::Auto)]
    device: DemoDevice,
    /// Optimizer steps of each run.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 100,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    steps: u64,
    /// Run the trainer in this process (what the demo's children do).
    #[arg(long, hide = true)]
    run_trainer: bool,
    /// With `--run-trainer`: turn every anti-pattern on.
    #[arg(long, hide = true, requires = "run_trainer")]
    anti: bool,
}

/// `--device` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DemoDevice {
    /// A usable CUDA GPU, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA GPU (an error without one).
    Cuda,
}

impl DemoDevice {
    fn as_str(self) -> &'static str {
        match self {
            DemoDevice::Auto => "auto",
            DemoDevice::Cpu => "cpu",
            DemoDevice::Cuda => "cuda",
        }
    }
}

/// Runs `perfkit demo`.
pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if args.run_trainer {
        return run_trainer(&args);
    }
    let exe = std::env::current_exe().context("cannot find the perfkit executable")?;
    let out = args.out.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    // Never over a file the demo did not write: what stands under the names it writes is
    // checked, and the directories marked as perfkit's, before anything runs.
    let tuned = out.join("tuned");
    let anti = out.join("anti-patterns");
    let diff_dir = out.join("diff");
    let mut run_files = REPORT_FILES.to_vec();
    run_files.push("train.log");
    let outputs = [
        (&tuned, &run_files[..]),
        (&anti, &run_files[..]),
        (&diff_dir, &DIFF_FILES[..]),
        (&out, &["lint.txt", "lint.sarif"][..]),
    ];
    for (dir, names) in outputs {
        check_for_reports(dir, names)?;
    }
    for (dir, names) in &outputs[..3] {
        // Released at once: `perfkit profile` and `perfkit diff` take these directories next.
        drop(take_for_reports(dir, names)?);
    }
    let taken = take_for_reports(&out, outputs[3].1)?;

    // How busy the machine is before the runs: loader workers only help where cores are free.
    let busy = machine_busy();

    // The sources to lint, first: a `sources/` the demo may not replace stops it before any run.
    let source_root = source_root(&out)?;

    // 1. The two runs, each under `perfkit profile`.
    profile_run(&exe, &tuned, &args, false)?;
    profile_run(&exe, &anti, &args, true)?;

    // 2. The linter over the trainer and the lint fixtures.
    let lint_findings = lint(&source_root, &out, &taken)?;

    // 3. Runtime findings, confirmed against the trainer's lint findings, into both reports.
    let config =
        ProfileConfig::discover(&source_root).context("cannot read the [profile] table")?;
    let trainer_lint: Vec<Finding> = lint_findings
        .iter()
        .filter(|f| {
            f.location
                .as_deref()
                .is_some_and(|l| l.starts_with("kernels/") || l.contains("/kernels/"))
        })
        .cloned()
        .collect();
    let mut tables = Vec::new();
    for (label, dir) in [("tuned", &tuned), ("anti-patterns", &anti)] {
        let findings = findings_report(dir, &config, &trainer_lint)?;
        tables.push((label, dir, findings));
    }
    let any_gpu = tables.iter().any(|t| t.2.1);

    // 4. Their diff.
    let diff = Command::new(&exe)
        .arg("diff")
        .arg(tuned.join("trace"))
        .arg(anti.join("trace"))
        .arg("--out")
        .arg(&diff_dir)
        .output()
        .context("cannot run `perfkit diff`")?;
    if !diff.status.success() {
        bail!(
            "`perfkit diff` failed ({}):\n{}",
            diff.status,
            String::from_utf8_lossy(&diff.stderr)
        );
    }
    let diff_taken = take_for_reports(&diff_dir, &["diff.txt"])?;
    std::fs::write(diff_dir.join("diff.txt"), &diff.stdout)
        .with_context(|| format!("cannot write {}", diff_dir.join("diff.txt").display()))?;
    diff_taken.record("diff.txt")?;
    drop(diff_taken);

    // 5. Where to look.
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    writeln!(o)?;
    for (label, dir, (findings, gpu, _)) in &tables {
        // The trainer's lint findings are the same for both runs: show what was measured.
        let measured: Vec<Finding> = findings
            .iter()
            .filter(|f| f.origin == "runtime" || f.confirmed)
            .cloned()
            .collect();
        writeln!(o, "== {label} run ({})", dir.display())?;
        // How the run loaded its data (the trainer says so in its log).
        if let Ok(log) = std::fs::read_to_string(dir.join("train.log"))
            && let Some(note) = log.lines().find_map(|l| l.strip_prefix("note: data: "))
        {
            writeln!(o, "data: {note}")?;
        }
        if !gpu && measured.is_empty() {
            writeln!(
                o,
                "findings: no runtime finding (a CPU run: the runtime rules measure GPU work)"
            )?;
        } else {
            write!(o, "{}", rules::terminal_findings(&measured))?;
        }
    }
    if !any_gpu {
        write_cpu_costs(&mut o, &tables[0].2.2, &tables[1].2.2, &trainer_lint)?;
    }
    if !trainer_lint.is_empty() {
        writeln!(
            o,
            "== lint: {} findings in the trainer ({}), {} in all",
            trainer_lint.len(),
            clean(&source_root.join("kernels")).display(),
            lint_findings.len()
        )?;
    }
    if let Ok(text) = std::fs::read_to_string(diff_dir.join("diff.json"))
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        && let Some(steps) = v.get("steps").filter(|s| !s.is_null())
    {
        writeln!(o, "{}", diff_line(steps, any_gpu, busy.as_deref()))?;
    }
    writeln!(o)?;
    writeln!(o, "perfkit demo: where to look")?;
    writeln!(
        o,
        "  tuned run       {}",
        tuned.join("report.html").display()
    )?;
    writeln!(
        o,
        "  anti-patterns   {}",
        anti.join("report.html").display()
    )?;
    writeln!(
        o,
        "  diff            {}",
        diff_dir.join("diff.html").display()
    )?;
    writeln!(
        o,
        "  lint            {} (SARIF: {})",
        out.join("lint.txt").display(),
        out.join("lint.sarif").display()
    )?;
    writeln!(
        o,
        "  gate            perfkit check --baseline {} --candidate {}",
        tuned.display(),
        anti.display()
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The trainer itself, in a child process started by `perfkit profile`.
fn run_trainer(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let _perfkit = perfkit_profiler::init();
    let mut cfg = TrainConfig::default();
    cfg.steps = args.steps;
    cfg.device = match args.device {
        DemoDevice::Auto => DeviceChoice::Auto,
        DemoDevice::Cpu => DeviceChoice::Cpu,
        DemoDevice::Cuda => DeviceChoice::Cuda,
    };
    cfg.log_every = (args.steps / 5).max(1);
    if args.device == DemoDevice::Cpu
        || (args.device == DemoDevice::Auto && !perfkit_profiler::cuda::driver_present())
    {
        // On a CPU the loader decodes text records, so that loading costs what a real
        // loader's decoding does (tens of µs a sample) and inline loading shows; a GPU run
        // keeps the cheap records, so that its loader workers keep up with the GPU.
        cfg.records = RecordFormat::Csv;
    }
    if args.anti {
        cfg.anti = AntiPatterns {
            // On a CPU too: fresh activation and gradient buffers every step.
            readback_every_step: true,
            sync_every_step: true,
            cpu_then_copy: false,
            alloc_every_step: true,
            per_sample_upload: false,
            pageable: true,
        };
        // Data loaded inline by the training thread (what PK301 measures); a CPU pays for it
        // too.
        cfg.workers = Some(0);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let report = train(&cfg, &mut |p| {
        let _ = match p {
            Progress::Note(n) => writeln!(out, "note: {n}"),
            Progress::Loss { step, loss } => writeln!(out, "step {step:>6}  loss {loss:.4}"),
        };
    })?;
    writeln!(
        out,
        "trained {} steps on {} in {:.2?}",
        report.steps, report.device, report.train_time
    )?;
    Ok(ExitCode::SUCCESS)
}

fn profile_run(exe: &Path, dir: &Path, args: &DemoArgs, anti: bool) -> anyhow::Result<()> {
    let label = if anti { "anti-patterns" } else { "tuned" };
    crate::eprintln_lossy!(
        "perfkit demo: profiling the {label} run -> {}",
        dir.display()
    );
    let mut child_args: Vec<OsString> = vec![
        "profile".into(),
        "--quiet".into(),
        "--force".into(),
        // The demo lints the trainer once itself and renders the reports with those findings.
        "--no-lint".into(),
        "--out".into(),
        dir.as_os_str().to_owned(),
        "--".into(),
        exe.as_os_str().to_owned(),
        "demo".into(),
        "--run-trainer".into(),
        "--device".into(),
        args.device.as_str().into(),
        "--steps".into(),
        args.steps.to_string().into(),
    ];
    if anti {
        child_args.push("--anti".into());
    }
    let output = Command::new(exe)
        .args(&child_args)
        .output()
        .context("cannot run `perfkit profile`")?;
    // The program's output beside the run's reports, recorded as the demo's own file.
    let log = take_for_reports(dir, &["train.log"]).and_then(|taken| {
        if std::fs::write(dir.join("train.log"), &output.stdout).is_ok() {
            taken.record("train.log")?;
        }
        Ok(())
    });
    if !output.status.success() {
        bail!(
            "the {label} run failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(log?)
}

/// Marks `<out>/sources/` as written by the demo, so that a later demo may replace it.
const SOURCES_MARK: &str = ".perfkit-demo-sources";

/// The lint fixtures built into the binary (see `build.rs`).
const FIXTURES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/demo_fixtures.rs"));

/// The directory holding `kernels/` and `fixtures/lint/` to lint: the current directory when it
/// is perfkit's source tree, else `<out>/sources/`, where the copies built into the binary are
/// written (replacing only a previous demo's copies, never files the demo did not write).
fn source_root(out: &Path) -> anyhow::Result<PathBuf> {
    let here = Path::new(".");
    if here.join("kernels/src/antipatterns.rs").is_file() && here.join("fixtures/lint").is_dir() {
        return Ok(PathBuf::from("."));
    }
    let root = out.join("sources");
    if root.exists() && !root.join(SOURCES_MARK).is_file() {
        bail!(
            "{} exists and was not written by `perfkit demo` (no {SOURCES_MARK} in it): \
             move it away or pass another --out",
            root.display()
        );
    }
    let kernels = perfkit_kernels::sources::SOURCES
        .iter()
        .map(|(path, text)| (format!("kernels/{path}"), *text));
    let fixtures = FIXTURES
        .iter()
        .map(|(path, text)| ((*path).to_owned(), *text));
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    std::fs::write(
        root.join(SOURCES_MARK),
        "written by `perfkit demo`: the sources it lints, as built into perfkit\n",
    )
    .with_context(|| format!("cannot write {}", root.join(SOURCES_MARK).display()))?;
    // The workspace around them, as in perfkit's own tree, so that findings are located as the
    // trainer's recorded source lines are (`kernels/src/...`).
    let workspace = std::iter::once((
        "Cargo.toml".to_owned(),
        "# Written by `perfkit demo`: the workspace of the sources it lints.\n\
         [workspace]\nmembers = [\"kernels\"]\nexclude = [\"fixtures\"]\nresolver = \"3\"\n",
    ));
    for (path, text) in workspace.chain(kernels).chain(fixtures) {
        let file = root.join(&path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    crate::eprintln_lossy!(
        "perfkit demo: no perfkit source tree here: linting the sources built into perfkit, written to {}",
        root.display()
    );
    Ok(root)
}

/// Lints the trainer and the lint fixtures; writes `lint.txt` and `lint.sarif` into `out`
/// (`taken` for them) and records them.
fn lint(root: &Path, out: &Path, taken: &ReportDir) -> anyhow::Result<Vec<Finding>> {
    let options = LintOptions::new([
        clean(&root.join("kernels")),
        clean(&root.join("fixtures/lint")),
    ]);
    let report = perfkit_lint::lint(&options)?;
    let rules: Vec<&RuleMeta> = perfkit_lint::rules().iter().map(|r| r.meta()).collect();
    let mut text = Vec::new();
    output::render(
        LintFormat::Text,
        &mut text,
        &report,
        &rules,
        &LintRender::default(),
    )?;
    std::fs::write(out.join("lint.txt"), &text).context("cannot write lint.txt")?;
    taken.record("lint.txt")?;
    let mut sarif = Vec::new();
    output::render(
        LintFormat::Sarif,
        &mut sarif,
        &report,
        &rules,
        &LintRender::default(),
    )?;
    std::fs::write(out.join("lint.sarif"), &sarif).context("cannot write lint.sarif")?;
    taken.record("lint.sarif")?;
    crate::eprintln_lossy!(
        "perfkit demo: lint: {} findings in {} files",
        report.diagnostics.len(),
        report.files_scanned
    );
    Ok(super::check::lint_to_findings(&report.diagnostics))
}

/// Evaluates the runtime rules of a profiled run, confirms the trainer's lint findings with
/// them and renders the run's reports again with the findings in.
/// Returns the findings, whether the run did any GPU work and its CPU costs.
fn findings_report(
    run_dir: &Path,
    config: &ProfileConfig,
    lint: &[Finding],
) -> anyhow::Result<(Vec<Finding>, bool, CpuCosts)> {
    let trace = run_dir.join("trace");
    let analysis = perfkit_reports::analyze_path(&trace, &AnalyzeOptions::default())?;
    let runtime = rules::evaluate(&analysis, config)?;
    let findings = rules::confirm(lint.to_vec(), runtime);
    let mut options = RenderOptions::default();
    options.html.title = "perfkit demo: reference trainer".to_owned();
    let summary = run_dir.join("summary.json");
    options.core = perfkit_profiler::summary::Summary::read_json(&summary).ok();
    // Over the reports `perfkit profile` wrote and recorded: the directory is taken again.
    let taken = take_for_reports(run_dir, &REPORT_FILES)?;
    for file in render::write_all(&analysis, run_dir, &Format::ALL, &findings, &options)? {
        taken.record(file)?;
    }
    drop(taken);
    let gpu = analysis
        .processes
        .iter()
        .any(|p| p.gpu.busy_ns > 0 || p.copies.total.count > 0);
    Ok((findings, gpu, CpuCosts::of(&analysis)))
}

/// What the CPU twins of the anti-patterns cost in one run: time per step of the training
/// thread's spans that hold them.
#[derive(Debug, Clone, Copy, Default)]
struct CpuCosts {
    /// Steps of the run.
    steps: u64,
    /// Median step.
    median_step_ns: u64,
    /// `data` spans (the training thread waiting for, or making, its batch), per step.
    data_ns: u64,
    /// `alloc_buffers` spans (fresh buffers every step), per step.
    alloc_ns: u64,
}

impl CpuCosts {
    fn of(analysis: &perfkit_reports::Analysis) -> Self {
        let mut costs = Self::default();
        for p in &analysis.processes {
            costs.steps += p.steps.duration.count;
            costs.median_step_ns = costs.median_step_ns.max(p.steps.duration.median_ns);
            for s in &p.spans {
                match s.name.as_str() {
                    "data" => costs.data_ns += s.total_ns,
                    "alloc_buffers" => costs.alloc_ns += s.total_ns,
                    _ => {}
                }
            }
        }
        let steps = costs.steps.max(1);
        costs.data_ns /= steps;
        costs.alloc_ns /= steps;
        costs
    }
}

/// The anti-patterns a CPU pays for too, measured in both runs, next to the trainer's lint
/// findings; then the codes that need a GPU to be measured.
fn write_cpu_costs(
    o: &mut impl std::io::Write,
    tuned: &CpuCosts,
    anti: &CpuCosts,
    trainer_lint: &[Finding],
) -> std::io::Result<()> {
    let d = perfkit_reports::format::duration;
    let share = |ns: u64| {
        if anti.median_step_ns == 0 {
            String::new()
        } else {
            format!(
                ", {:.0}% of its median step",
                ns as f64 * 100.0 / anti.median_step_ns as f64
            )
        }
    };
    writeln!(
        o,
        "== measured on the CPU (the anti-pattern run against the tuned one, per step)"
    )?;
    let extra = anti.data_ns.saturating_sub(tuned.data_ns);
    writeln!(
        o,
        "  PK301 loader-without-workers  the training thread in data loading: {} inline, {} with the tuned run's loader: +{}{}",
        d(anti.data_ns),
        d(tuned.data_ns),
        d(extra),
        share(extra)
    )?;
    let lint_at = trainer_lint
        .iter()
        .find(|f| f.code == "PK202")
        .and_then(|f| f.location.clone())
        .map(|l| format!(" (lint: {l} on the GPU path)"))
        .unwrap_or_default();
    writeln!(
        o,
        "  PK202 alloc-in-step-loop      fresh activation and gradient buffers every step: +{}{}{lint_at}",
        d(anti.alloc_ns),
        share(anti.alloc_ns)
    )?;
    writeln!(
        o,
        "  needs a GPU to be measured: PK101, PK102, PK201, PK203, PK303 and PK601-PK604 (the lint findings show where they are)"
    )
}

/// `Some("this machine is busy (load average 9.2 on 2 cores)")` when more processes want to
/// run than there are cores (Linux' `/proc/loadavg`), else `None`.
fn machine_busy() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let load: f64 = text.split_whitespace().next()?.parse().ok()?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (load > cores as f64).then(|| {
        format!(
            "this machine is busy (load average {load:.1} on {cores} core{})",
            if cores == 1 { "" } else { "s" }
        )
    })
}

/// The diff's verdict on the median step, with the reason when it is not what the
/// anti-patterns should give.
fn diff_line(steps: &serde_json::Value, gpu: bool, busy: Option<&str>) -> String {
    let d = perfkit_reports::format::duration;
    let base = steps["base_median_ns"].as_u64().unwrap_or(0);
    let new = steps["new_median_ns"].as_u64().unwrap_or(0);
    let noise = steps["noise_ns"].as_u64().unwrap_or(0);
    let verdict = steps["verdict"].as_str().unwrap_or("?");
    let mut line = format!("== diff: median step {} -> {} ({verdict}", d(base), d(new));
    match verdict {
        "slower" if base > 0 => {
            line += &format!(", +{:.0}%)", (new as f64 / base as f64 - 1.0) * 100.0);
        }
        "within noise" => {
            // The reason is the gate's own: with one run per side, its noise floor.
            let evidence = steps["evidence"].as_str().unwrap_or("");
            let change = if base > 0 {
                format!("{:+.0}%", (new as f64 / base as f64 - 1.0) * 100.0)
            } else {
                d(new.abs_diff(base))
            };
            line += &format!(": {change}, not beyond the noise");
            if !evidence.is_empty() {
                line += &format!("; {evidence}");
            } else {
                line += &format!(" (step-to-step spread {})", d(noise));
            }
            if let Some(busy) = busy {
                line += &format!(
                    "; {busy}: loader workers overlap loading with the model only where a core is free"
                );
            } else if !gpu {
                line += "; on a CPU only inline loading and per-step allocation cost anything";
            }
            line += ")";
        }
        "faster" => {
            line += ": the anti-pattern run should not be faster; ";
            line += &match busy {
                Some(busy) => format!(
                    "{busy}, so both runs shared their cores with other processes and loader \
                     workers had no free core to run on: run the demo again on an idle machine)"
                ),
                None => {
                    "other processes took cores from the tuned run: run the demo again)".to_owned()
                }
            };
        }
        _ => line += ")",
    }
    line
}
