//! `train`: the reference training workload of perfkit.
//!
//! ```text
//! cargo run --release -p perfkit-kernels --bin train -- --device cpu
//! perfkit profile -- target/release/train --readback-every-step --pageable
//! target/release/train --bench        # GPU table: step time per anti-pattern, bandwidth
//! ```

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use perfkit_kernels::data::RecordFormat;
use perfkit_kernels::task::{MlpShape, SgdConfig};
use perfkit_kernels::train::{
    AntiPatterns, DataSource, DeviceChoice, Progress, TrainConfig, train,
};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DeviceArg {
    /// The first CUDA GPU when usable, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA GPU (an error without one).
    Cuda,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DataArg {
    /// Generated on the host by the data workers, then uploaded.
    Host,
    /// Generated on the GPU by the `synth_batch` kernel.
    Device,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RecordsArg {
    /// Generated in place.
    Raw,
    /// Written as a CSV line and parsed back (the cost of decoding text records).
    Csv,
}

/// Trains an MLP (784 -> hidden -> 10) on a synthetic, learnable classification task,
/// instrumented with perfkit-profiler (run it under `perfkit profile`).
///
/// The anti-pattern switches each turn on one mistake of perfkit's rule catalog in a
/// real code path, so its cost can be measured.
#[derive(Debug, Parser)]
#[command(name = "train", version)]
#[allow(clippy::struct_excessive_bools)]
struct Cli {
    /// Where to train.
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// Optimizer steps.
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Seed of the data and the initial parameters.
    #[arg(long, default_value_t = 0)]
    seed: u32,
    /// Host data worker threads (0 = generate each batch inline when it is needed)
    /// [default: sized to the machine, leaving cores to the model]
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Batches each worker prepares ahead.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Hidden units.
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// Standard deviation of the noise around each class prototype (task difficulty).
    #[arg(long, default_value_t = 1.0)]
    noise: f32,
    /// Where batches come from.
    #[arg(long, value_enum, default_value = "host")]
    data: DataArg,
    /// How the host loader gets each sample: `raw` (generated in place) or `csv` (written as a
    /// line of text and parsed back: the cost of decoding text records, same values).
    #[arg(long, value_enum, default_value = "raw")]
    records: RecordsArg,
    /// Print the loss every N steps.
    #[arg(long, default_value_t = 10)]
    log_every: u64,
    /// PK101: read the loss back to the host every step (prints every loss).
    #[arg(long)]
    readback_every_step: bool,
    /// PK102: synchronize the stream at the end of every step.
    #[arg(long)]
    sync_every_step: bool,
    /// PK201: build zeroed activation buffers on the host and upload them every step.
    #[arg(long)]
    cpu_then_copy: bool,
    /// PK202: allocate the activation buffers on the device every step.
    #[arg(long)]
    alloc_every_step: bool,
    /// PK203: upload each batch one sample at a time.
    #[arg(long)]
    per_sample_upload: bool,
    /// PK303: upload batches from pageable memory instead of pinned buffers.
    #[arg(long)]
    pageable: bool,
    /// Busy-wait this many microseconds inside every step (a known slowdown, for
    /// benchmarking a regression gate; `bench/gate.sh` uses it).
    #[arg(long, value_name = "US", default_value_t = 0)]
    step_delay_us: u64,
    /// Print the GPU benchmark table instead of training once (needs a CUDA GPU).
    #[arg(long)]
    bench: bool,
    /// Steps of each benchmark run.
    #[arg(long, default_value_t = 200)]
    bench_steps: u64,
    /// Repetitions of each benchmark run (the median is reported).
    #[arg(long, default_value_t = 3)]
    bench_repeats: usize,
    /// Internal: run once and print the mean step time for `--bench`.
    #[arg(long, hide = true)]
    bench_child: bool,
}

impl Cli {
    fn config(&self) -> TrainConfig {
        let mut cfg = TrainConfig::default();
        cfg.device = match self.device {
            DeviceArg::Auto => DeviceChoice::Auto,
            DeviceArg::Cpu => DeviceChoice::Cpu,
            DeviceArg::Cuda => DeviceChoice::Cuda,
        };
        cfg.steps = self.steps;
        cfg.batch_size = self.batch_size;
        cfg.seed = self.seed;
        cfg.workers = self.workers;
        cfg.prefetch = self.prefetch;
        cfg.shape = MlpShape {
            hidden: self.hidden,
            ..MlpShape::default()
        };
        cfg.sgd = SgdConfig {
            lr: self.lr,
            ..SgdConfig::default()
        };
        cfg.noise_scale = self.noise;
        cfg.data = match self.data {
            DataArg::Host => DataSource::Host,
            DataArg::Device => DataSource::Device,
        };
        cfg.records = match self.records {
            RecordsArg::Raw => RecordFormat::Raw,
            RecordsArg::Csv => RecordFormat::Csv,
        };
        cfg.log_every = self.log_every;
        cfg.step_delay = Duration::from_micros(self.step_delay_us);
        cfg.anti = AntiPatterns {
            readback_every_step: self.readback_every_step,
            sync_every_step: self.sync_every_step,
            cpu_then_copy: self.cpu_then_copy,
            alloc_every_step: self.alloc_every_step,
            per_sample_upload: self.per_sample_upload,
            pageable: self.pageable,
        };
        cfg
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    if cli.bench {
        return bench(&cli);
    }
    let _perfkit = perfkit_profiler::init();
    let cfg = cli.config();
    let mut out = io::stdout().lock();
    let mut write_error = None;
    let quiet = cli.bench_child;
    let report = train(&cfg, &mut |p| {
        if quiet || write_error.is_some() {
            return;
        }
        let r = match p {
            Progress::Note(n) => writeln!(out, "note: {n}"),
            Progress::Loss { step, loss } => writeln!(out, "step {step:>6}  loss {loss:.4}"),
        };
        if let Err(e) = r {
            write_error = Some(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    if cli.bench_child {
        writeln!(
            out,
            "bench-child: mean_step_ns={}",
            report.mean_step().as_nanos()
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let (first, last) = (
        report.first_loss().unwrap_or(f32::NAN),
        report.final_loss().unwrap_or(f32::NAN),
    );
    writeln!(
        out,
        "done: {} steps on {} in {:.3} s ({:.3} ms/step); loss {first:.4} -> {last:.4}",
        report.steps,
        report.device,
        report.train_time.as_secs_f64(),
        report.mean_step().as_secs_f64() * 1e3,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// One row of the benchmark: the switches passed to the child and whether it records.
struct Variant {
    label: String,
    flag: Option<&'static str>,
    instrumented: bool,
}

/// The tuned run, each anti-pattern switch alone, and the tuned run recorded by perfkit.
fn variants() -> Vec<Variant> {
    let tuned = |label: &str, instrumented| Variant {
        label: label.to_owned(),
        flag: None,
        instrumented,
    };
    let mut rows = vec![tuned("tuned (pinned, workers, no sync)", false)];
    rows.extend(
        AntiPatterns::default()
            .flags()
            .map(|(flag, code, _)| Variant {
                label: format!("{code} {flag}"),
                flag: Some(flag),
                instrumented: false,
            }),
    );
    rows.push(tuned("tuned, recorded by perfkit", true));
    rows
}

/// Runs this binary once as a child and returns its mean step time.
fn child_step_time(
    cli: &Cli,
    variant: &Variant,
    trace_dir: &std::path::Path,
) -> anyhow::Result<Duration> {
    let exe = std::env::current_exe().context("cannot find the train executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["--device", "cuda", "--bench-child"])
        .args(["--steps", &cli.bench_steps.to_string()])
        .args(["--batch-size", &cli.batch_size.to_string()])
        .args(["--hidden", &cli.hidden.to_string()])
        .args(["--lr", &cli.lr.to_string()])
        .args(["--noise", &cli.noise.to_string()])
        .args(["--seed", &cli.seed.to_string()]);
    if let Some(workers) = cli.workers {
        cmd.args(["--workers", &workers.to_string()]);
    }
    if let Some(flag) = variant.flag {
        cmd.arg(flag);
    }
    cmd.env_remove(perfkit_profiler::TRACE_ENV);
    if variant.instrumented {
        cmd.env(perfkit_profiler::TRACE_ENV, trace_dir);
    }
    let output = cmd.output().context("cannot run the benchmark child")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "benchmark run `{}` failed ({}): {}",
            variant.label,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let ns = stdout
        .lines()
        .find_map(|l| l.strip_prefix("bench-child: mean_step_ns="))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .with_context(|| format!("benchmark run `{}` printed no step time", variant.label))?;
    Ok(Duration::from_nanos(ns))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench(cli: &Cli) -> anyhow::Result<ExitCode> {
    let ctx = perfkit_profiler::cuda::open_device(0).context("--bench needs a CUDA GPU")?;
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".to_string());
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "perfkit reference workload on {name}: MLP 784 -> {} -> 10, batch {}, {} steps per run, median of {}",
        cli.hidden,
        cli.batch_size,
        cli.bench_steps,
        cli.bench_repeats.max(1)
    )?;
    writeln!(out)?;
    let bw = bandwidth(&ctx)?;
    let trace_dir: PathBuf =
        std::env::temp_dir().join(format!("perfkit-bench-{}", std::process::id()));
    let variants = variants();
    let mut rows = Vec::new();
    for variant in &variants {
        let times = (0..cli.bench_repeats.max(1))
            .map(|_| child_step_time(cli, variant, &trace_dir))
            .collect::<anyhow::Result<Vec<_>>>()?;
        rows.push((variant, median(times)));
    }
    let _ = std::fs::remove_dir_all(&trace_dir);
    let tuned = rows[0].1.as_secs_f64();
    writeln!(out, "| run | step time (ms) | vs tuned |")?;
    writeln!(out, "|---|---:|---:|")?;
    for (variant, t) in &rows {
        let ms = t.as_secs_f64() * 1e3;
        writeln!(
            out,
            "| {} | {ms:.3} | {:.2}x |",
            variant.label,
            t.as_secs_f64() / tuned
        )?;
    }
    let instrumented = rows[rows.len() - 1].1.as_secs_f64();
    writeln!(out)?;
    writeln!(
        out,
        "instrumentation overhead: {:+.1}% of the tuned step time (target at most 3%)",
        (instrumented / tuned - 1.0) * 100.0
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| copy ({} MiB) | pinned GB/s | pageable GB/s | pinned / pageable (target H2D at least 1.5x) |",
        BANDWIDTH_BYTES >> 20
    )?;
    writeln!(out, "|---|---:|---:|---:|")?;
    for (dir, pinned, pageable) in [
        ("host to device", bw.h2d_pinned, bw.h2d_pageable),
        ("device to host", bw.d2h_pinned, bw.d2h_pageable),
    ] {
        writeln!(
            out,
            "| {dir} | {pinned:.1} | {pageable:.1} | {:.2}x |",
            pinned / pageable
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

const BANDWIDTH_BYTES: usize = 256 << 20;

struct Bandwidth {
    h2d_pinned: f64,
    h2d_pageable: f64,
    d2h_pinned: f64,
    d2h_pageable: f64,
}

/// Best-of-5 copy bandwidth in GB/s, host wall clock around a synchronized copy.
fn bandwidth(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> anyhow::Result<Bandwidth> {
    let n = BANDWIDTH_BYTES / std::mem::size_of::<f32>();
    let stream = ctx.new_stream()?;
    let mut pageable = vec![1.0f32; n];
    // SAFETY: filled right below before any copy reads it.
    let mut pinned = unsafe { ctx.alloc_pinned::<f32>(n) }?;
    pinned.as_mut_slice()?.fill(1.0);
    let mut dev = stream.alloc_zeros::<f32>(n)?;
    let gbps = |d: Duration| BANDWIDTH_BYTES as f64 / d.as_secs_f64() / 1e9;
    let best = |f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        let mut fastest = Duration::MAX;
        for _ in 0..5 {
            stream.synchronize()?;
            let t = Instant::now();
            f()?;
            stream.synchronize()?;
            fastest = fastest.min(t.elapsed());
        }
        Ok(gbps(fastest))
    };
    let h2d_pinned = best(&mut || Ok(stream.memcpy_htod(&pinned, &mut dev)?))?;
    let h2d_pageable = best(&mut || Ok(stream.memcpy_htod(&pageable, &mut dev)?))?;
    let d2h_pinned = best(&mut || Ok(stream.memcpy_dtoh(&dev, &mut pinned)?))?;
    let d2h_pageable = best(&mut || Ok(stream.memcpy_dtoh(&dev, &mut pageable)?))?;
    Ok(Bandwidth {
        h2d_pinned,
        h2d_pageable,
        d2h_pinned,
        d2h_pageable,
    })
}
