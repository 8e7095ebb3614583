//! Reports benchmark: a synthetic trace of about 1,000,000 events (GPU timings from the
//! test simulator, not from a GPU) read, analysed and rendered to every format.
//!
//! `cargo bench -p perfkit-reports --bench render` (set `PERFKIT_BENCH_EVENTS` to change the size).
//! Prints seconds per stage, events/s of trace reading, peak memory (VmHWM) and output sizes.

#[path = "../tests/synth/mod.rs"]
mod synth;

use std::io::BufWriter;
use std::path::Path;
use std::time::Instant;

use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let target: u64 = std::env::var("PERFKIT_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir()?;
    let traces = dir.path().join("traces");
    std::fs::create_dir_all(&traces)?;
    let trace = traces.join("train-1.pktrace");

    // About 64 records per step with 40 small extra kernels.
    let mut wl = synth::Workload::tuned();
    wl.extra_kernels = 40;
    wl.steps = target / 64;
    let t = Instant::now();
    let mut s = synth::Synth::new(
        BufWriter::new(std::fs::File::create(&trace)?),
        "train",
        1,
        None,
        1_700_000_000_000_000_000,
    );
    synth::write_run(&mut s, &wl);
    let records = s.records();
    drop(s.finish(false));
    let gen_s = t.elapsed().as_secs_f64();
    let hwm_after_gen = vm_hwm_kib();

    let runs: usize = std::env::var("PERFKIT_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let out = dir.path().join("out");
    // stage name -> seconds of each run; sizes from the last run.
    let mut stages: Vec<(String, Vec<f64>)> = Vec::new();
    let mut record = |name: &str, secs: f64| match stages.iter_mut().find(|s| s.0 == name) {
        Some(s) => s.1.push(secs),
        None => stages.push((name.to_owned(), vec![secs])),
    };
    let mut sizes: Vec<(String, u64)> = Vec::new();
    let mut n = 0u64;
    for _ in 0..runs {
        // Reading alone: decode every record.
        let t = Instant::now();
        n = 0;
        let mut reader = perfkit_profiler::TraceReader::open(&trace)?;
        while let Some(_r) = reader.next_record()? {
            n += 1;
        }
        record("read trace (decode only)", t.elapsed().as_secs_f64());

        // The real path of `perfkit report`: analyse, then every format in one call (the
        // core summary is built on a second thread meanwhile).
        let t = Instant::now();
        let analysis = analyze_path(&traces, &AnalyzeOptions::default())?;
        record(
            "analyse (stream + timeline pass)",
            t.elapsed().as_secs_f64(),
        );
        let t2 = Instant::now();
        let written = write_all(
            &analysis,
            &out,
            &Format::ALL,
            &[],
            &RenderOptions::default(),
        )?;
        record("render every format (one call)", t2.elapsed().as_secs_f64());
        record(
            "**total: analyse + every format**",
            t.elapsed().as_secs_f64(),
        );
        sizes = written
            .iter()
            .map(|p| {
                (
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    size(p),
                )
            })
            .collect();

        // Each format alone, for the breakdown.
        for f in Format::ALL {
            let t = Instant::now();
            write_all(&analysis, &out, &[f], &[], &RenderOptions::default())?;
            record(
                &format!("  of which {f:?} alone").to_lowercase(),
                t.elapsed().as_secs_f64(),
            );
        }
    }
    let hwm = vm_hwm_kib();

    println!(
        "perfkit-reports benchmark: synthetic trace, {records} records ({n} read back), {} steps, {:.1} MiB on disk (generated in {gen_s:.2} s); {runs} runs",
        wl.steps,
        size(&trace) as f64 / 1048576.0
    );
    println!();
    println!("| stage | best s | median s | events/s (best) |");
    println!("|---|---:|---:|---:|");
    for (name, mut secs) in stages {
        secs.sort_by(f64::total_cmp);
        let best = secs[0];
        let median = secs[secs.len() / 2];
        let rate = if name.starts_with("read") || name.starts_with("analyse") {
            format!("{:.2} M", n as f64 / best / 1e6)
        } else {
            String::new()
        };
        println!("| {name} | {best:.3} | {median:.3} | {rate} |");
    }
    println!();
    println!("| output | size |");
    println!("|---|---:|");
    for (name, bytes) in &sizes {
        println!("| {name} | {:.1} KiB |", *bytes as f64 / 1024.0);
    }
    let html = sizes
        .iter()
        .find(|s| s.0 == "report.html")
        .map_or(0, |s| s.1);
    println!();
    println!(
        "HTML report: {:.2} MiB (target <= 5 MiB)",
        html as f64 / 1048576.0
    );
    match (hwm, hwm_after_gen) {
        (Some(h), Some(g)) => println!(
            "peak memory (VmHWM): {:.1} MiB (after generating the trace: {:.1} MiB; target <= 1 GiB)",
            h as f64 / 1024.0,
            g as f64 / 1024.0
        ),
        _ => println!("peak memory: /proc/self/status not available"),
    }
    Ok(())
}
