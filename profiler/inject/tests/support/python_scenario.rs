//! The Python scenario shared by the injection tests and the `perfkit profile` tests: the
//! stand-in CUDA driver and CUPTI built with `cc`, the activity records of `python_step.py`'s
//! calls laid out as CUPTI lays them out (the bindings' own structs), and the script's lines.

use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudarc::cupti::sys;

/// Steps `python_step.py` plays.
pub const STEPS: u32 = 4;
/// Correlation id of the copy issued from the script's second thread.
const THREAD_COPY: u32 = 9000;
/// CUPTI clock when the records are delivered (the stand-in's timestamp).
const NOW: u64 = 1_000_000_000;

fn support() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(super::SUPPORT)
}

/// The script.
pub fn script() -> PathBuf {
    support().join("python_step.py")
}

/// The optimizer module the script imports.
pub fn optimizer_module() -> PathBuf {
    support().join("optim/sgd.py")
}

/// The 1-based line of the script (or of the optimizer module, for `update`) marked
/// `# site: NAME`.
pub fn site(name: &str) -> u32 {
    let file = if name == "update" {
        optimizer_module()
    } else {
        script()
    };
    let text = std::fs::read_to_string(file).expect("python_step.py");
    let marker = format!("# site: {name}");
    text.lines()
        .position(|l| l.trim_end().ends_with(&marker))
        .unwrap_or_else(|| panic!("no `{marker}` in python_step.py")) as u32
        + 1
}

fn cc(src: &str, soname: &str, dir: &Path) -> PathBuf {
    let out = dir.join(soname);
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1"])
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(&out)
        .arg(support().join(src))
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc) to build the stand-in libraries");
    assert!(status.success(), "cc {src}");
    out
}

/// Builds the stand-in libcuda.so.1 and libcupti.so.13 into `dir`; returns the libcupti.
pub fn build_fakes(dir: &Path) -> PathBuf {
    cc("fake_cuda.c", "libcuda.so.1", dir);
    cc("fake_cupti.c", "libcupti.so.13", dir)
}

fn zeroed<T>() -> T {
    // SAFETY: CUPTI record structs: integers, pointers, unions and enums with a 0 variant.
    unsafe { std::mem::zeroed() }
}

/// Records laid out as in a CUPTI buffer, with their offsets.
#[derive(Default)]
struct Records {
    bytes: Vec<u8>,
    offsets: Vec<u64>,
}

impl Records {
    fn push<T: Copy>(&mut self, rec: &T) {
        let at = self.bytes.len().next_multiple_of(8);
        self.bytes.resize(at + size_of::<T>(), 0);
        // SAFETY: in bounds (resized above); T is a plain C struct.
        unsafe {
            std::ptr::write_unaligned(self.bytes.as_mut_ptr().add(at) as *mut T, *rec);
        }
        self.offsets.push(at as u64);
    }
}

fn copy(
    kind: sys::CUpti_ActivityMemcpyKind,
    bytes: u64,
    correlation: u32,
    start: u64,
) -> sys::CUpti_ActivityMemcpy6 {
    let mut m: sys::CUpti_ActivityMemcpy6 = zeroed();
    m.kind = sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY;
    m.copyKind = kind as u8;
    let (src, dst) = if kind == sys::CUpti_ActivityMemcpyKind::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD {
        (
            sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
            sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
        )
    } else {
        (
            sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_DEVICE,
            sys::CUpti_ActivityMemoryKind::CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
        )
    };
    m.srcKind = src as u8;
    m.dstKind = dst as u8;
    m.bytes = bytes;
    m.start = start;
    m.end = start + 20_000;
    m.streamId = 7;
    m.correlationId = correlation;
    m
}

/// The activity records of the script's calls, in the file layout the script reads: `u64`
/// count, that many `u64` offsets, then the records. The kernel records carry no name (a name
/// is a pointer into the memory of the process CUPTI runs in, which is not this one).
pub fn records_file() -> Vec<u8> {
    use sys::CUpti_ActivityKind as K;
    use sys::CUpti_ActivityMemcpyKind as C;
    let mut r = Records::default();
    for step in 0..STEPS {
        let base = 100 * (step + 1);
        // Within the last 5 ms before the delivery (the script sleeps 10 ms before it, so these
        // times are after the trace began).
        let t = NOW - 5_000_000 + u64::from(step) * 1_000_000;
        r.push(&copy(
            C::CUPTI_ACTIVITY_MEMCPY_KIND_HTOD,
            1 << 20,
            base + 1,
            t,
        ));
        for (c, at) in [(base + 2, 100_000), (base + 6, 200_000)] {
            let mut k: sys::CUpti_ActivityKernel10 = zeroed();
            k.kind = K::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
            k.start = t + at;
            k.end = t + at + 90_000;
            k.streamId = 7;
            k.gridX = 8;
            k.gridY = 1;
            k.gridZ = 1;
            k.blockX = 128;
            k.blockY = 1;
            k.blockZ = 1;
            k.correlationId = c;
            r.push(&k);
        }
        r.push(&copy(
            C::CUPTI_ACTIVITY_MEMCPY_KIND_DTOH,
            4,
            base + 3,
            t + 300_000,
        ));
        for (c, at) in [(base + 4, 400_000), (base + 5, 500_000)] {
            let mut s: sys::CUpti_ActivitySynchronization2 = zeroed();
            s.kind = K::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
            s.type_ = sys::CUpti_ActivitySynchronizationType::CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
            s.start = t + at;
            s.end = t + at + 50_000;
            s.correlationId = c;
            s.streamId = 7;
            r.push(&s);
        }
    }
    r.push(&copy(
        C::CUPTI_ACTIVITY_MEMCPY_KIND_DTOH,
        4,
        THREAD_COPY,
        NOW - 1_000_000,
    ));
    let mut out = Vec::new();
    out.extend_from_slice(&(r.offsets.len() as u64).to_le_bytes());
    for o in &r.offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    out.extend_from_slice(&r.bytes);
    out
}
