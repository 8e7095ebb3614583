//! The training loop of the reference workload, on the CPU or a CUDA GPU, with the
//! spans perfkit's reports read (`step`, `data`, `forward`, `backward`, `optimizer`).

use std::time::{Duration, Instant};

use perfkit_profiler::cuda;
use tracing::info_span;

use crate::antipatterns;
use crate::cpu_model::CpuMlp;
use crate::data::{Batch, HostLoader, RecordFormat, fill_batch_as};
use crate::gpu::{GpuError, GpuMlp};
use crate::task::{MlpShape, SgdConfig, TaskSpec};

/// Where to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first CUDA GPU when one is usable, else the CPU (with a note saying why).
    Auto,
    /// The CPU.
    Cpu,
    /// The first CUDA GPU; an error when there is none.
    Cuda,
}

/// Where batches come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// Generated on the host (inline or by workers) and uploaded.
    Host,
    /// Generated on the device by the `synth_batch` kernel (no upload at all).
    Device,
}

/// The anti-pattern switches (all off in the tuned run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct AntiPatterns {
    /// PK101: read the loss back to the host every step.
    pub readback_every_step: bool,
    /// PK102: synchronize the stream every step.
    pub sync_every_step: bool,
    /// PK201: build zeroed buffers on the host and upload them every step.
    pub cpu_then_copy: bool,
    /// PK202: allocate the activation buffers every step.
    pub alloc_every_step: bool,
    /// PK203: upload the batch one sample at a time.
    pub per_sample_upload: bool,
    /// PK303: upload the batch from pageable memory.
    pub pageable: bool,
}

impl AntiPatterns {
    /// Every switch with its command-line flag and rule code.
    #[must_use]
    pub fn flags(&self) -> [(&'static str, &'static str, bool); 6] {
        [
            ("--readback-every-step", "PK101", self.readback_every_step),
            ("--sync-every-step", "PK102", self.sync_every_step),
            ("--cpu-then-copy", "PK201", self.cpu_then_copy),
            ("--alloc-every-step", "PK202", self.alloc_every_step),
            ("--per-sample-upload", "PK203", self.per_sample_upload),
            ("--pageable", "PK303", self.pageable),
        ]
    }

    /// Whether any switch is on.
    #[must_use]
    pub fn any(&self) -> bool {
        self.flags().iter().any(|f| f.2)
    }
}

/// Configuration of one training run.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TrainConfig {
    /// Where to train (default [`DeviceChoice::Auto`]).
    pub device: DeviceChoice,
    /// Optimizer steps (default 200).
    pub steps: u64,
    /// Samples per batch (default 256).
    pub batch_size: usize,
    /// Seed of data and parameters (default 0).
    pub seed: u32,
    /// Host data worker threads: `None` sizes them to the machine ([`auto_workers`]), `Some(0)`
    /// generates each batch inline on the training thread (default `None`).
    pub workers: Option<usize>,
    /// Batches buffered per worker (default 2).
    pub prefetch: usize,
    /// Model shape (default 784 -> 1024 -> 10).
    pub shape: MlpShape,
    /// Optimizer (default lr 0.05, momentum 0.9, weight decay 1e-4).
    pub sgd: SgdConfig,
    /// Noise of the synthetic task (default 1.0).
    pub noise_scale: f32,
    /// Where batches come from (default [`DataSource::Host`]).
    pub data: DataSource,
    /// How the host loader gets each sample (default [`RecordFormat::Raw`]; `Csv` adds the
    /// real cost of decoding text records, same values).
    pub records: RecordFormat,
    /// Print the loss every this many steps (default 10).
    pub log_every: u64,
    /// Anti-pattern switches (default all off).
    pub anti: AntiPatterns,
    /// Extra host time spent (busy-waiting) inside every step, outside any other span: a known
    /// slowdown for benchmarking a regression gate (default zero).
    pub step_delay: Duration,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            device: DeviceChoice::Auto,
            steps: 200,
            batch_size: 256,
            seed: 0,
            workers: None,
            prefetch: 2,
            shape: MlpShape::default(),
            sgd: SgdConfig::default(),
            noise_scale: 1.0,
            data: DataSource::Host,
            records: RecordFormat::Raw,
            log_every: 10,
            anti: AntiPatterns::default(),
            step_delay: Duration::ZERO,
        }
    }
}

impl TrainConfig {
    /// The synthetic task of this run.
    #[must_use]
    pub fn task(&self) -> TaskSpec {
        self.shape.task(self.seed, self.noise_scale)
    }
}

