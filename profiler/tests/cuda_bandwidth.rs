//! Large pinned and pageable uploads are recorded as such, with GPU times. Run with
//! `cargo test -p perfkit-profiler --test cuda_bandwidth -- --ignored` on a GPU machine;
//! without one it fails. Which is faster is a measurement, not a test: `train --bench`
//! prints the pinned and pageable bandwidth side by side.

#![cfg(feature = "cuda")]

use perfkit_profiler::cuda::{self, ProfiledStream};
use perfkit_profiler::model::{GpuOpKind, HostMemory, Record};
use perfkit_profiler::{Builder, TraceReader};

const BYTES: usize = 64 << 20;

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_and_pageable_uploads_are_recorded_with_their_gpu_times() {
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
    let mut seen = [0usize; 2];
    for g in copies {
        let (start, end) = match (g.gpu_start, g.gpu_end) {
            (Some(s), Some(e)) => (s, e),
            _ => *late.get(&g.id).expect("GPU times"),
        };
        assert!(end > start, "a 64 MiB copy takes GPU time: {g:?}");
        let slot = match g.host_memory {
            Some(HostMemory::Pageable) => 0,
            Some(HostMemory::Pinned) => 1,
            other => panic!("host memory {other:?} for {g:?}"),
        };
        seen[slot] += 1;
        eprintln!(
            "H2D {:?} {:.1} GB/s",
            g.host_memory.unwrap(),
            g.bytes as f64 / (end - start) as f64
        );
    }
    // Five uploads from each kind of host memory, told apart.
    assert_eq!(seen, [5, 5]);
}
