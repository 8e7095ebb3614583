//! Every CUDA kernel against its CPU twin, and the trainer on a GPU.
//!
//! These need a CUDA GPU (and NVRTC): run them with `cargo test -p perfkit-kernels
//! -- --ignored` on a GPU machine. Without one they fail, never pass.

mod common;

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice};
use perfkit_kernels::cpu;
use perfkit_kernels::gpu::{GpuKernels, Ops};
use perfkit_kernels::rng;
use perfkit_kernels::task::{SgdConfig, TaskSpec};
use perfkit_kernels::train::{DeviceChoice, TrainConfig, train};
use perfkit_profiler::cuda::{self, ProfiledStream};

const TOLERANCE: f32 = 1e-4;

struct Gpu {
    _ctx: Arc<CudaContext>,
    stream: ProfiledStream,
    kernels: GpuKernels,
    blas: CudaBlas,
}

impl Gpu {
    fn new() -> Gpu {
        let ctx = cuda::open_device(0).expect("these tests need a CUDA GPU");
        let kernels = GpuKernels::load(&ctx).expect("kernels compile and load");
        let stream = ProfiledStream::new_on(&ctx).expect("stream");
        let blas = stream.new_blas().expect("cuBLAS");
        Gpu {
            _ctx: ctx,
            stream,
            kernels,
            blas,
        }
    }

    fn ops(&self) -> Ops<'_> {
        Ops {
            stream: &self.stream,
            kernels: &self.kernels,
            blas: &self.blas,
        }
    }

    fn upload<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> CudaSlice<T> {
        self.stream.clone_htod(v).expect("upload")
    }

    /// A device buffer of `n` NaNs: any element a kernel fails to write stays NaN.
    fn poisoned(&self, n: usize) -> CudaSlice<f32> {
        self.upload(&vec![f32::NAN; n])
    }

    fn read<T: cudarc::driver::DeviceRepr>(&self, d: &CudaSlice<T>) -> Vec<T> {
        self.stream.clone_dtoh(d).expect("download")
    }
}

/// A seed that differs from run to run (printed so a failure can be reproduced).
fn fresh_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
        .unwrap_or(1);
    let seed = rng::hash(nanos);
    eprintln!("seed {seed}");
    seed
}

fn random(n: usize, seed: u32, tag: u32, lo: f32, hi: f32) -> Vec<f32> {
    let mut v = vec![0.0; n];
    cpu::fill_uniform(&mut v, seed, tag, lo, hi);
    v
}

