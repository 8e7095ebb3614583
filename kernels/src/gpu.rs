//! The MLP on a CUDA GPU: the kernels of `cuda/mlp.cu` (NVRTC) plus cuBLAS, every
//! operation issued through perfkit's [`ProfiledStream`].

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr,
    DevicePtrMut, LaunchConfig, PinnedHostSlice,
};
use perfkit_profiler::cuda::{CudaError, ProfiledStream};

use crate::data::Batch;
use crate::nvrtc::{self, BIAS_BWD_ROWS, NvrtcError, XENT_THREADS};
use crate::task::{MlpShape, SgdConfig, TaskSpec, param_seed, param_tag};

/// Why the GPU path failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A CUDA driver, cuBLAS or recorder error.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The kernels could not be compiled.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// The driver is older than the NVRTC that compiled the kernels, so it cannot load
    /// their PTX (only a device this crate has no CUBIN target for gets PTX). A GPU that
    /// exists but cannot run the kernels: an error, never a fallback to the CPU.
    #[error(
        "the CUDA driver (CUDA {}.{}) cannot load PTX from NVRTC {}.{}: use an NVRTC no newer than the driver \
         (`pip install 'nvidia-cuda-nvrtc==13.0.88'`) or update the NVIDIA driver",
        driver / 1000, driver % 1000 / 10, nvrtc / 1000, nvrtc % 1000 / 10
    )]
    PtxTooNew {
        /// `cuDriverGetVersion`.
        driver: i32,
        /// NVRTC's version, as `major * 1000 + minor * 10`.
        nvrtc: i32,
    },
    /// A size does not fit the kernels' 32-bit arguments.
    #[error("{what} = {value} is too large for the CUDA kernels (at most {max})")]
    TooLarge {
        /// The quantity.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The limit.
        max: usize,
    },
}

impl GpuError {
    /// Whether this means "no usable GPU here" (no driver, no device, no NVRTC), as
    /// opposed to a failure of a GPU that exists.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        match self {
            GpuError::Cuda(e) => e.is_unavailable(),
            GpuError::Nvrtc(NvrtcError::NotFound) => true,
            _ => false,
        }
    }
}

fn driver(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
    move |source| GpuError::Cuda(CudaError::Driver { op, source })
}

/// A module load or lookup failure, with a PTX the driver cannot read (NVRTC newer
/// than the driver) turned into [`GpuError::PtxTooNew`] wherever it surfaces.
fn module_error(op: &'static str, e: cudarc::driver::DriverError) -> GpuError {
    use cudarc::driver::sys::CUresult;
    match e.0 {
        CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => GpuError::PtxTooNew {
            driver: perfkit_profiler::cuda::driver_version().unwrap_or(0),
            nvrtc: nvrtc::version().unwrap_or(0),
        },
        _ => driver(op)(e),
    }
}

fn to_i32(what: &'static str, value: usize) -> Result<i32, GpuError> {
    i32::try_from(value).map_err(|_| GpuError::TooLarge {
        what,
        value,
        max: i32::MAX as usize,
    })
}

fn to_u32(what: &'static str, value: usize) -> Result<u32, GpuError> {
    u32::try_from(value).map_err(|_| GpuError::TooLarge {
        what,
        value,
        max: u32::MAX as usize,
    })
}

/// The compiled kernels of `cuda/mlp.cu`, loaded into one context.
#[derive(Debug)]
pub struct GpuKernels {
    fill_uniform: CudaFunction,
    synth_batch: CudaFunction,
    bias_act_fwd: CudaFunction,
    bias_act_bwd: CudaFunction,
    softmax_xent_fwd: CudaFunction,
    softmax_xent_bwd: CudaFunction,
    sgd_momentum: CudaFunction,
}

