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
//! (`perfkit demo --run-trainer ...`, hidden). On the CPU the anti-pattern switches that only
//! mean something on a GPU are no-ops, so the anti-pattern run there also loads data inline
//! (no loader workers), which the CPU does pay for.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use perfkit_kernels::train::{AntiPatterns, DeviceChoice, Progress, TrainConfig, train};
use perfkit_lint::output::{self, Format as LintFormat, RenderOptions as LintRender};
use perfkit_lint::{LintOptions, RuleMeta};
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
    #[arg(long, value_name = "N", default_value_t = 100)]
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

    // 1. The two runs, each under `perfkit profile`.
    let tuned = out.join("tuned");
    let anti = out.join("anti-patterns");
    profile_run(&exe, &tuned, &args, false)?;
    profile_run(&exe, &anti, &args, true)?;

    // 2. The linter over the trainer and the lint fixtures.
    let source_root = source_root();
    let lint_findings = match &source_root {
        Some(root) => lint(root, &out)?,
        None => {
            eprintln!(
                "perfkit demo: the trainer's sources (kernels/, fixtures/lint/) are not here: lint skipped"
            );
            Vec::new()
        }
    };

    // 3. Runtime findings, confirmed against the trainer's lint findings, into both reports.
    let config = ProfileConfig::discover(source_root.as_deref().unwrap_or(Path::new(".")))
        .context("cannot read the [profile] table")?;
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

    // 4. Their diff.
    let diff_dir = out.join("diff");
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
    std::fs::write(diff_dir.join("diff.txt"), &diff.stdout)
        .with_context(|| format!("cannot write {}", diff_dir.join("diff.txt").display()))?;

    // 5. Where to look.
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    writeln!(o)?;
    for (label, dir, (findings, gpu)) in &tables {
        // The trainer's lint findings are the same for both runs: show what was measured.
        let measured: Vec<Finding> = findings
            .iter()
            .filter(|f| f.origin == "runtime" || f.confirmed)
            .cloned()
            .collect();
        writeln!(o, "== {label} run ({})", dir.display())?;
        if !gpu && measured.is_empty() {
            writeln!(
                o,
                "findings: none measured (a CPU run: the runtime rules measure GPU work)"
            )?;
        } else {
            write!(o, "{}", rules::terminal_findings(&measured))?;
        }
    }
    if !trainer_lint.is_empty() {
        writeln!(
            o,
            "== lint: {} findings in the trainer (kernels/), {} in all",
            trainer_lint.len(),
            lint_findings.len()
        )?;
    }
    if let Ok(text) = std::fs::read_to_string(diff_dir.join("diff.json"))
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        && let Some(steps) = v.get("steps").filter(|s| !s.is_null())
    {
        writeln!(
            o,
            "== diff: median step {} -> {} ({})",
            perfkit_reports::format::duration(steps["base_median_ns"].as_u64().unwrap_or(0)),
            perfkit_reports::format::duration(steps["new_median_ns"].as_u64().unwrap_or(0)),
            steps["verdict"].as_str().unwrap_or("?")
        )?;
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
    if source_root.is_some() {
        writeln!(
            o,
            "  lint            {} (SARIF: {})",
            out.join("lint.txt").display(),
            out.join("lint.sarif").display()
        )?;
    }
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
    if args.anti {
        cfg.anti = AntiPatterns {
            readback_every_step: true,
            sync_every_step: true,
            cpu_then_copy: false,
            alloc_every_step: true,
            per_sample_upload: false,
            pageable: true,
        };
        // Data loaded inline by the training thread (what PK301 measures); the one
        // anti-pattern the CPU pays for too.
        cfg.workers = 0;
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
    eprintln!(
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
    std::fs::write(dir.join("train.log"), &output.stdout).ok();
    if !output.status.success() {
        bail!(
            "the {label} run failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The directory holding `kernels/` and `fixtures/lint/`: the current directory, else the
/// source tree perfkit was built from.
fn source_root() -> Option<PathBuf> {
    let has = |d: &Path| d.join("kernels/src").is_dir() && d.join("fixtures/lint").is_dir();
    let cwd = PathBuf::from(".");
    if has(&cwd) {
        return Some(cwd);
    }
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    has(&built).then_some(built)
}

/// Lints the trainer and the lint fixtures; writes `lint.txt` and `lint.sarif`.
fn lint(root: &Path, out: &Path) -> anyhow::Result<Vec<Finding>> {
    let options = LintOptions::new([root.join("kernels"), root.join("fixtures/lint")]);
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
    let mut sarif = Vec::new();
    output::render(
        LintFormat::Sarif,
        &mut sarif,
        &report,
        &rules,
        &LintRender::default(),
    )?;
    std::fs::write(out.join("lint.sarif"), &sarif).context("cannot write lint.sarif")?;
    eprintln!(
        "perfkit demo: lint: {} findings in {} files",
        report.diagnostics.len(),
        report.files_scanned
    );
    Ok(super::check::lint_to_findings(&report.diagnostics))
}

/// Evaluates the runtime rules of a profiled run, confirms the trainer's lint findings with
/// them and renders the run's reports again with the findings in.
/// Returns the findings and whether the run did any GPU work.
fn findings_report(
    run_dir: &Path,
    config: &ProfileConfig,
    lint: &[Finding],
) -> anyhow::Result<(Vec<Finding>, bool)> {
    let trace = run_dir.join("trace");
    let analysis = perfkit_reports::analyze_path(&trace, &AnalyzeOptions::default())?;
    let runtime = rules::evaluate(&analysis, config)?;
    let findings = rules::confirm(lint.to_vec(), runtime);
    let mut options = RenderOptions::default();
    options.html.title = "perfkit demo: reference trainer".to_owned();
    let summary = run_dir.join("summary.json");
    options.core = perfkit_profiler::summary::Summary::read_json(&summary).ok();
    render::write_all(&analysis, run_dir, &Format::ALL, &findings, &options)?;
    let gpu = analysis
        .processes
        .iter()
        .any(|p| p.gpu.busy_ns > 0 || p.copies.total.count > 0);
    Ok((findings, gpu))
}
