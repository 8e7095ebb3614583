//! The reference trainer on the CPU: the loss falls, the binary behaves, and a run
//! under `PERFKIT_TRACE` records the spans perfkit's reports read.

mod common;

use std::collections::BTreeMap;

use perfkit_kernels::task::MlpShape;
use perfkit_kernels::train::{DeviceChoice, TrainConfig, train};
use perfkit_profiler::model::Record;
use perfkit_profiler::{TraceReader, trace_files};

use common::{run_ok, train_bin};

fn small_config() -> TrainConfig {
    let mut cfg = TrainConfig::default();
    cfg.device = DeviceChoice::Cpu;
    cfg.steps = 60;
    cfg.batch_size = 64;
    cfg.seed = 7;
    cfg.workers = Some(2);
    cfg.shape = MlpShape {
        input: 64,
        hidden: 64,
        classes: 10,
    };
    cfg.noise_scale = 0.3;
    cfg.sgd.lr = 0.2;
    cfg
}

#[test]
fn the_loss_falls_below_half_of_the_first_on_a_fixed_seed() {
    let report = train(&small_config(), &mut |_| {}).expect("training");
    let first = report.first_loss().expect("a first loss");
    // The last few steps, so one hard batch does not decide the outcome.
    let tail = &report.losses[report.losses.len() - 5..];
    let last = tail.iter().sum::<f32>() / tail.len() as f32;
    assert!(
        first > 2.0,
        "an untrained 10-class model starts near ln(10): {first}"
    );
    assert!(
        last < first / 2.0,
        "loss went from {first} to {last}: {:?}",
        report.losses
    );
}

#[test]
fn the_same_seed_gives_the_same_losses() {
    let a = train(&small_config(), &mut |_| {}).expect("training");
    let b = train(&small_config(), &mut |_| {}).expect("training");
    assert_eq!(a.losses, b.losses);
    let mut other = small_config();
    other.seed = 8;
    let c = train(&other, &mut |_| {}).expect("training");
    assert_ne!(a.losses, c.losses);
}

#[test]
fn the_binary_trains_on_the_cpu_and_prints_the_loss() {
    let out = run_ok(train_bin().args([
        "--device",
        "cpu",
        "--steps",
        "21",
        "--batch-size",
        "32",
        "--hidden",
        "64",
        "--log-every",
        "10",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let steps: Vec<_> = stdout.lines().filter(|l| l.starts_with("step")).collect();
    assert_eq!(steps.len(), 3, "{stdout}");
    assert!(steps[0].starts_with("step      0  loss "), "{stdout}");
    assert!(stdout.contains("done: 21 steps on cpu"), "{stdout}");
}

#[test]
fn bad_flags_are_usage_errors_naming_the_flag() {
    let out = train_bin()
        .args(["--device", "gpu"])
        .output()
        .expect("run train");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device"));
    let out = train_bin()
        .args(["--device", "cpu", "--batch-size", "0"])
        .output()
        .expect("run train");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batch-size: must be at least 1"));
}

#[test]
fn without_a_driver_cuda_fails_clearly_and_auto_falls_back_to_the_cpu() {
    if perfkit_profiler::cuda::driver_present() {
        // With a driver these paths run on the GPU: see the GPU tests.
        return;
    }
    let out = train_bin()
        .args(["--device", "cuda", "--steps", "2"])
        .output()
        .expect("run train");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "train: error: --device cuda: no CUDA driver found (libcuda.so could not be loaded)"
    );
    let out = run_ok(train_bin().args([
        "--device",
        "auto",
        "--steps",
        "2",
        "--batch-size",
        "16",
        "--hidden",
        "32",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("note: no usable CUDA GPU (no CUDA driver found"),
        "{stdout}"
    );
    assert!(stdout.contains("done: 2 steps on cpu"), "{stdout}");
    let out = train_bin().args(["--bench"]).output().expect("run train");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bench needs a CUDA GPU"));
}

#[test]
fn a_traced_run_records_every_step_with_its_phases() {
    let dir = tempfile::tempdir().expect("temp dir");
    run_ok(train_bin().env("PERFKIT_TRACE", dir.path()).args([
        "--device",
        "cpu",
        "--steps",
        "5",
        "--batch-size",
        "16",
        "--hidden",
        "32",
        "--workers",
        "2",
    ]));
    let files = trace_files(dir.path()).expect("list traces");
    assert_eq!(files.len(), 1, "{files:?}");
    let mut reader = TraceReader::open(&files[0]).expect("open trace");
    let mut spans: BTreeMap<String, usize> = BTreeMap::new();
    for record in reader.by_ref() {
        if let Record::SpanNew(s) = record.expect("readable record") {
            *spans.entry(s.callsite.name.to_string()).or_default() += 1;
        }
    }
    for name in ["step", "data", "forward", "backward", "optimizer"] {
        assert_eq!(spans.get(name), Some(&5), "{name}: {spans:?}");
    }
    // The two data workers produced the batches.
    assert_eq!(spans.get("load_batch"), Some(&5), "{spans:?}");
}
