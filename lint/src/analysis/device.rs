//! Device recognition: which paths name a CPU device and which an accelerator.

use syn::{Expr, Path};

/// What device an expression or piece of code names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Statically the CPU (`Device::Cpu`, `kind::FLOAT_CPU`, burn `NdArrayDevice`, ...).
    Cpu,
    /// An accelerator (`Device::new_cuda(0)`, `Device::cuda_if_available(0)`, `kind::FLOAT_CUDA`, ...).
    Gpu,
    /// Not known statically (a binding, a parameter).
    Unknown,
}

/// Counts of CPU and accelerator device mentions in a piece of code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceEvidence {
    /// Mentions of CPU devices or CPU backends.
    pub cpu: u32,
    /// Mentions of accelerator devices or backends.
    pub gpu: u32,
}

impl DeviceEvidence {
    /// Adds one mention.
    pub fn add(&mut self, kind: DeviceKind) {
        match kind {
            DeviceKind::Cpu => self.cpu += 1,
            DeviceKind::Gpu => self.gpu += 1,
            DeviceKind::Unknown => {}
        }
    }
    /// Whether anything was mentioned.
    pub fn is_empty(&self) -> bool {
        self.cpu == 0 && self.gpu == 0
    }
    /// Only CPU devices are mentioned.
    pub fn is_cpu_only(&self) -> bool {
        self.cpu > 0 && self.gpu == 0
    }
    /// Sum of two tallies.
    pub fn merge(&mut self, other: DeviceEvidence) {
        self.cpu += other.cpu;
        self.gpu += other.gpu;
    }
}

/// What device a path names, looking at its last two segments.
pub fn device_of_path(path: &Path) -> DeviceKind {
    let Some(last) = path.segments.last() else {
        return DeviceKind::Unknown;
    };
    super::with_ident_str(&last.ident, |text| device_of_path_named(path, text))
}

/// [`device_of_path`] for a path whose last segment's text (no `r#`) is `text`.
pub(crate) fn device_of_path_named(path: &Path, text: &str) -> DeviceKind {
    let n = path.segments.len();
    let prev = (n >= 2).then(|| &path.segments[n - 2].ident);
    let prev_is = |name: &str| prev.is_some_and(|p| p == name);
    match text {
        // candle / tch `Device::Cpu`, burn `LibTorchDevice::Cpu`, `NdArrayDevice::Cpu`.
        "Cpu" => DeviceKind::Cpu,
        "NdArray" | "NdArrayDevice" | "Flex" | "FlexDevice" | "CpuDevice" => DeviceKind::Cpu,
        "Cuda" | "Metal" | "Wgpu" | "WgpuDevice" | "CudaDevice" | "CudaContext" | "CudaStream"
        | "MetalDevice" | "Vulkan" | "Rocm" | "HipDevice" | "CudaRuntime" => DeviceKind::Gpu,
        "new_cuda" | "cuda_if_available" | "new_metal" | "new_cuda_with_stream" => DeviceKind::Gpu,
        // tch `Device::cuda_if_available()`, burn's current `Device::cuda(0)`, `Device::wgpu(..)`.
        "cuda" | "wgpu" | "metal" | "vulkan" | "rocm" if prev_is("Device") => DeviceKind::Gpu,
        // burn's current `Device::cpu()`, `Device::flex()`, `Device::ndarray()`.
        "cpu" | "flex" | "ndarray" if prev_is("Device") => DeviceKind::Cpu,
        "Mps" if prev_is("Device") => DeviceKind::Gpu,
        // tch `kind::FLOAT_CPU`, or the constant imported (`use tch::kind::FLOAT_CPU;`).
        _ if text.ends_with("_CPU") && (prev_is("kind") || (n == 1 && is_constant(text))) => {
            DeviceKind::Cpu
        }
        _ if text.ends_with("_CUDA") && (prev_is("kind") || (n == 1 && is_constant(text))) => {
            DeviceKind::Gpu
        }
        _ => DeviceKind::Unknown,
    }
}

/// An upper-case constant name (`FLOAT_CPU`).
fn is_constant(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// What device an expression names: a device path, a reference to one, a tch options tuple
/// `(Kind::Float, Device::Cpu)`, or a call like `Device::new_cuda(0)?`.
pub fn device_of_expr(expr: &Expr) -> DeviceKind {
    match expr {
        Expr::Reference(r) => device_of_expr(&r.expr),
        Expr::Paren(p) => device_of_expr(&p.expr),
        Expr::Group(g) => device_of_expr(&g.expr),
        Expr::Try(t) => device_of_expr(&t.expr),
        Expr::Path(p) => device_of_path(&p.path),
        Expr::Call(c) => match &*c.func {
            Expr::Path(p) => device_of_path(&p.path),
            _ => DeviceKind::Unknown,
        },
        Expr::MethodCall(m) if m.method == "unwrap" || m.method == "expect" => {
            device_of_expr(&m.receiver)
        }
        Expr::Tuple(t) => t
            .elems
            .iter()
            .map(device_of_expr)
            .find(|k| *k != DeviceKind::Unknown)
            .unwrap_or(DeviceKind::Unknown),
        _ => DeviceKind::Unknown,
    }
}
