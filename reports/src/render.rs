//! Writing every report format of a run into an output directory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::chrome::ChromeWriter;
use crate::error::{Error, Result};
use crate::findings::Finding;
use crate::flame::{self, FlameKind};
use crate::html::{self, HtmlOptions};
use crate::model::Analysis;
use crate::source::TraceSource;
use crate::summary::{self, CoreSummary, Summary};

/// One output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `report.html`.
    Html,
    /// `flamegraph-host.svg`, `flamegraph-gpu.svg`.
    Svg,
    /// `stacks-host.folded`, `stacks-gpu.folded`.
    Folded,
    /// `trace.chrome.json`.
    Chrome,
    /// `summary.json`.
    Json,
    /// `summary.md`.
    Md,
}

impl Format {
    /// Every format, in the order they are written.
    pub const ALL: [Format; 6] = [
        Format::Json,
        Format::Md,
        Format::Folded,
        Format::Svg,
        Format::Chrome,
        Format::Html,
    ];

    /// The files this format writes into the output directory.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            Format::Html => &["report.html"],
            Format::Svg => &["flamegraph-host.svg", "flamegraph-gpu.svg"],
            Format::Folded => &["stacks-host.folded", "stacks-gpu.folded"],
            Format::Chrome => &["trace.chrome.json"],
            Format::Json => &["summary.json"],
            Format::Md => &["summary.md"],
        }
    }
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "html" => Format::Html,
            "svg" | "flamegraph" => Format::Svg,
            "folded" => Format::Folded,
            "chrome" | "perfetto" => Format::Chrome,
            "json" => Format::Json,
            "md" | "markdown" => Format::Md,
            _ => return Err(Error::UnknownFormat(s.to_owned())),
        })
    }
}

/// Parses a comma-separated list such as `html,svg,json`.
pub fn parse_formats(list: &str) -> Result<Vec<Format>> {
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.trim().is_empty()) {
        let f = part.parse()?;
        if !out.contains(&f) {
            out.push(f);
        }
    }
    Ok(out)
}

/// Options for [`write_all`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RenderOptions {
    /// HTML options.
    pub html: HtmlOptions,
    /// The core of `summary.json` when the caller has it (`perfkit profile` knows the exit
    /// status); `None`: built from the trace files, on a second thread while the other
    /// formats render.
    pub core: Option<CoreSummary>,
}

