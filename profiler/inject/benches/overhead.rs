//! Cost of the injection library, in one run, as tables:
//!
//! 1. Host-side work per watched CUDA API call on the calling thread (what the CUPTI callbacks
//!    add to every copy, launch and synchronize): the same steps as the callbacks (timestamps,
//!    thread index, call table, host stack capture and interning), without CUPTI itself, so it
//!    runs anywhere. Ratio against the floor of two timestamps.
//! 2. On a machine with a CUDA GPU: the reference trainer's wall time bare and with injection
//!    (median of 5 runs each; skipped with the reason otherwise).
//!
//! `cargo bench -p perfkit-inject --bench overhead`

use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use perfkit_inject::join::{CallInfo, Joiner, PyFrames};
use perfkit_inject::locate::{self, SearchEnv};
use perfkit_inject::stack;

const CALLS: u32 = 200_000;

/// Calls `f` from `depth` frames down (a training loop is rarely called from main directly).
#[inline(never)]
fn at_depth(depth: u32, f: &mut dyn FnMut()) {
    if depth == 0 {
        f();
    } else {
        at_depth(depth - 1, f);
    }
    black_box(depth);
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some((_layer, guard)) = perfkit_profiler::Builder::new()
        .output(dir.path().join("bench.pktrace"))
        .build_local()
        .expect("trace session")
    else {
        panic!("no session");
    };
    let rec = guard.recorder().expect("recorder");
    let joiner = Mutex::new(Joiner::new());
    let mut ips = Vec::new();

    let mut rows: Vec<(String, f64)> = Vec::new();
    let mut measure = |name: &str, depth: Option<usize>| {
        let mut corr = 0u32;
        let mut body = || {
            let start = Instant::now();
            for _ in 0..CALLS {
                corr = corr.wrapping_add(1);
                let t0 = rec.now();
                if let Some(depth) = depth {
                    let thread = rec.current_thread();
                    let stack = if depth > 0 {
                        stack::capture(depth, &mut ips);
                        Some(rec.stack(&ips))
                    } else {
                        None
                    };
                    let info = CallInfo {
                        thread,
                        host_start: t0,
                        host_end: t0,
                        stack,
                        outer: None,
                        inner: None,
                        repeats: false,
                        py: PyFrames::NotRead,
                    };
                    joiner.lock().unwrap().call_enter(corr, info);
                }
                let t1 = rec.now();
                if depth.is_some() {
                    joiner.lock().unwrap().call_exit(corr, t1);
                }
                black_box((t0, t1));
            }
            rows.push((
                name.to_string(),
                start.elapsed().as_nanos() as f64 / f64::from(CALLS),
            ));
        };
        at_depth(24, &mut body);
    };
    measure("two timestamps (floor)", None);
    measure("call table, no stack", Some(0));
    measure("call table + stack, 8 frames", Some(8));
    measure("call table + stack, 32 frames", Some(32));
    let floor = rows[0].1;
    println!("host-side cost per watched CUDA call ({CALLS} calls, 24 frames below the caller)");
    println!("| what                            | ns/call | x floor |");
    println!("|---------------------------------|--------:|--------:|");
    for (name, ns) in &rows {
        println!("| {name:<31} | {ns:7.0} | {:7.1} |", ns / floor);
    }
    drop(guard);

    println!();
    match gpu_section() {
        Ok(()) => {}
        Err(why) => println!("GPU section skipped: {why}"),
    }
}

fn target_file(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps, deps.parent()?]
        .iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn gpu_section() -> Result<(), String> {
    // SAFETY: only tries to dlopen libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver".into());
    }
    let train = target_file("train")
        .ok_or("build the trainer: cargo build --release -p perfkit-kernels --bin train")?;
    let inject = target_file("libperfkit_inject.so").ok_or("libperfkit_inject.so not built")?;
    let report = locate::search(&SearchEnv::from_process());
    let cupti = report
        .found
        .clone()
        .ok_or_else(|| format!("libcupti not found:\n{}", report.looked_lines()))?;
    let run = |inject_on: bool| -> Result<f64, String> {
        let t = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut c = Command::new(&train);
        c.args(["--device", "cuda", "--steps", "300"])
            .env("PERFKIT_TRACE", t.path());
        if inject_on {
            c.env("CUDA_INJECTION64_PATH", &inject)
                .env("PERFKIT_CUPTI_PATH", &cupti);
        }
        let start = Instant::now();
        let out = c.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let median = |inject_on: bool| -> Result<f64, String> {
        let mut v = (0..5)
            .map(|_| run(inject_on))
            .collect::<Result<Vec<_>, _>>()?;
        v.sort_by(f64::total_cmp);
        Ok(v[2])
    };
    let bare = median(false)?;
    let inj = median(true)?;
    println!("reference trainer, 300 steps, median of 5 whole runs");
    println!("| run                  | seconds | ratio |");
    println!("|----------------------|--------:|------:|");
    println!("| trainer              | {bare:7.3} |  1.00 |");
    println!("| trainer + injection  | {inj:7.3} | {:5.2} |", inj / bare);
    Ok(())
}
