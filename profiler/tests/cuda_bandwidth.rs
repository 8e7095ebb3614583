//! Pinned host memory uploads faster than pageable memory, as measured by the CUDA
//! recorder itself. Run with `cargo test -p perfkit-profiler --test cuda_bandwidth --
//! --ignored` on a GPU machine; without one it fails.

#![cfg(feature = "cuda")]

use perfkit_profiler::cuda::{self, ProfiledStream};
use perfkit_profiler::model::{GpuOpKind, HostMemory, Record};
use perfkit_profiler::{Builder, TraceReader};

const BYTES: usize = 64 << 20;

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_uploads_are_faster_than_pageable_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bw.pktrace");
    let guard = Builder::new()
        .output(&path)
        .try_init()
        .expect("recording starts");
    let ctx = cuda::open_device(0).expect("this test needs a CUDA GPU");
    let stream = ProfiledStream::new_on(&ctx).unwrap();
    let n = BYTES / 4;
    let pageable = vec![1.0f32; n];
    // SAFETY: filled right below.
    let mut pinned = unsafe { ctx.alloc_pinned::<f32>(n) }.unwrap();
    pinned.as_mut_slice().unwrap().fill(1.0);
    let mut dev = stream.alloc_zeros::<f32>(n).unwrap();
    for _ in 0..5 {
        stream.memcpy_htod(&pageable, &mut dev).unwrap();
        stream.memcpy_htod(&pinned, &mut dev).unwrap();
    }
    stream.synchronize().unwrap();
    drop(stream);
    guard.finish();

    let mut best = [0.0f64; 2];
    let mut reader = TraceReader::open(&path).unwrap();
    let mut late = std::collections::HashMap::new();
    let mut copies = Vec::new();
    for record in reader.by_ref() {
        match record.unwrap() {
            Record::Gpu(g) if g.kind == GpuOpKind::MemcpyHtoD && g.bytes == BYTES as u64 => {
                copies.push(g)
            }
            Record::GpuTiming(t) => {
                late.insert(t.id, (t.gpu_start, t.gpu_end));
            }
            _ => {}
        }
    }
    assert_eq!(copies.len(), 10);
    for g in copies {
        let (s, e) = match (g.gpu_start, g.gpu_end) {
            (Some(s), Some(e)) => (s, e),
            _ => *late.get(&g.id).expect("GPU times"),
        };
        let gbps = g.bytes as f64 / (e - s).max(1) as f64;
        let slot = usize::from(g.host_memory == Some(HostMemory::Pinned));
        best[slot] = best[slot].max(gbps);
    }
    eprintln!(
        "H2D pageable {:.1} GB/s, pinned {:.1} GB/s",
        best[0], best[1]
    );
    assert!(
        best[1] > best[0],
        "pinned {:.1} GB/s is not above pageable {:.1} GB/s",
        best[1],
        best[0]
    );
}