impl GpuKernels {
    /// Compiles (once per process and architecture) and loads the kernels for the
    /// device of `ctx`.
    ///
    /// # Errors
    /// [`GpuError::Nvrtc`] when NVRTC is missing or fails, [`GpuError::Cuda`] when the
    /// module cannot be loaded.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let arch = nvrtc::target(major, minor)?;
        let image = nvrtc::compile_mlp(arch)?;
        let module = ctx
            .load_module(image.module())
            .map_err(|e| module_error("cuModuleLoadData", e))?;
        // With lazy module loading (the default since CUDA 12.2) the driver may only
        // look at the image here.
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| module_error("cuModuleGetFunction", e))
        };
        Ok(Self {
            fill_uniform: f("fill_uniform")?,
            synth_batch: f("synth_batch")?,
            bias_act_fwd: f("bias_act_fwd")?,
            bias_act_bwd: f("bias_act_bwd")?,
            softmax_xent_fwd: f("softmax_xent_fwd")?,
            softmax_xent_bwd: f("softmax_xent_bwd")?,
            sgd_momentum: f("sgd_momentum")?,
        })
    }
}

fn grid_for(n: usize) -> Result<LaunchConfig, GpuError> {
    const THREADS: usize = 256;
    let blocks = n.div_ceil(THREADS).max(1);
    Ok(LaunchConfig {
        grid_dim: (to_u32("grid size", blocks)?, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Launchers of every kernel (and the cuBLAS product) on one profiled stream. Each
/// method computes what its CPU twin in [`crate::cpu`] computes.
#[derive(Debug)]
pub struct Ops<'a> {
    /// The stream everything is issued on.
    pub stream: &'a ProfiledStream,
    /// The kernels.
    pub kernels: &'a GpuKernels,
    /// cuBLAS bound to `stream`.
    pub blas: &'a CudaBlas,
}

impl Ops<'_> {
    /// `out[i] = lo + (hi - lo) * U(seed, tag, i)`.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn fill_uniform(
        &self,
        out: &mut CudaViewMut<'_, f32>,
        seed: u32,
        tag: u32,
        lo: f32,
        hi: f32,
    ) -> Result<(), GpuError> {
        let n = to_u32("elements", out.len())?;
        let cfg = grid_for(out.len())?;
        let mut b = self.stream.launch_builder(&self.kernels.fill_uniform);
        b.arg(out).arg(&n).arg(&seed).arg(&tag).arg(&lo).arg(&hi);
        // SAFETY: the arguments match `fill_uniform(float*, uint, uint, uint, float, float)`
        // and `n` is the length of `out`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Samples `first .. first + rows` of the task into `x` (`rows x dim`) and `labels`.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn synth_batch(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        labels: &mut CudaViewMut<'_, i32>,
        spec: &TaskSpec,
        first: u64,
    ) -> Result<(), GpuError> {
        let rows_n = labels.len();
        assert_eq!(
            x.len(),
            rows_n * spec.dim,
            "synth_batch: `x` must hold rows*dim elements"
        );
        let rows = to_i32("batch size", rows_n)?;
        let dim = to_i32("input features", spec.dim)?;
        let classes = to_i32("classes", spec.classes)?;
        let cfg = grid_for(x.len())?;
        let mut b = self.stream.launch_builder(&self.kernels.synth_batch);
        b.arg(x)
            .arg(labels)
            .arg(&spec.seed)
            .arg(&first)
            .arg(&rows)
            .arg(&dim)
            .arg(&classes)
            .arg(&spec.signal)
            .arg(&spec.noise_scale);
        // SAFETY: matches `synth_batch(float*, int*, uint, ulonglong, int, int, int, float, float)`;
        // `x` holds rows*dim elements and `labels` rows.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `z += bias` per row, then ReLU when `relu`; in place.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn bias_act_fwd(
        &self,
        z: &mut CudaViewMut<'_, f32>,
        bias: &CudaView<'_, f32>,
        rows: usize,
        cols: usize,
        relu: bool,
    ) -> Result<(), GpuError> {
        assert_eq!(
            z.len(),
            rows * cols,
            "bias_act_fwd: `z` must hold rows*cols elements"
        );
        assert_eq!(
            bias.len(),
            cols,
            "bias_act_fwd: `bias` must hold cols elements"
        );
        let (r, c, act) = (
            to_i32("rows", rows)?,
            to_i32("cols", cols)?,
            i32::from(relu),
        );
        let cfg = grid_for(z.len())?;
        let mut b = self.stream.launch_builder(&self.kernels.bias_act_fwd);
        b.arg(z).arg(bias).arg(&r).arg(&c).arg(&act);
        // SAFETY: matches `bias_act_fwd(float*, const float*, int, int, int)` with the
        // lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Masks `dz` where `h <= 0` (when `relu`) and writes its column sums into `db`.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn bias_act_bwd(
        &self,
        h: &CudaView<'_, f32>,
        dz: &mut CudaViewMut<'_, f32>,
        db: &mut CudaViewMut<'_, f32>,
        rows: usize,
        cols: usize,
        relu: bool,
    ) -> Result<(), GpuError> {
        assert_eq!(
            h.len(),
            rows * cols,
            "bias_act_bwd: `h` must hold rows*cols elements"
        );
        assert_eq!(
            dz.len(),
            rows * cols,
            "bias_act_bwd: `dz` must hold rows*cols elements"
        );
        assert_eq!(db.len(), cols, "bias_act_bwd: `db` must hold cols elements");
        let (r, c, act) = (
            to_i32("rows", rows)?,
            to_i32("cols", cols)?,
            i32::from(relu),
        );
        let cfg = LaunchConfig {
            grid_dim: (to_u32("grid size", cols.div_ceil(32).max(1))?, 1, 1),
            block_dim: (32, BIAS_BWD_ROWS, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.kernels.bias_act_bwd);
        b.arg(h).arg(dz).arg(db).arg(&r).arg(&c).arg(&act);
        // SAFETY: matches `bias_act_bwd(const float*, float*, float*, int, int, int)`,
        // launched with the block shape the kernel's shared memory is sized for.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Row softmax into `probs`; the mean cross-entropy is written into `loss[0]` on
    /// the device.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn softmax_xent_fwd(
        &self,
        logits: &CudaView<'_, f32>,
        labels: &CudaView<'_, i32>,
        probs: &mut CudaViewMut<'_, f32>,
        loss: &mut CudaViewMut<'_, f32>,
        cols: usize,
    ) -> Result<(), GpuError> {
        let rows = labels.len();
        assert_eq!(
            logits.len(),
            rows * cols,
            "softmax_xent_fwd: `logits` must hold rows*cols elements"
        );
        assert_eq!(
            probs.len(),
            rows * cols,
            "softmax_xent_fwd: `probs` must hold rows*cols elements"
        );
        assert!(
            !loss.is_empty(),
            "softmax_xent_fwd: `loss` must hold one element"
        );
        let (r, c) = (to_i32("rows", rows)?, to_i32("cols", cols)?);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (XENT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.kernels.softmax_xent_fwd);
        b.arg(logits)
            .arg(labels)
            .arg(probs)
            .arg(loss)
            .arg(&r)
            .arg(&c);
        // SAFETY: matches `softmax_xent_fwd(const float*, const int*, float*, float*, int, int)`,
        // one block of the thread count the kernel's shared memory is sized for.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `dlogits = (probs - onehot(labels)) / rows`.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn softmax_xent_bwd(
        &self,
        probs: &CudaView<'_, f32>,
        labels: &CudaView<'_, i32>,
        dlogits: &mut CudaViewMut<'_, f32>,
        cols: usize,
    ) -> Result<(), GpuError> {
        let rows = labels.len();
        assert_eq!(
            probs.len(),
            rows * cols,
            "softmax_xent_bwd: `probs` must hold rows*cols elements"
        );
        assert_eq!(
            dlogits.len(),
            rows * cols,
            "softmax_xent_bwd: `dlogits` must hold rows*cols elements"
        );
        let (r, c) = (to_i32("rows", rows)?, to_i32("cols", cols)?);
        let cfg = grid_for(dlogits.len())?;
        let mut b = self.stream.launch_builder(&self.kernels.softmax_xent_bwd);
        b.arg(probs).arg(labels).arg(dlogits).arg(&r).arg(&c);
        // SAFETY: matches `softmax_xent_bwd(const float*, const int*, float*, int, int)`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// SGD with momentum on one parameter tensor.
    ///
    /// # Errors
    /// Driver errors; sizes beyond 32 bits.
    pub fn sgd_momentum(
        &self,
        w: &mut CudaViewMut<'_, f32>,
        v: &mut CudaViewMut<'_, f32>,
        g: &CudaView<'_, f32>,
        sgd: &SgdConfig,
    ) -> Result<(), GpuError> {
        assert_eq!(
            w.len(),
            v.len(),
            "sgd_momentum: `w` and `v` must have the same length"
        );
        assert_eq!(
            w.len(),
            g.len(),
            "sgd_momentum: `w` and `g` must have the same length"
        );
        let n = to_u32("elements", w.len())?;
        let cfg = grid_for(w.len())?;
        let mut b = self.stream.launch_builder(&self.kernels.sgd_momentum);
        b.arg(w)
            .arg(v)
            .arg(g)
            .arg(&n)
            .arg(&sgd.lr)
            .arg(&sgd.momentum)
            .arg(&sgd.weight_decay);
        // SAFETY: matches `sgd_momentum(float*, float*, const float*, uint, float, float, float)`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Row-major `c = alpha * op(a) * op(b) + beta * c` through cuBLAS (same contract
    /// as [`crate::cpu::gemm`]).
    ///
    /// # Errors
    /// cuBLAS errors; sizes beyond 32 bits.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &A,
        b: &B,
        beta: f32,
        c: &mut C,
    ) -> Result<(), GpuError> {
        assert_eq!(a.len(), m * k, "gemm: `a` must hold m*k elements");
        assert_eq!(b.len(), k * n, "gemm: `b` must hold k*n elements");
        assert_eq!(c.len(), m * n, "gemm: `c` must hold m*n elements");
        // Row-major C (m x n) is column-major C^T (n x m) = op(B)^T op(A)^T: swap the
        // operands, and each row-major matrix read column-major is its transpose.
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let cfg = GemmConfig {
            transa: op(trans_b),
            transb: op(trans_a),
            m: to_i32("gemm n", n)?,
            n: to_i32("gemm m", m)?,
            k: to_i32("gemm k", k)?,
            alpha,
            lda: to_i32("gemm ld", if trans_b { k } else { n })?,
            ldb: to_i32("gemm ld", if trans_a { m } else { k })?,
            beta,
            ldc: to_i32("gemm ld", n)?,
        };
        // SAFETY: the dimensions and leading dimensions describe exactly the buffers,
        // whose lengths were checked above.
        unsafe { self.stream.gemm(self.blas, cfg, b, a, c) }?;
        Ok(())
    }
}

/// Activations and gradients of one step, `rows` samples.
#[derive(Debug)]
pub struct Scratch {
    /// Hidden activations (`rows x hidden`).
    pub hidden: CudaSlice<f32>,
    /// Logits (`rows x classes`).
    pub logits: CudaSlice<f32>,
    /// Softmax probabilities (`rows x classes`).
    pub probs: CudaSlice<f32>,
    /// Gradient of the logits (`rows x classes`).
    pub dlogits: CudaSlice<f32>,
    /// Gradient of the hidden layer (`rows x hidden`).
    pub dhidden: CudaSlice<f32>,
}

impl Scratch {
    /// Element counts of the buffers, in field order.
    #[must_use]
    pub fn lens(shape: &MlpShape, rows: usize) -> [usize; 5] {
        let h = rows * shape.hidden;
        let c = rows * shape.classes;
        [h, c, c, c, h]
    }

    /// Allocates the buffers once (the tuned path does this before the loop).
    ///
    /// # Errors
    /// Driver errors.
    pub fn alloc(stream: &ProfiledStream, shape: &MlpShape, rows: usize) -> Result<Self, GpuError> {
        let [h, c, p, d, dh] = Self::lens(shape, rows);
        Ok(Self {
            hidden: stream.alloc_zeros(h)?,
            logits: stream.alloc_zeros(c)?,
            probs: stream.alloc_zeros(p)?,
            dlogits: stream.alloc_zeros(d)?,
            dhidden: stream.alloc_zeros(dh)?,
        })
    }
}

/// The batch on the device.
#[derive(Debug)]
pub struct DeviceBatch {
    /// Features, `rows x input`.
    pub x: CudaSlice<f32>,
    /// Labels, `rows`.
    pub labels: CudaSlice<i32>,
}

/// Page-locked host buffers batches are staged through before their upload.
///
/// Each slot has its own event, recorded on the stream after the slot's uploads: the host
/// waits on it before writing the slot again, and before the buffers are freed (on drop,
/// error paths included). (cudarc's own per-buffer events are recorded only when a context
/// runs several streams; the trainer runs one, so freeing a buffer would not wait.)
#[derive(Debug)]
pub struct PinnedStaging {
    ctx: Arc<CudaContext>,
    x: [PinnedHostSlice<f32>; 2],
    labels: [PinnedHostSlice<i32>; 2],
    read: [CudaEvent; 2],
    guard: [SlotGuard; 2],
    next: usize,
}

/// What covers the uploads that may still be reading a staging slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotGuard {
    /// The slot's event was recorded after every upload from it (or none was enqueued).
    Event,
    /// An upload was enqueued and the event after it could not be recorded: only a
    /// synchronization of the whole context covers it.
    Context,
}

impl SlotGuard {
    /// The guard of a slot after an upload attempt: `enqueued` when some copy from it reached
    /// the stream, `recorded` when the slot's event was recorded after it.
    fn after_upload(enqueued: bool, recorded: bool) -> Self {
        if enqueued && !recorded {
            Self::Context
        } else {
            Self::Event
        }
    }
}

impl PinnedStaging {
    /// Two slots (double buffering) for batches of `rows x input`.
    ///
    /// # Errors
    /// Driver errors.
    pub fn new(ctx: &Arc<CudaContext>, rows: usize, input: usize) -> Result<Self, GpuError> {
        let pinned_f32 = || {
            // SAFETY: the buffers are filled before every upload that reads them.
            unsafe { ctx.alloc_pinned::<f32>(rows * input) }.map_err(driver("cuMemHostAlloc"))
        };
        let pinned_i32 = || {
            // SAFETY: as above.
            unsafe { ctx.alloc_pinned::<i32>(rows) }.map_err(driver("cuMemHostAlloc"))
        };
        // Without timing: these only order the host after the copies.
        let event = || ctx.new_event(None).map_err(driver("cuEventCreate"));
        Ok(Self {
            ctx: ctx.clone(),
            x: [pinned_f32()?, pinned_f32()?],
            labels: [pinned_i32()?, pinned_i32()?],
            read: [event()?, event()?],
            guard: [SlotGuard::Event; 2],
            next: 0,
        })
    }

    /// Waits on the host (unrecorded) until nothing reads `slot` any more.
    fn wait_slot(&self, slot: usize) -> Result<(), GpuError> {
        match self.guard[slot] {
            SlotGuard::Event => self.read[slot]
                .synchronize()
                .map_err(driver("cuEventSynchronize")),
            SlotGuard::Context => self.ctx.synchronize().map_err(driver("cuCtxSynchronize")),
        }
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        // The buffers are freed right after this (fields drop in order, and cudarc's own
        // events guard nothing here): an upload still reading them would read freed memory.
        // After a fault the waits fail and the work will never run; the error goes back to
        // cudarc, which reports it from the program's next call.
        for slot in 0..2 {
            if let Err(GpuError::Cuda(CudaError::Driver { source, .. })) = self.wait_slot(slot) {
                self.ctx.record_err::<()>(Err(source));
            }
        }
    }
}

impl Drop for GpuMlp {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used after.
        let blas = unsafe { ManuallyDrop::take(&mut self.blas) };
        self.stream.release_blas(blas);
    }
}

/// The MLP's parameters, optimizer state and workspace on one GPU.
#[derive(Debug)]
pub struct GpuMlp {
    /// The profiled stream every operation goes through.
    pub stream: ProfiledStream,
    /// Released through the stream in `Drop` (guarded against a sticky fault).
    blas: ManuallyDrop<CudaBlas>,
    kernels: GpuKernels,
    shape: MlpShape,
    sgd: SgdConfig,
    rows: usize,
    params: [CudaSlice<f32>; 4],
    velocity: [CudaSlice<f32>; 4],
    grads: [CudaSlice<f32>; 4],
    /// Activations and gradients (replaced every step by the anti-pattern paths).
    pub scratch: Scratch,
    /// The current batch on the device.
    pub batch: DeviceBatch,
    /// Pinned staging buffers of the tuned upload path.
    pub staging: PinnedStaging,
    /// The loss of every step, written by `softmax_xent_fwd` on the device.
    pub loss_log: CudaSlice<f32>,
}

impl GpuMlp {
    /// Compiles the kernels, creates a stream and initialises the parameters on the
    /// device (the same values as [`crate::cpu_model::init_params`]). `steps` sizes the
    /// on-device loss log.
    ///
    /// # Errors
    /// [`GpuError`].
    pub fn new(
        ctx: &Arc<CudaContext>,
        shape: MlpShape,
        sgd: SgdConfig,
        rows: usize,
        seed: u32,
        steps: usize,
    ) -> Result<Self, GpuError> {
        let kernels = GpuKernels::load(ctx)?;
        // The default stream: one stream, so cudarc does not add its cross-stream events.
        let stream = ProfiledStream::new(ctx.default_stream())?;
        let blas = stream.new_blas()?;
        let lens = shape.param_lens();
        let bounds = shape.init_bounds();
        let mut params = [
            stream.alloc_zeros::<f32>(lens[0])?,
            stream.alloc_zeros::<f32>(lens[1])?,
            stream.alloc_zeros::<f32>(lens[2])?,
            stream.alloc_zeros::<f32>(lens[3])?,
        ];
        {
            let ops = Ops {
                stream: &stream,
                kernels: &kernels,
                blas: &blas,
            };
            for (i, p) in params.iter_mut().enumerate() {
                ops.fill_uniform(
                    &mut p.as_view_mut(),
                    param_seed(seed),
                    param_tag(i),
                    -bounds[i],
                    bounds[i],
                )?;
            }
        }
        let velocity = [
            stream.alloc_zeros(lens[0])?,
            stream.alloc_zeros(lens[1])?,
            stream.alloc_zeros(lens[2])?,
            stream.alloc_zeros(lens[3])?,
        ];
        let grads = [
            stream.alloc_zeros(lens[0])?,
            stream.alloc_zeros(lens[1])?,
            stream.alloc_zeros(lens[2])?,
            stream.alloc_zeros(lens[3])?,
        ];
        let scratch = Scratch::alloc(&stream, &shape, rows)?;
        let batch = DeviceBatch {
            x: stream.alloc_zeros(rows * shape.input)?,
            labels: stream.alloc_zeros(rows)?,
        };
        let staging = PinnedStaging::new(ctx, rows, shape.input)?;
        let loss_log = stream.alloc_zeros(steps.max(1))?;
        Ok(Self {
            stream,
            blas: ManuallyDrop::new(blas),
            kernels,
            shape,
            sgd,
            rows,
            params,
            velocity,
            grads,
            scratch,
            batch,
            staging,
            loss_log,
        })
    }

    /// Launchers bound to this model's stream.
    #[must_use]
    pub fn ops(&self) -> Ops<'_> {
        Ops {
            stream: &self.stream,
            kernels: &self.kernels,
            blas: &self.blas,
        }
    }

    /// The model's shape.
    #[must_use]
    pub fn shape(&self) -> MlpShape {
        self.shape
    }

    /// Tuned upload: the batch is copied into a page-locked staging slot on the host,
    /// then uploaded from there asynchronously.
    ///
    /// # Errors
    /// Driver errors.
    pub fn upload_pinned(&mut self, host: &Batch) -> Result<(), GpuError> {
        let slot = self.staging.next;
        self.staging.next = (slot + 1) % 2;
        let pinned_x = &mut self.staging.x[slot];
        let pinned_labels = &mut self.staging.labels[slot];
        // Waits only for the uploads that last read this slot, two batches ago (an event
        // never recorded yet is complete).
        // Recorded: a host stall when the GPU is two batches behind.
        // A slot left uncovered by a failed upload (its event could not be recorded and the
        // stream could not be synchronized) is never rewritten: the context is broken.
        if let SlotGuard::Context = self.staging.guard[slot] {
            return Err(GpuError::Cuda(CudaError::Driver {
                op: "cuStreamSynchronize",
                source: cudarc::driver::DriverError(
                    cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_STATE,
                ),
            }));
        }
        self.stream.wait_event(&self.staging.read[slot])?;
        pinned_x
            .as_mut_slice()
            .map_err(driver("cuEventSynchronize"))?
            .copy_from_slice(&host.x);
        pinned_labels
            .as_mut_slice()
            .map_err(driver("cuEventSynchronize"))?
            .copy_from_slice(&host.labels);
        // The event is recorded after whatever copy was enqueued, even when the second one
        // failed, so that the slot is never written or freed under a copy in flight.
        let copied_x = self.stream.memcpy_htod(pinned_x, &mut self.batch.x);
        let enqueued = copied_x.is_ok();
        let copied = copied_x.and_then(|()| {
            self.stream
                .memcpy_htod(pinned_labels, &mut self.batch.labels)
        });
        let recorded = self.staging.read[slot]
            .record(self.stream.stream())
            .map_err(driver("cuEventRecord"));
        self.staging.guard[slot] = SlotGuard::after_upload(enqueued, recorded.is_ok());
        if let Err(error) = recorded {
            // No event covers the copy just enqueued: wait for the stream here, on this failure
            // path only, so the slot is never rewritten or freed under it.
            if self.staging.guard[slot] == SlotGuard::Context && self.stream.synchronize().is_ok() {
                self.staging.guard[slot] = SlotGuard::Event;
            }
            copied?;
            return Err(error);
        }
        copied?;
        Ok(())
    }

    /// Generates batch `index` directly on the device (no host data, no copy).
    ///
    /// # Errors
    /// Driver errors.
    pub fn generate_on_device(&mut self, spec: &TaskSpec, index: u64) -> Result<(), GpuError> {
        let first = index * self.rows as u64;
        let ops = Ops {
            stream: &self.stream,
            kernels: &self.kernels,
            blas: &self.blas,
        };
        ops.synth_batch(
            &mut self.batch.x.as_view_mut(),
            &mut self.batch.labels.as_view_mut(),
            spec,
            first,
        )
    }

    /// Forward pass; the mean loss goes to `loss_log[step]` on the device.
    ///
    /// # Errors
    /// Driver and cuBLAS errors.
    pub fn forward(&mut self, step: usize) -> Result<(), GpuError> {
        let MlpShape {
            input,
            hidden,
            classes,
        } = self.shape;
        let rows = self.rows;
        let ops = Ops {
            stream: &self.stream,
            kernels: &self.kernels,
            blas: &self.blas,
        };
        let s = &mut self.scratch;
        let [w1, b1, w2, b2] = &self.params;
        ops.gemm(
            false,
            false,
            rows,
            hidden,
            input,
            1.0,
            &self.batch.x,
            w1,
            0.0,
            &mut s.hidden,
        )?;
        ops.bias_act_fwd(
            &mut s.hidden.as_view_mut(),
            &b1.as_view(),
            rows,
            hidden,
            true,
        )?;
        ops.gemm(
            false,
            false,
            rows,
            classes,
            hidden,
            1.0,
            &s.hidden,
            w2,
            0.0,
            &mut s.logits,
        )?;
        ops.bias_act_fwd(
            &mut s.logits.as_view_mut(),
            &b2.as_view(),
            rows,
            classes,
            false,
        )?;
        let slot = step.min(self.loss_log.len() - 1);
        ops.softmax_xent_fwd(
            &s.logits.as_view(),
            &self.batch.labels.as_view(),
            &mut s.probs.as_view_mut(),
            &mut self.loss_log.slice_mut(slot..slot + 1),
            classes,
        )
    }

    /// Backward pass of the last forward pass; fills the gradients.
    ///
    /// # Errors
    /// Driver and cuBLAS errors.
    pub fn backward(&mut self) -> Result<(), GpuError> {
        let MlpShape {
            input,
            hidden,
            classes,
        } = self.shape;
        let rows = self.rows;
        let ops = Ops {
            stream: &self.stream,
            kernels: &self.kernels,
            blas: &self.blas,
        };
        let s = &mut self.scratch;
        let [dw1, db1, dw2, db2] = &mut self.grads;
        let w2 = &self.params[2];
        ops.softmax_xent_bwd(
            &s.probs.as_view(),
            &self.batch.labels.as_view(),
            &mut s.dlogits.as_view_mut(),
            classes,
        )?;
        ops.gemm(
            true, false, hidden, classes, rows, 1.0, &s.hidden, &s.dlogits, 0.0, dw2,
        )?;
        ops.bias_act_bwd(
            &s.logits.as_view(),
            &mut s.dlogits.as_view_mut(),
            &mut db2.as_view_mut(),
            rows,
            classes,
            false,
        )?;
        ops.gemm(
            false,
            true,
            rows,
            hidden,
            classes,
            1.0,
            &s.dlogits,
            w2,
            0.0,
            &mut s.dhidden,
        )?;
        ops.bias_act_bwd(
            &s.hidden.as_view(),
            &mut s.dhidden.as_view_mut(),
            &mut db1.as_view_mut(),
            rows,
            hidden,
            true,
        )?;
        ops.gemm(
            true,
            false,
            input,
            hidden,
            rows,
            1.0,
            &self.batch.x,
            &s.dhidden,
            0.0,
            dw1,
        )
    }

    /// One SGD-with-momentum update of every parameter (the optimizer step).
    ///
    /// # Errors
    /// Driver errors.
    pub fn step(&mut self) -> Result<(), GpuError> {
        let ops = Ops {
            stream: &self.stream,
            kernels: &self.kernels,
            blas: &self.blas,
        };
        for ((w, v), g) in self
            .params
            .iter_mut()
            .zip(self.velocity.iter_mut())
            .zip(self.grads.iter())
        {
            ops.sgd_momentum(
                &mut w.as_view_mut(),
                &mut v.as_view_mut(),
                &g.as_view(),
                &self.sgd,
            )?;
        }
        Ok(())
    }

    /// Reads the first `steps` losses of the on-device loss log back (after the loop).
    ///
    /// # Errors
    /// Driver errors.
    pub fn read_losses(&self, steps: usize) -> Result<Vec<f32>, GpuError> {
        let n = steps.min(self.loss_log.len());
        Ok(self.stream.clone_dtoh(&self.loss_log.slice(0..n))?)
    }
}

#[cfg(test)]
mod tests {
    use super::SlotGuard;

    #[test]
    fn a_slot_whose_upload_has_no_event_after_it_waits_for_the_context() {
        // The copies reached the stream and the event followed them.
        assert_eq!(SlotGuard::after_upload(true, true), SlotGuard::Event);
        // The event could not be recorded after an enqueued copy: it guards nothing.
        assert_eq!(SlotGuard::after_upload(true, false), SlotGuard::Context);
        // Nothing was enqueued: the event's last recording (already waited for) still holds.
        assert_eq!(SlotGuard::after_upload(false, false), SlotGuard::Event);
        assert_eq!(SlotGuard::after_upload(false, true), SlotGuard::Event);
    }
}