fn create(path: &Path) -> Result<BufWriter<File>> {
    File::create(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(|e| Error::io(path, e))
}

fn write_file(path: &Path, content: &[u8]) -> Result<()> {
    std::fs::write(path, content).map_err(|e| Error::io(path, e))
}

/// Writes the requested formats of `analysis` into `out_dir` (created if needed) and
/// returns the paths written, in the order of [`Format::ALL`]. The Chrome trace re-reads the
/// trace files (streaming).
pub fn write_all(
    analysis: &Analysis,
    out_dir: &Path,
    formats: &[Format],
    findings: &[Finding],
    options: &RenderOptions,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let wants = |f: Format| formats.contains(&f);
    let needs_summary = wants(Format::Json) || wants(Format::Md);
    std::thread::scope(|scope| {
        let core = match (&options.core, needs_summary) {
            (Some(core), _) => Some(CoreJob::Ready(Box::new(core.clone()))),
            (None, true) => Some(CoreJob::Running(scope.spawn(|| Summary::core_of(analysis)))),
            (None, false) => None,
        };
        let mut written = Vec::new();
        let others = write_others(analysis, out_dir, formats, findings, options, &mut written);
        let core = match core {
            Some(CoreJob::Ready(c)) => Some(*c),
            Some(CoreJob::Running(h)) => Some(h.join().map_err(|_| Error::Summary {
                path: analysis.source_path.clone(),
                message: "building the core summary panicked".to_owned(),
            })??),
            None => None,
        };
        others?;
        if let Some(core) = core {
            let summary = Summary::new(analysis, core, findings);
            if wants(Format::Json) {
                let p = out_dir.join("summary.json");
                write_file(&p, summary.to_json().as_bytes())?;
                written.push((Format::Json, p));
            }
            if wants(Format::Md) {
                let p = out_dir.join("summary.md");
                write_file(&p, summary::markdown(&summary, 10).as_bytes())?;
                written.push((Format::Md, p));
            }
        }
        written.sort_by_key(|(f, _)| Format::ALL.iter().position(|a| a == f));
        Ok(written.into_iter().map(|(_, p)| p).collect())
    })
}

enum CoreJob<'s> {
    Ready(Box<CoreSummary>),
    Running(std::thread::ScopedJoinHandle<'s, Result<CoreSummary>>),
}

fn write_others(
    analysis: &Analysis,
    out_dir: &Path,
    formats: &[Format],
    findings: &[Finding],
    options: &RenderOptions,
    written: &mut Vec<(Format, PathBuf)>,
) -> Result<()> {
    // An incomplete run (a trace cut short, damaged or unreadable, or a program that did not
    // end normally) is labelled in every file, not only in the summaries.
    let mut incomplete = analysis.incomplete_reasons();
    if let Some(core) = &options.core {
        incomplete.extend(core.run.incomplete_reasons.iter().cloned());
    }
    for format in Format::ALL.iter().filter(|f| formats.contains(f)) {
        match format {
            Format::Json | Format::Md => {}
            Format::Folded => {
                for kind in [FlameKind::Host, FlameKind::Gpu] {
                    let p = out_dir.join(format!("stacks-{}.folded", kind.as_str()));
                    let mut w = create(&p)?;
                    let mut stacks = flame::folded(&analysis.processes, kind);
                    // Folded stacks have no comments: the label is a frame of its own, one
                    // nanosecond wide, that every tool drawing them shows.
                    if !incomplete.is_empty() {
                        stacks.insert(flame::INCOMPLETE_FRAME.to_string(), 1);
                    }
                    flame::write_folded(&stacks, &mut w)
                        .and_then(|()| w.flush())
                        .map_err(|e| Error::io(&p, e))?;
                    written.push((*format, p));
                }
            }
            Format::Svg => {
                // Stacks cut at the depth limit: the titles say so (the marker frame shows where).
                let mut cut = if analysis.processes.iter().any(|p| p.deepest_stack.is_some()) {
                    format!(" (stacks cut at {} frames)", crate::ingest::MAX_STACK_DEPTH)
                } else {
                    String::new()
                };
                if !incomplete.is_empty() {
                    cut.push_str(flame::INCOMPLETE_TITLE);
                }
                for (kind, title) in [
                    (FlameKind::Host, "Host wall time by span stack"),
                    (FlameKind::Gpu, "GPU time by issuing host span stack"),
                ] {
                    let p = out_dir.join(format!("flamegraph-{}.svg", kind.as_str()));
                    let mut w = create(&p)?;
                    flame::write_svg(
                        &flame::folded(&analysis.processes, kind),
                        &format!("{title}{cut}"),
                        "ns",
                        &mut w,
                    )?;
                    w.flush().map_err(|e| Error::io(&p, e))?;
                    written.push((*format, p));
                }
            }
            Format::Chrome => {
                if analysis.files.len() != analysis.processes.len() {
                    continue;
                }
                let p = out_dir.join("trace.chrome.json");
                let mut chrome = ChromeWriter::new(create(&p)?).map_err(|e| Error::io(&p, e))?;
                chrome.set_incomplete(&incomplete);
                for (i, (proc_, file)) in analysis.processes.iter().zip(&analysis.files).enumerate()
                {
                    chrome.begin_process(i, proc_);
                    TraceSource::open(file)?.run(&mut |event| chrome.push(event));
                }
                chrome.finish().map_err(|e| Error::io(&p, e))?;
                written.push((*format, p));
            }
            Format::Html => {
                let p = out_dir.join("report.html");
                // How the program ended is known from the run's summary, not from its traces.
                let mut html_options = options.html.clone();
                if let Some(core) = &options.core {
                    html_options.run_incomplete = core.run.incomplete_reasons.clone();
                }
                write_file(
                    &p,
                    html::render(analysis, findings, &html_options).as_bytes(),
                )?;
                written.push((*format, p));
            }
        }
    }
    Ok(())
}