/// Most loader workers [`auto_workers`] starts: four keep any GPU of this workload fed.
pub const MAX_AUTO_WORKERS: usize = 4;

/// How many loader workers a machine with `cores` usable cores gets, leaving cores to the
/// model. On the CPU the workers get half the cores (1 core loads inline, 2 cores get 1
/// worker, 8 cores get 4): the model's matrix products run on every core, and the workers,
/// which only run while they refill their prefetch buffers, fit in the time the products
/// leave. On a GPU the model needs one core to drive the device, so the workers get the
/// rest. At most [`MAX_AUTO_WORKERS`]. More workers than that (four on two cores) make the
/// workers and the model fight for the same cores, which is slower than loading inline.
#[must_use]
pub fn auto_workers(cores: usize, on_gpu: bool) -> usize {
    let spare = if on_gpu {
        cores.saturating_sub(1)
    } else {
        cores / 2
    };
    spare.min(MAX_AUTO_WORKERS)
}

/// The loader workers of a run and the note that says how they were chosen.
fn loader_workers(cfg: &TrainConfig, on_gpu: bool) -> (usize, String) {
    if cfg.data == DataSource::Device {
        return (0, "data: batches generated on the device".to_string());
    }
    match cfg.workers {
        Some(0) => (
            0,
            "data: loaded inline on the training thread (--workers 0)".to_string(),
        ),
        Some(n) => (
            n,
            format!("data: {n} loader worker{} (--workers {n})", plural(n)),
        ),
        None => {
            let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
            let n = auto_workers(cores, on_gpu);
            let model = if on_gpu {
                "1 drives the GPU"
            } else {
                "the model's matrix products use them all"
            };
            let what = if n == 0 {
                "loaded inline on the training thread".to_string()
            } else {
                format!("{n} loader worker{}", plural(n))
            };
            (
                n,
                format!(
                    "data: {what}, sized to the machine ({cores} core{}: {model}; --workers N to choose)",
                    plural(cores)
                ),
            )
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Something worth telling the user while training.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// A one-line note (device chosen, fallback reason, ignored switches).
    Note(String),
    /// The loss of a step, as soon as it is known on the host.
    Loss {
        /// Step index.
        step: u64,
        /// Mean cross-entropy of the step's batch.
        loss: f32,
    },
}

/// What a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainReport {
    /// `cpu` or `cuda:N (name)`.
    pub device: String,
    /// Steps run.
    pub steps: u64,
    /// The loss of every step.
    pub losses: Vec<f32>,
    /// Time from the first step to the end of the last one (on a GPU: until the work
    /// finished, measured by a synchronize after the loop).
    pub train_time: Duration,
}

impl TrainReport {
    /// Loss of the first step.
    #[must_use]
    pub fn first_loss(&self) -> Option<f32> {
        self.losses.first().copied()
    }

    /// Loss of the last step.
    #[must_use]
    pub fn final_loss(&self) -> Option<f32> {
        self.losses.last().copied()
    }

    /// Mean time per step.
    #[must_use]
    pub fn mean_step(&self) -> Duration {
        self.train_time / u32::try_from(self.steps.max(1)).unwrap_or(u32::MAX)
    }
}

/// Why training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// `--device cuda` was asked for and no GPU is usable.
    #[error("--device cuda: {0}")]
    CudaUnavailable(GpuError),
    /// The GPU failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A configuration value is out of range.
    #[error("{flag}: {message}")]
    Config {
        /// The flag at fault.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn validate(cfg: &TrainConfig) -> Result<(), TrainError> {
    let bad = |flag, message: &str| {
        Err(TrainError::Config {
            flag,
            message: message.to_string(),
        })
    };
    if cfg.batch_size == 0 {
        return bad("--batch-size", "must be at least 1");
    }
    if cfg.shape.input == 0 || cfg.shape.hidden == 0 || cfg.shape.classes < 2 {
        return bad(
            "--hidden",
            "the model needs inputs, hidden units and at least 2 classes",
        );
    }
    if !(cfg.sgd.lr.is_finite() && cfg.sgd.lr > 0.0) {
        return bad("--lr", "must be a positive number");
    }
    if cfg.log_every == 0 {
        return bad("--log-every", "must be at least 1");
    }
    Ok(())
}

/// Trains the MLP as configured, reporting progress through `progress`.
///
/// # Errors
/// [`TrainError`]: bad configuration, `--device cuda` without a usable GPU, or a GPU
/// failure. With [`DeviceChoice::Auto`] a missing driver, device or NVRTC falls back
/// to the CPU with a [`Progress::Note`].
pub fn train(
    cfg: &TrainConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<TrainReport, TrainError> {
    validate(cfg)?;
    match cfg.device {
        DeviceChoice::Cpu => Ok(train_cpu(cfg, progress)),
        DeviceChoice::Cuda => match open_gpu(cfg) {
            Ok(model) => train_gpu(cfg, model, progress),
            Err(e) if e.is_unavailable() => Err(TrainError::CudaUnavailable(e)),
            Err(e) => Err(e.into()),
        },
        DeviceChoice::Auto => match open_gpu(cfg) {
            Ok(model) => train_gpu(cfg, model, progress),
            Err(e) if e.is_unavailable() => {
                progress(Progress::Note(format!(
                    "no usable CUDA GPU ({e}); training on the CPU"
                )));
                Ok(train_cpu(cfg, progress))
            }
            Err(e) => Err(e.into()),
        },
    }
}

fn open_gpu(cfg: &TrainConfig) -> Result<(GpuMlp, String), GpuError> {
    let ctx = cuda::open_device(0)?;
    let name = ctx.name().unwrap_or_else(|_| "unknown".to_string());
    let steps = usize::try_from(cfg.steps).unwrap_or(usize::MAX);
    let model = GpuMlp::new(&ctx, cfg.shape, cfg.sgd, cfg.batch_size, cfg.seed, steps)?;
    Ok((model, format!("cuda:0 ({name})")))
}

/// Busy-waits `delay` (no sleep: a timer's slack would blur a delay of a few microseconds).
fn spin_for(delay: Duration) {
    if delay.is_zero() {
        return;
    }
    let until = Instant::now() + delay;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn log_due(cfg: &TrainConfig, step: u64) -> bool {
    step.is_multiple_of(cfg.log_every) || step + 1 == cfg.steps
}

fn train_cpu(cfg: &TrainConfig, progress: &mut dyn FnMut(Progress)) -> TrainReport {
    // --alloc-every-step has a CPU twin (fresh host buffers every step); the other switches
    // only change the GPU path.
    if cfg.anti.alloc_every_step {
        progress(Progress::Note(
            "--alloc-every-step: the CPU run allocates its activation and gradient buffers \
             afresh every step"
                .to_string(),
        ));
    }
    let gpu_only: Vec<_> = cfg
        .anti
        .flags()
        .iter()
        .filter(|f| f.2 && f.0 != "--alloc-every-step")
        .map(|f| f.0)
        .collect();
    if !gpu_only.is_empty() {
        progress(Progress::Note(format!(
            "{} only change the GPU path; the CPU run is the same as without them",
            gpu_only.join(", ")
        )));
    }
    let (workers, note) = loader_workers(cfg, false);
    progress(Progress::Note(note));
    let spec = cfg.task();
    let rows = cfg.batch_size;
    let mut model = CpuMlp::new(cfg.shape, cfg.sgd, rows, cfg.seed);
    // The model's matrix products use every core: the loader workers (half the cores at
    // most) only run while they fill their prefetch buffers, and a product's threads block
    // (never spin) while they wait for each other, so they give way to the workers.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    model.set_threads(cores);
    let mut loader = (cfg.data == DataSource::Host).then(|| {
        HostLoader::with_format(spec, rows, cfg.steps, workers, cfg.prefetch, cfg.records)
    });
    let mut inline = Batch::default();
    let mut losses = Vec::with_capacity(usize::try_from(cfg.steps).unwrap_or(0));
    let start = Instant::now();
    for step in 0..cfg.steps {
        let _step = info_span!("step", step).entered();
        let batch = {
            let _data = info_span!("data").entered();
            match loader.as_mut().and_then(HostLoader::next_batch) {
                Some(batch) => batch,
                None => {
                    let mut b = std::mem::take(&mut inline);
                    fill_batch_as(&mut b, &spec, rows, step, cfg.records);
                    b
                }
            }
        };
        if cfg.anti.alloc_every_step {
            antipatterns::alloc_host_buffers_every_step(&mut model);
        }
        let loss = {
            let _forward = info_span!("forward").entered();
            model.forward(&batch.x, &batch.labels)
        };
        {
            let _backward = info_span!("backward").entered();
            model.backward(&batch.x, &batch.labels);
        }
        {
            let _optimizer = info_span!("optimizer").entered();
            model.step();
        }
        match loader.as_mut() {
            Some(loader) => loader.recycle(batch),
            None => inline = batch,
        }
        spin_for(cfg.step_delay);
        losses.push(loss);
        if log_due(cfg, step) {
            progress(Progress::Loss { step, loss });
        }
    }
    TrainReport {
        device: "cpu".to_string(),
        steps: cfg.steps,
        losses,
        train_time: start.elapsed(),
    }
}

/// Moves the host batch to the device the way the switches say.
fn upload_batch(model: &mut GpuMlp, batch: &Batch, anti: &AntiPatterns) -> Result<(), GpuError> {
    if anti.per_sample_upload {
        antipatterns::upload_per_sample(&model.stream, batch, &mut model.batch)
    } else if anti.pageable {
        antipatterns::upload_pageable(&model.stream, batch, &mut model.batch)
    } else {
        model.upload_pinned(batch)
    }
}

fn train_gpu(
    cfg: &TrainConfig,
    (mut model, device): (GpuMlp, String),
    progress: &mut dyn FnMut(Progress),
) -> Result<TrainReport, TrainError> {
    progress(Progress::Note(format!("training on {device}")));
    let anti = cfg.anti;
    if !anti.readback_every_step {
        progress(Progress::Note(
            "losses stay on the device during the run and are printed after it \
             (--readback-every-step prints them as it goes, at the cost rule PK101 measures)"
                .to_string(),
        ));
    }
    let spec = cfg.task();
    let rows = cfg.batch_size;
    let shape = model.shape();
    let (workers, note) = loader_workers(cfg, true);
    progress(Progress::Note(note));
    let mut loader = (cfg.data == DataSource::Host).then(|| {
        HostLoader::with_format(spec, rows, cfg.steps, workers, cfg.prefetch, cfg.records)
    });

    // Warm-up outside the timed loop: cuBLAS and module initialisation happen on the
    // first calls. No optimizer step, so the parameters are unchanged.
    model.generate_on_device(&spec, 0)?;
    model.forward(0)?;
    model.backward()?;
    model.stream.synchronize().map_err(GpuError::from)?;

    let start = Instant::now();
    for step in 0..cfg.steps {
        let _step = info_span!("step", step).entered();
        let slot = usize::try_from(step).unwrap_or(usize::MAX);
        {
            let _data = info_span!("data").entered();
            match loader.as_mut() {
                None => model.generate_on_device(&spec, step)?,
                Some(loader) => {
                    let Some(batch) = loader.next_batch() else {
                        break;
                    };
                    upload_batch(&mut model, &batch, &anti)?;
                    loader.recycle(batch);
                }
            }
        }
        if anti.alloc_every_step {
            model.scratch = antipatterns::alloc_scratch_every_step(&model.stream, &shape, rows)?;
        } else if anti.cpu_then_copy {
            model.scratch = antipatterns::scratch_from_host_zeros(&model.stream, &shape, rows)?;
        }
        {
            let _forward = info_span!("forward").entered();
            model.forward(slot)?;
        }
        {
            let _backward = info_span!("backward").entered();
            model.backward()?;
        }
        {
            let _optimizer = info_span!("optimizer").entered();
            model.step()?;
        }
        if anti.readback_every_step {
            let loss = antipatterns::read_loss_every_step(&model.stream, &model.loss_log, slot)?;
            progress(Progress::Loss { step, loss });
        }
        if anti.sync_every_step {
            antipatterns::synchronize_every_step(&model.stream)?;
        }
        spin_for(cfg.step_delay);
    }
    model.stream.synchronize().map_err(GpuError::from)?;
    let train_time = start.elapsed();
    let losses = model.read_losses(usize::try_from(cfg.steps).unwrap_or(usize::MAX))?;
    if !anti.readback_every_step {
        for (step, loss) in losses.iter().enumerate() {
            if log_due(cfg, step as u64) {
                progress(Progress::Loss {
                    step: step as u64,
                    loss: *loss,
                });
            }
        }
    }
    Ok(TrainReport {
        device,
        steps: cfg.steps,
        losses,
        train_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(steps: u64) -> TrainConfig {
        TrainConfig {
            device: DeviceChoice::Cpu,
            steps,
            batch_size: 32,
            shape: MlpShape {
                input: 64,
                hidden: 32,
                classes: 10,
            },
            workers: Some(0),
            ..TrainConfig::default()
        }
    }

    #[test]
    fn bad_values_name_their_flag() {
        let mut cfg = small(1);
        cfg.batch_size = 0;
        let err = train(&cfg, &mut |_| {}).unwrap_err();
        assert_eq!(err.to_string(), "--batch-size: must be at least 1");
        let mut cfg = small(1);
        cfg.sgd.lr = f32::NAN;
        assert!(
            train(&cfg, &mut |_| {})
                .unwrap_err()
                .to_string()
                .starts_with("--lr:")
        );
    }

    #[test]
    fn cpu_progress_reports_the_logged_steps() {
        let mut cfg = small(12);
        cfg.log_every = 5;
        let mut steps = Vec::new();
        let report = train(&cfg, &mut |p| {
            if let Progress::Loss { step, .. } = p {
                steps.push(step);
            }
        })
        .unwrap();
        assert_eq!(steps, vec![0, 5, 10, 11]);
        assert_eq!(report.losses.len(), 12);
        assert_eq!(report.device, "cpu");
    }

    #[test]
    fn anti_pattern_switches_on_the_cpu_are_announced_as_no_ops() {
        let mut cfg = small(2);
        cfg.anti.pageable = true;
        let mut notes = Vec::new();
        train(&cfg, &mut |p| {
            if let Progress::Note(n) = p {
                notes.push(n);
            }
        })
        .unwrap();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("--pageable") && n.contains("CPU")),
            "{notes:?}"
        );
    }

    #[test]
    fn loader_workers_leave_cores_to_the_model() {
        // The CPU model gets half the cores, a GPU one; never more than four workers.
        let cpu: Vec<usize> = [1, 2, 3, 4, 8, 64].map(|c| auto_workers(c, false)).to_vec();
        assert_eq!(cpu, vec![0, 1, 1, 2, 4, 4]);
        let gpu: Vec<usize> = [1, 2, 4, 64].map(|c| auto_workers(c, true)).to_vec();
        assert_eq!(gpu, vec![0, 1, 3, 4]);
    }

    #[test]
    fn the_run_says_how_many_loader_workers_it_uses_and_why() {
        let notes = |cfg: &TrainConfig| {
            let mut notes = Vec::new();
            train(cfg, &mut |p| {
                if let Progress::Note(n) = p {
                    notes.push(n);
                }
            })
            .unwrap();
            notes
        };
        let mut cfg = small(2);
        cfg.workers = None;
        let auto = notes(&cfg);
        assert!(
            auto.iter()
                .any(|n| n.starts_with("data: ") && n.contains("sized to the machine")),
            "{auto:?}"
        );
        cfg.workers = Some(0);
        let inline = notes(&cfg);
        assert!(
            inline
                .contains(&"data: loaded inline on the training thread (--workers 0)".to_string()),
            "{inline:?}"
        );
    }

    #[test]
    fn allocating_the_cpu_buffers_every_step_trains_identically_and_says_so() {
        let tuned = train(&small(5), &mut |_| {}).unwrap();
        let mut cfg = small(5);
        cfg.anti.alloc_every_step = true;
        let mut notes = Vec::new();
        let anti = train(&cfg, &mut |p| {
            if let Progress::Note(n) = p {
                notes.push(n);
            }
        })
        .unwrap();
        assert_eq!(anti.losses, tuned.losses);
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("--alloc-every-step: the CPU run allocates")),
            "{notes:?}"
        );
        assert!(
            !notes.iter().any(|n| n.contains("only change the GPU path")),
            "{notes:?}"
        );
    }

    #[test]
    fn workers_do_not_change_the_result() {
        let inline = train(&small(6), &mut |_| {}).unwrap();
        let mut cfg = small(6);
        cfg.workers = Some(3);
        let with_workers = train(&cfg, &mut |_| {}).unwrap();
        assert_eq!(inline.losses, with_workers.losses);
    }

    #[test]
    fn cuda_without_a_driver_is_a_clear_error_and_auto_falls_back() {
        if cuda::driver_present() {
            // A machine with a driver takes the GPU path; covered by the GPU tests.
            return;
        }
        let mut cfg = small(3);
        cfg.device = DeviceChoice::Cuda;
        let err = train(&cfg, &mut |_| {}).unwrap_err();
        assert!(matches!(err, TrainError::CudaUnavailable(_)));
        assert_eq!(
            err.to_string(),
            "--device cuda: no CUDA driver found (libcuda.so could not be loaded)"
        );
        cfg.device = DeviceChoice::Auto;
        let mut notes = Vec::new();
        let report = train(&cfg, &mut |p| {
            if let Progress::Note(n) = p {
                notes.push(n);
            }
        })
        .unwrap();
        assert_eq!(report.device, "cpu");
        assert!(notes[0].contains("no CUDA driver found"), "{notes:?}");
    }
}
