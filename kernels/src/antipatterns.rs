//! The performance mistakes of perfkit's rule catalog, each in a real code path that
//! the `train` binary turns on with a switch. Every function here is the natural way
//! to write the mistake with raw cudarc; the tuned path in [`crate::train`] is the fix.
//!
//! | switch | rule | what it does instead of the tuned path |
//! |---|---|---|
//! | `--readback-every-step` | PK101 | copies the step's loss to the host every step (a blocking D2H copy) |
//! | `--sync-every-step` | PK102 | synchronizes the stream at the end of every step |
//! | `--cpu-then-copy` | PK201 | builds zeroed activation buffers on the host and uploads them every step |
//! | `--alloc-every-step` | PK202 | allocates fresh activation buffers on the device every step (on the CPU: fresh activation and gradient buffers on the host) |
//! | `--per-sample-upload` | PK203 | uploads the batch one sample at a time, then stacks the rows on the device |
//! | `--pageable` | PK303 | uploads the batch straight from its pageable `Vec` instead of pinned memory |

use perfkit_profiler::cuda::ProfiledStream;

use crate::data::Batch;
use crate::gpu::{DeviceBatch, GpuError, Scratch};
use crate::task::MlpShape;

/// PK101: reads the loss of `step` back to the host (to print it), every step.
///
/// # Errors
/// Driver errors.
pub fn read_loss_every_step(
    stream: &ProfiledStream,
    gpu_losses: &cudarc::driver::CudaSlice<f32>,
    step: usize,
) -> Result<f32, GpuError> {
    let loss = stream.clone_dtoh(&gpu_losses.slice(step..step + 1))?;
    Ok(loss[0])
}

/// PK102: waits for the GPU to finish the step before starting the next one.
///
/// # Errors
/// Driver errors.
pub fn synchronize_every_step(stream: &ProfiledStream) -> Result<(), GpuError> {
    stream.synchronize()?;
    Ok(())
}

/// PK201: creates the step's activation buffers as zero-filled host vectors and
/// copies them to the device (`torch.zeros(shape).cuda()`), instead of allocating
/// them on the device once.
///
/// # Errors
/// Driver errors.
pub fn scratch_from_host_zeros(
    stream: &ProfiledStream,
    shape: &MlpShape,
    rows: usize,
) -> Result<Scratch, GpuError> {
    let hidden_zeros = vec![0.0f32; rows * shape.hidden];
    let class_zeros = vec![0.0f32; rows * shape.classes];
    Ok(Scratch {
        hidden: stream.clone_htod(&hidden_zeros)?,
        logits: stream.clone_htod(&class_zeros)?,
        probs: stream.clone_htod(&class_zeros)?,
        dlogits: stream.clone_htod(&class_zeros)?,
        dhidden: stream.clone_htod(&hidden_zeros)?,
    })
}

/// PK202: allocates the step's activation buffers on the device, every step.
///
/// # Errors
/// Driver errors.
pub fn alloc_scratch_every_step(
    stream: &ProfiledStream,
    shape: &MlpShape,
    rows: usize,
) -> Result<Scratch, GpuError> {
    Ok(Scratch {
        hidden: stream.alloc_zeros(rows * shape.hidden)?,
        logits: stream.alloc_zeros(rows * shape.classes)?,
        probs: stream.alloc_zeros(rows * shape.classes)?,
        dlogits: stream.alloc_zeros(rows * shape.classes)?,
        dhidden: stream.alloc_zeros(rows * shape.hidden)?,
    })
}

/// PK203: uploads every sample of the batch on its own, then stacks the rows into
/// the batch buffer on the device.
///
/// # Errors
/// Driver errors.
pub fn upload_per_sample(
    stream: &ProfiledStream,
    host: &Batch,
    device: &mut DeviceBatch,
) -> Result<(), GpuError> {
    let dim = host.x.len() / host.rows().max(1);
    let samples: Vec<_> = (0..host.rows())
        .map(|r| {
            Ok((
                stream.clone_htod(&host.x[r * dim..(r + 1) * dim])?,
                stream.clone_htod(&host.labels[r..r + 1])?,
            ))
        })
        .collect::<Result<_, GpuError>>()?;
    // Stack the uploaded samples into the batch.
    for (r, (x, label)) in samples.iter().enumerate() {
        stream.memcpy_dtod(x, &mut device.x.slice_mut(r * dim..(r + 1) * dim))?;
        stream.memcpy_dtod(label, &mut device.labels.slice_mut(r..r + 1))?;
    }
    Ok(())
}

/// PK303: uploads the batch straight from the loader's pageable `Vec`s.
///
/// # Errors
/// Driver errors.
pub fn upload_pageable(
    stream: &ProfiledStream,
    host: &Batch,
    device: &mut DeviceBatch,
) -> Result<(), GpuError> {
    stream.memcpy_htod(&host.x, &mut device.x)?;
    stream.memcpy_htod(&host.labels, &mut device.labels)?;
    Ok(())
}

/// PK202's CPU twin: allocates the model's activation and gradient buffers (about 5 MiB
/// for the default shape and batch) afresh every step, in an `alloc_buffers` span. A CPU pays
/// for it too: the allocator hands back memory that has to be zeroed (or faulted in) again.
pub fn alloc_host_buffers_every_step(model: &mut crate::cpu_model::CpuMlp) {
    let _span = tracing::info_span!("alloc_buffers").entered();
    model.reallocate_buffers();
}
