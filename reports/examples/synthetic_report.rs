//! Writes the reports of a synthetic run (GPU timings from a simulator, not a GPU) into a
//! directory: `cargo run -p perfkit-reports --example synthetic_report -- OUT [anti|tuned|ranks|large]`.

#[path = "../tests/synth/mod.rs"]
mod synth;

use std::path::PathBuf;

use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: synthetic_report OUT [anti|tuned|ranks|large]")?,
    );
    let kind = args.next().unwrap_or_else(|| "anti".to_owned());
    let traces = out.join("traces");
    std::fs::create_dir_all(&traces)?;
    let ranks = if kind == "ranks" { 4 } else { 1 };
    for rank in 0..ranks {
        let mut wl = if kind == "tuned" || kind == "large" {
            synth::Workload::tuned()
        } else {
            synth::Workload::anti_patterns()
        };
        wl.seed = u64::from(rank) + 1;
        if kind == "large" {
            wl.steps = 5000;
            wl.extra_kernels = 40;
        }
        if kind == "ranks" && rank == 2 {
            wl.data_ns = 2_000_000;
        }
        let bytes = synth::trace_bytes(
            "train",
            100 + rank,
            (ranks > 1).then_some(rank),
            1_700_000_000_000_000_000 + u64::from(rank) * 300_000,
            &wl,
        );
        std::fs::write(traces.join(format!("train-{rank}.pktrace")), bytes)?;
    }
    let analysis = analyze_path(&traces, &AnalyzeOptions::default())?;
    for p in write_all(
        &analysis,
        &out,
        &Format::ALL,
        &[],
        &RenderOptions::default(),
    )? {
        println!("{}", p.display());
    }
    Ok(())
}