/// Max absolute difference relative to the largest reference magnitude; NaN anywhere
/// (an element the kernel did not write) is an infinite error.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length");
    let scale = want
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let mut worst = 0.0f32;
    for (g, w) in got.iter().zip(want) {
        if g.is_nan() || w.is_nan() {
            return f32::INFINITY;
        }
        worst = worst.max((g - w).abs() / scale);
    }
    worst
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let e = rel_err(got, want);
    assert!(e <= TOLERANCE, "{what}: relative error {e} > {TOLERANCE}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fill_uniform_matches_its_twin() {
    let g = Gpu::new();
    let seed = fresh_seed();
    let mut d = g.poisoned(100_003);
    g.ops()
        .fill_uniform(&mut d.as_view_mut(), seed, 42, -0.3, 0.7)
        .unwrap();
    assert_close(
        "fill_uniform",
        &g.read(&d),
        &random(100_003, seed, 42, -0.3, 0.7),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn synth_batch_matches_its_twin() {
    let g = Gpu::new();
    let spec = TaskSpec {
        seed: fresh_seed(),
        dim: 784,
        classes: 10,
        signal: 0.2,
        noise_scale: 1.0,
    };
    let rows = 129;
    let mut x = g.poisoned(rows * spec.dim);
    let mut labels = g.upload(&vec![-1i32; rows]);
    g.ops()
        .synth_batch(
            &mut x.as_view_mut(),
            &mut labels.as_view_mut(),
            &spec,
            1 << 33,
        )
        .unwrap();
    let mut want_x = vec![0.0; rows * spec.dim];
    let mut want_labels = vec![0; rows];
    cpu::synth_batch(&mut want_x, &mut want_labels, &spec, 1 << 33);
    assert_eq!(g.read(&labels), want_labels);
    assert_close("synth_batch", &g.read(&x), &want_x);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bias_act_fwd_matches_its_twin() {
    let g = Gpu::new();
    let seed = fresh_seed();
    let (rows, cols) = (37, 1000);
    for relu in [true, false] {
        let z0 = random(rows * cols, seed, 1, -1.0, 1.0);
        let bias = random(cols, seed, 2, -0.5, 0.5);
        // Poison, then load the input (the kernel works in place).
        let mut z = g.poisoned(rows * cols);
        g.stream.memcpy_htod(&z0, &mut z).unwrap();
        let b = g.upload(&bias);
        g.ops()
            .bias_act_fwd(&mut z.as_view_mut(), &b.as_view(), rows, cols, relu)
            .unwrap();
        let mut want = z0.clone();
        cpu::bias_act_fwd(&mut want, &bias, rows, cols, relu);
        assert_close(&format!("bias_act_fwd relu={relu}"), &g.read(&z), &want);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bias_act_bwd_matches_its_twin() {
    let g = Gpu::new();
    let seed = fresh_seed();
    let (rows, cols) = (301, 1027);
    for relu in [true, false] {
        let h: Vec<f32> = random(rows * cols, seed, 3, -1.0, 1.0)
            .iter()
            .map(|v| v.max(0.0))
            .collect();
        let dz0 = random(rows * cols, seed, 4, -1.0, 1.0);
        let hd = g.upload(&h);
        let mut dz = g.poisoned(rows * cols);
        g.stream.memcpy_htod(&dz0, &mut dz).unwrap();
        let mut db = g.poisoned(cols);
        g.ops()
            .bias_act_bwd(
                &hd.as_view(),
                &mut dz.as_view_mut(),
                &mut db.as_view_mut(),
                rows,
                cols,
                relu,
            )
            .unwrap();
        let mut want_dz = dz0.clone();
        let mut want_db = vec![f32::NAN; cols];
        cpu::bias_act_bwd(&h, &mut want_dz, &mut want_db, rows, cols, relu);
        assert_close(
            &format!("bias_act_bwd dz relu={relu}"),
            &g.read(&dz),
            &want_dz,
        );
        assert_close(
            &format!("bias_act_bwd db relu={relu}"),
            &g.read(&db),
            &want_db,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn softmax_cross_entropy_matches_its_twin() {
    let g = Gpu::new();
    let seed = fresh_seed();
    let (rows, cols) = (1000, 10);
    let logits = random(rows * cols, seed, 5, -5.0, 5.0);
    let labels: Vec<i32> = (0..rows)
        .map(|r| (rng::mix(seed, 6, r as u64) % cols as u32) as i32)
        .collect();
    let ld = g.upload(&logits);
    let yd = g.upload(&labels);
    let mut probs = g.poisoned(rows * cols);
    let mut loss = g.poisoned(3);
    g.ops()
        .softmax_xent_fwd(
            &ld.as_view(),
            &yd.as_view(),
            &mut probs.as_view_mut(),
            &mut loss.slice_mut(1..2),
            cols,
        )
        .unwrap();
    let mut want_probs = vec![0.0; rows * cols];
    let want_loss = cpu::softmax_xent_fwd(&logits, &labels, &mut want_probs, cols);
    assert_close("softmax_xent_fwd probs", &g.read(&probs), &want_probs);
    let got_loss = g.read(&loss);
    assert!(
        got_loss[0].is_nan() && got_loss[2].is_nan(),
        "the loss kernel wrote outside its slot"
    );
    assert_close("softmax_xent_fwd loss", &got_loss[1..2], &[want_loss]);

    let mut dlogits = g.poisoned(rows * cols);
    g.ops()
        .softmax_xent_bwd(
            &probs.as_view(),
            &yd.as_view(),
            &mut dlogits.as_view_mut(),
            cols,
        )
        .unwrap();
    let mut want_d = vec![0.0; rows * cols];
    cpu::softmax_xent_bwd(&want_probs, &labels, &mut want_d, cols);
    assert_close("softmax_xent_bwd", &g.read(&dlogits), &want_d);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sgd_momentum_matches_its_twin() {
    let g = Gpu::new();
    let seed = fresh_seed();
    let n = 50_001;
    let sgd = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-4,
    };
    let (w0, v0, grad) = (
        random(n, seed, 7, -1.0, 1.0),
        random(n, seed, 8, -0.1, 0.1),
        random(n, seed, 9, -1.0, 1.0),
    );
    let mut w = g.poisoned(n);
    g.stream.memcpy_htod(&w0, &mut w).unwrap();
    let mut v = g.poisoned(n);
    g.stream.memcpy_htod(&v0, &mut v).unwrap();
    let gd = g.upload(&grad);
    g.ops()
        .sgd_momentum(
            &mut w.as_view_mut(),
            &mut v.as_view_mut(),
            &gd.as_view(),
            &sgd,
        )
        .unwrap();
    let (mut want_w, mut want_v) = (w0.clone(), v0.clone());
    cpu::sgd_momentum(
        &mut want_w,
        &mut want_v,
        &grad,
        sgd.lr,
        sgd.momentum,
        sgd.weight_decay,
    );
    assert_close("sgd_momentum w", &g.read(&w), &want_w);
    assert_close("sgd_momentum v", &g.read(&v), &want_v);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cublas_gemm_matches_the_cpu_product_for_every_transpose() {
    let g = Gpu::new();
    let seed = fresh_seed();
    let (m, n, k) = (33, 65, 129);
    let a = random(m * k, seed, 10, -1.0, 1.0);
    let b = random(k * n, seed, 11, -1.0, 1.0);
    let c0 = random(m * n, seed, 12, -1.0, 1.0);
    let (ad, bd) = (g.upload(&a), g.upload(&b));
    for ta in [false, true] {
        for tb in [false, true] {
            // beta = 0: cuBLAS must not read C, so NaN poison must vanish.
            let mut c = g.poisoned(m * n);
            g.ops()
                .gemm(ta, tb, m, n, k, 1.0, &ad, &bd, 0.0, &mut c)
                .unwrap();
            let mut want = vec![0.0; m * n];
            cpu::gemm(ta, tb, m, n, k, 1.0, &a, &b, 0.0, &mut want);
            assert_close(&format!("gemm ta={ta} tb={tb} beta=0"), &g.read(&c), &want);
            // alpha and beta.
            let mut c = g.upload(&c0);
            g.ops()
                .gemm(ta, tb, m, n, k, 0.7, &ad, &bd, 0.3, &mut c)
                .unwrap();
            let mut want = c0.clone();
            cpu::gemm(ta, tb, m, n, k, 0.7, &a, &b, 0.3, &mut want);
            assert_close(
                &format!("gemm ta={ta} tb={tb} beta=0.3"),
                &g.read(&c),
                &want,
            );
        }
    }
}

/// An anti-pattern switch: its name and how it changes the configuration.
type Switch = (&'static str, fn(&mut TrainConfig));

fn gpu_config(steps: u64) -> TrainConfig {
    let mut cfg = TrainConfig::default();
    cfg.device = DeviceChoice::Cuda;
    cfg.steps = steps;
    cfg.seed = 3;
    cfg
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_loss_falls_on_the_gpu_and_starts_where_the_cpu_starts() {
    let report = train(&gpu_config(200), &mut |_| {}).expect("GPU training");
    assert!(report.device.starts_with("cuda:0"), "{}", report.device);
    let first = report.first_loss().unwrap();
    let tail = &report.losses[report.losses.len() - 10..];
    let last = tail.iter().sum::<f32>() / tail.len() as f32;
    assert!(last < first / 2.0, "loss went from {first} to {last}");
    // Same initial parameters and the same first batch: the first loss agrees.
    let mut cpu_cfg = gpu_config(1);
    cpu_cfg.device = DeviceChoice::Cpu;
    let cpu_report = train(&cpu_cfg, &mut |_| {}).unwrap();
    let cpu_first = cpu_report.first_loss().unwrap();
    assert!(
        (first - cpu_first).abs() <= TOLERANCE * cpu_first,
        "GPU {first} vs CPU {cpu_first}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_anti_pattern_path_computes_the_same_training_run() {
    let steps = 20;
    let tuned = train(&gpu_config(steps), &mut |_| {}).expect("tuned run");
    let switches: [Switch; 6] = [
        ("readback", |c| c.anti.readback_every_step = true),
        ("sync", |c| c.anti.sync_every_step = true),
        ("cpu-then-copy", |c| c.anti.cpu_then_copy = true),
        ("alloc", |c| c.anti.alloc_every_step = true),
        ("per-sample", |c| c.anti.per_sample_upload = true),
        ("pageable", |c| c.anti.pageable = true),
    ];
    for (name, set) in switches {
        let mut cfg = gpu_config(steps);
        set(&mut cfg);
        let run = train(&cfg, &mut |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_close(name, &run.losses, &tuned.losses);
    }
    // Batches generated on the device are the same batches.
    let mut cfg = gpu_config(steps);
    cfg.data = perfkit_kernels::train::DataSource::Device;
    let on_device = train(&cfg, &mut |_| {}).unwrap();
    assert_close("data on device", &on_device.losses, &tuned.losses);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_traced_gpu_run_records_copies_kernels_and_syncs_at_their_source_lines() {
    use perfkit_profiler::model::{GpuOpKind, HostMemory, Record};
    let dir = tempfile::tempdir().unwrap();
    let steps = 5u64;
    common::run_ok(common::train_bin().env("PERFKIT_TRACE", dir.path()).args([
        "--device",
        "cuda",
        "--steps",
        &steps.to_string(),
        "--readback-every-step",
        "--pageable",
    ]));
    let files = perfkit_profiler::trace_files(dir.path()).unwrap();
    let mut reader = perfkit_profiler::TraceReader::open(&files[0]).unwrap();
    let mut ops = Vec::new();
    for record in reader.by_ref() {
        if let Record::Gpu(g) = record.unwrap() {
            ops.push(g);
        }
    }
    let at = |g: &perfkit_profiler::model::GpuEvent, file: &str| {
        g.location.as_ref().is_some_and(|l| l.file.ends_with(file))
    };
    // PK101: one 4-byte pageable D2H per step, from the anti-pattern function.
    let readbacks = ops
        .iter()
        .filter(|g| g.kind == GpuOpKind::MemcpyDtoH && g.bytes == 4 && at(g, "antipatterns.rs"))
        .count();
    assert_eq!(readbacks as u64, steps);
    // PK303: the batch (features and labels) uploaded from pageable memory every step.
    let batch_bytes = 256 * 784 * 4;
    let uploads: Vec<_> = ops
        .iter()
        .filter(|g| {
            g.kind == GpuOpKind::MemcpyHtoD && g.bytes == batch_bytes && at(g, "antipatterns.rs")
        })
        .collect();
    assert_eq!(uploads.len() as u64, steps);
    assert!(
        uploads
            .iter()
            .all(|g| g.host_memory == Some(HostMemory::Pageable))
    );
    // Kernels by name, cuBLAS products, and the final synchronize.
    let kernel_names: std::collections::BTreeSet<String> = ops
        .iter()
        .filter_map(|g| g.kernel.as_ref().map(|k| k.name.to_string()))
        .collect();
    for name in [
        "bias_act_fwd",
        "bias_act_bwd",
        "softmax_xent_fwd",
        "softmax_xent_bwd",
        "sgd_momentum",
        "cublasSgemm",
    ] {
        assert!(
            kernel_names.contains(name),
            "{name} missing from {kernel_names:?}"
        );
    }
    assert!(ops.iter().any(|g| g.kind == GpuOpKind::Synchronize));
    let timed = ops.iter().filter(|g| g.gpu_start.is_some()).count();
    assert!(
        timed * 10 >= ops.len() * 7,
        "only {timed} of {} operations have GPU times",
        ops.len()
    );
}
