//! `perfkit diff BASE NEW`: compare two runs.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use perfkit_reports::AnalyzeOptions;
use perfkit_reports::diff::{RunInput, diff_with, differential_flamegraphs};

/// Arguments of `perfkit diff`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "BASE and NEW are trace files, run directories or summary.json files. \
The step-time verdict uses the model of `perfkit check`: with one run per side a change is \
`slower` or `faster` only beyond the noise floor (`noise-floor` of `[check]` in perfkit.toml, \
default 50%) and the minimum effect (`min-effect`, default 5%); otherwise `within noise`."
)]
pub struct DiffArgs {
    /// The reference run.
    #[arg(value_name = "BASE")]
    base: PathBuf,
    /// The run to compare with it.
    #[arg(value_name = "NEW")]
    new: PathBuf,
    /// What to print on stdout.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    format: DiffFormat,
    /// Also write diff.json, diff.html, diff-flamegraph-{host,gpu}.svg into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Rows per table in the text output.
    #[arg(long, value_name = "N", default_value_t = 15)]
    top: usize,
}

/// `--format` values of `perfkit diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DiffFormat {
    /// Tables for a terminal.
    Text,
    /// JSON (`perfkit-diff`, version 1).
    Json,
    /// A self-contained HTML page.
    Html,
}

/// Runs `perfkit diff`.
pub fn run(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let options = AnalyzeOptions::default();
    let base = RunInput::classify(&args.base)?.load(&options)?;
    let new = RunInput::classify(&args.new)?.load(&options)?;
    let (config, _) = perfkit_reports::gate::CheckConfig::discover(std::path::Path::new("."))?;
    let report = diff_with(
        &base,
        &new,
        perfkit_reports::gate::TimingOptions::from(&config),
    );
    let needs_flames = args.format == DiffFormat::Html || args.out.is_some();
    let flames = if needs_flames {
        differential_flamegraphs(&base, &new)?
    } else {
        Vec::new()
    };
    let embedded: Vec<(&str, &[u8])> = flames
        .iter()
        .map(|(k, svg)| {
            let title = match k {
                perfkit_reports::flame::FlameKind::Host => "Host wall time (differential)",
                perfkit_reports::flame::FlameKind::Gpu => {
                    "GPU time by issuing host stack (differential)"
                }
            };
            (title, svg.as_slice())
        })
        .collect();
    if let Some(dir) = &args.out {
        // Never over a file perfkit did not write; the directory stays locked while it is
        // written, and each file written is recorded as perfkit's.
        let mut names = vec!["diff.json", "diff.html"];
        names.extend(flames.iter().map(|(kind, _)| match kind {
            perfkit_reports::flame::FlameKind::Host => "diff-flamegraph-host.svg",
            perfkit_reports::flame::FlameKind::Gpu => "diff-flamegraph-gpu.svg",
        }));
        let taken = perfkit_profiler::launch::take_for_reports(dir, &names)?;
        let write = |name: &str, data: &[u8]| -> anyhow::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, data).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            taken.record(&p)?;
            crate::eprintln_lossy!("wrote {}", p.display());
            Ok(())
        };
        write("diff.json", report.to_json().as_bytes())?;
        write("diff.html", report.to_html(&embedded).as_bytes())?;
        for (kind, svg) in &flames {
            write(&format!("diff-flamegraph-{}.svg", kind.as_str()), svg)?;
        }
    }
    // Last, so that a closed pipe (`perfkit diff A B | head`) never keeps `--out` from being
    // written; `exit_on_error` turns the broken pipe into exit status 0.
    let text = match args.format {
        DiffFormat::Text => report.to_text(args.top),
        DiffFormat::Json => report.to_json(),
        DiffFormat::Html => report.to_html(&embedded),
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
