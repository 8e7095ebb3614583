//! The CUDA recorder on a real GPU: what it writes into the trace matches what was
//! done. Run with `cargo test -p perfkit-profiler --test cuda_recorder -- --ignored`
//! on a GPU machine (with NVRTC for the kernel launch); without one they fail.
//!
//! One recording session per process, so everything is checked in one test.

#![cfg(feature = "cuda")]

use std::collections::HashMap;

use cudarc::cublas::GemmConfig;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::LaunchConfig;
use perfkit_profiler::cuda::{self, ProfiledStream};
use perfkit_profiler::model::{GpuEvent, GpuOpKind, HostMemory, Record};
use perfkit_profiler::{Builder, TraceReader};

/// How far a GPU start may precede the host call that enqueued it: the uncertainty of
/// the reference event's host time (the window it was polled in) plus clock noise.
const ALIGNMENT_SLACK_NS: u64 = 200_000;

const SCALE_KERNEL: &str = r#"
extern "C" __global__ void scale(float* x, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i];
}
"#;

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_operations_match_what_was_done_and_sit_inside_the_host_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cuda.pktrace");
    let guard = Builder::new()
        .output(&path)
        .try_init()
        .expect("recording starts");
    let ctx = cuda::open_device(0).expect("this test needs a CUDA GPU");
    let stream = ProfiledStream::new_on(&ctx).expect("stream");
    let blas = stream.new_blas().expect("cuBLAS");
    let ptx = cudarc::nvrtc::compile_ptx(SCALE_KERNEL).expect("NVRTC");
    let module = ctx.load_module(ptx).expect("module");
    let scale = module.load_function("scale").expect("function");

    let span = tracing::info_span!("copies");
    let entered = span.enter();
    let host = vec![1.5f32; 1000];
    let d = stream.clone_htod(&host).unwrap(); // alloc 4000, htod 4000 pageable
    // SAFETY: filled right below.
    let mut pinned = unsafe { ctx.alloc_pinned::<f32>(2048) }.unwrap();
    pinned.as_mut_slice().unwrap().fill(2.0);
    let mut d2 = stream.alloc_zeros::<f32>(2048).unwrap(); // alloc 8192, memset 8192
    stream.memcpy_htod(&pinned, &mut d2).unwrap(); // htod 8192 pinned
    let mut d3 = stream.alloc_zeros::<f32>(1000).unwrap(); // alloc 4000, memset 4000
    stream.memcpy_dtod(&d, &mut d3).unwrap(); // dtod 4000
    let n = 1000u32;
    let a = 3.0f32;
    let mut launch = stream.launch_builder(&scale);
    launch.arg(&mut d3).arg(&a).arg(&n);
    // SAFETY: matches `scale(float*, float, uint)` with n = len(d3).
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap(); // kernel "scale"
    let mut c = stream.alloc_zeros::<f32>(4).unwrap(); // alloc 16, memset 16
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: 2,
        n: 2,
        k: 2,
        alpha: 1.0f32,
        lda: 2,
        ldb: 2,
        beta: 0.0,
        ldc: 2,
    };
    // SAFETY: 2x2 by 2x2 into 2x2, all buffers at least 4 elements.
    unsafe { stream.gemm(&blas, cfg, &d, &d2, &mut c) }.unwrap(); // kernel "cublasSgemm"
    let back = stream.clone_dtoh(&d3).unwrap(); // dtoh 4000 pageable
    stream.memcpy_dtoh(&d2, &mut pinned).unwrap(); // dtoh 8192 pinned
    stream.synchronize().unwrap(); // sync
    drop(entered);
    assert!(
        back.iter().all(|v| *v == 4.5),
        "the kernel ran on the copied data"
    );
    assert!(pinned.as_slice().unwrap().iter().all(|v| *v == 2.0));
    drop(stream);
    guard.finish();

    let mut reader = TraceReader::open(&path).expect("trace");
    let mut gpu: Vec<GpuEvent> = Vec::new();
    let mut late: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut span_ids = HashMap::new();
    let mut end_ts = None;
    let mut devices = 0;
    let mut memory_samples = 0;
    for record in reader.by_ref() {
        match record.expect("readable record") {
            Record::Gpu(g) => gpu.push(g),
            Record::GpuTiming(t) => {
                late.insert(t.id, (t.gpu_start, t.gpu_end));
            }
            Record::SpanNew(s) => {
                span_ids.insert(s.callsite.name.to_string(), s.id);
            }
            Record::Device(_) => devices += 1,
            Record::DeviceMemory(_) => memory_samples += 1,
            Record::End(e) => end_ts = Some(e.ts),
            _ => {}
        }
    }
    let end_ts = end_ts.expect("a complete trace");
    assert!(devices >= 1, "the device is described");
    assert!(memory_samples >= 1, "device memory is sampled");
    for g in &mut gpu {
        if let Some((s, e)) = late.get(&g.id) {
            g.gpu_start = Some(*s);
            g.gpu_end = Some(*e);
        }
    }
    gpu.sort_by_key(|g| g.host_start);
    let got: Vec<(GpuOpKind, u64, Option<HostMemory>)> = gpu
        .iter()
        .map(|g| (g.kind, g.bytes, g.host_memory))
        .collect();
    use GpuOpKind::*;
    use HostMemory::*;
    let want = vec![
        (Alloc, 4000, None),
        (MemcpyHtoD, 4000, Some(Pageable)),
        (Alloc, 8192, None),
        (Memset, 8192, None),
        (MemcpyHtoD, 8192, Some(Pinned)),
        (Alloc, 4000, None),
        (Memset, 4000, None),
        (MemcpyDtoD, 4000, None),
        (Kernel, 0, None),
        (Alloc, 16, None),
        (Memset, 16, None),
        (Kernel, 0, None),
        (MemcpyDtoH, 4000, Some(Pageable)),
        (MemcpyDtoH, 8192, Some(Pinned)),
        (Synchronize, 0, None),
    ];
    assert_eq!(got, want);

    let copies = span_ids
        .get("copies")
        .copied()
        .expect("the span was recorded");
    let kernels: Vec<_> = gpu.iter().filter(|g| g.kind == Kernel).collect();
    let names: Vec<_> = kernels
        .iter()
        .map(|g| g.kernel.as_ref().expect("kernel info").name.to_string())
        .collect();
    assert_eq!(names, ["scale", "cublasSgemm"]);
    assert_eq!(kernels[0].kernel.as_ref().unwrap().block, [1024, 1, 1]);
    for g in &gpu {
        assert_eq!(
            g.span,
            Some(copies),
            "{:?} is parented to the span entered around it",
            g.kind
        );
        let loc = g.location.as_ref().expect("caller location");
        assert!(
            loc.file.ends_with("cuda_recorder.rs"),
            "{:?} located at {loc}",
            g.kind
        );
        assert!(
            g.host_start <= g.host_end && g.host_end <= end_ts,
            "{:?} host times",
            g.kind
        );
        match g.kind {
            MemcpyHtoD | MemcpyDtoH | MemcpyDtoD | Memset | Kernel => {
                let (Some(s), Some(e)) = (g.gpu_start, g.gpu_end) else {
                    panic!("{:?} at {} has no GPU times", g.kind, g.host_start);
                };
                assert!(s <= e, "{:?}: GPU start after end", g.kind);
                assert!(
                    e <= end_ts,
                    "{:?}: GPU end {e} after the end of the trace {end_ts}",
                    g.kind
                );
                assert!(
                    s + ALIGNMENT_SLACK_NS >= g.host_start,
                    "{:?}: GPU start {s} long before the host enqueued it at {}",
                    g.kind,
                    g.host_start
                );
            }
            Synchronize | Alloc | Free => assert_eq!((g.gpu_start, g.gpu_end), (None, None)),
        }
    }
    // The synchronize returned after everything before it finished on the GPU.
    let sync = gpu.iter().find(|g| g.kind == Synchronize).unwrap();
    for g in gpu.iter().filter(|g| g.gpu_end.is_some()) {
        assert!(
            g.gpu_end.unwrap() <= sync.host_end + ALIGNMENT_SLACK_NS,
            "{:?} ended after the sync returned",
            g.kind
        );
    }
    // Copies that move bytes: the recorded bytes are exactly the bytes moved.
    let moved: u64 = gpu
        .iter()
        .filter(|g| g.kind.is_copy())
        .map(|g| g.bytes)
        .sum();
    assert_eq!(moved, 4000 + 8192 + 4000 + 4000 + 8192);
}
