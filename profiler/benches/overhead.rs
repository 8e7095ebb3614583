//! Overhead of perfkit's tracing layer next to its peers, in one run of one harness.
//!
//! Run: `cargo bench -p perfkit-profiler --bench overhead` (add `-- --quick` for a short run,
//! `--only NAME` to measure one configuration, `--buffer SLOTS` to size perfkit's buffers,
//! `--no-throughput` to skip table 2).
//!
//! Table 1: nanoseconds per span (create + enter + exit + close, spans nested 3 deep, no fields)
//! for: no subscriber, the `tracing-subscriber` registry alone, `tracing-chrome`, `tracing-flame`
//! and perfkit's layer (each on the registry). The figure is the CPU time of the recording
//! thread (background writer threads run on other cores), so other processes on a busy machine
//! disturb it less than wall time; wall time is shown too. The configurations run interleaved,
//! round after round, and the median and best rounds are reported.
//!
//! Table 2: the writer's sustained throughput: 1, 2 and 4 threads record spans into a session
//! whose producers wait briefly instead of dropping; the writer's own CPU time per record gives
//! the rate one core sustains, and the file size gives the bytes per record.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tracing::Dispatch;
use tracing_subscriber::layer::SubscriberExt;

#[inline(never)]
fn nested3(iters: u64) {
    for _ in 0..iters {
        let a = tracing::info_span!("outer");
        let _a = a.enter();
        let b = tracing::info_span!("middle");
        let _b = b.enter();
        let c = tracing::info_span!("inner");
        let _c = c.enter();
        black_box(&c);
    }
}

struct Config {
    name: &'static str,
    dispatch: Dispatch,
    samples: Vec<f64>,
    wall: Vec<f64>,
}

/// CPU time of the calling thread in nanoseconds: unlike wall time it does not count the time
/// the thread was descheduled, so other processes on a busy machine disturb it much less.
fn thread_cpu_ns() -> u64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        }
    }
    0
}

/// (thread CPU ns per span, wall ns per span) of one round.
fn time_round(dispatch: &Dispatch, iters: u64) -> (f64, f64) {
    tracing::dispatcher::with_default(dispatch, || {
        let c = thread_cpu_ns();
        let t = Instant::now();
        nested3(iters);
        let wall = t.elapsed().as_nanos() as f64;
        let cpu = thread_cpu_ns().saturating_sub(c) as f64;
        let spans = (iters * 3) as f64;
        let cpu = if cpu > 0.0 { cpu } else { wall };
        (cpu / spans, wall / spans)
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only NAME`: measure one configuration (for profiling it with `perf`).
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let (rounds, iters) = if quick { (5, 20_000) } else { (31, 30_000) };
    let tmp = tempfile::tempdir().expect("temporary directory");

    let (chrome_layer, chrome_guard) = tracing_chrome::ChromeLayerBuilder::new()
        .file(tmp.path().join("chrome.json"))
        .include_args(true)
        .build();
    let (flame_layer, flame_guard) =
        tracing_flame::FlameLayer::with_file(tmp.path().join("flame.folded")).expect("flame file");
    // perfkit with its default settings (64 Ki slots per thread); `--buffer SLOTS` overrides the
    // buffer. The table says how many records were dropped: in these tight loops a writer
    // thread that does not get a core in time (a busy machine) makes the buffer overflow.
    let buffer = args
        .iter()
        .position(|a| a == "--buffer")
        .and_then(|i| args.get(i + 1))
        .and_then(|b| b.parse().ok())
        .unwrap_or(1 << 16);
    let (perf_layer, perf_guard) = perfkit_profiler::Builder::new()
        .output(tmp.path().join("perfkit.pktrace"))
        .buffer_size(buffer)
        .build_local()
        .expect("perfkit session")
        .expect("output set");

    let mut configs = vec![
        Config {
            name: "no subscriber",
            dispatch: Dispatch::none(),
            samples: Vec::new(),
            wall: Vec::new(),
        },
        Config {
            name: "registry alone",
            dispatch: Dispatch::new(tracing_subscriber::registry()),
            samples: Vec::new(),
            wall: Vec::new(),
        },
        Config {
            name: "tracing-chrome",
            dispatch: Dispatch::new(tracing_subscriber::registry().with(chrome_layer)),
            samples: Vec::new(),
            wall: Vec::new(),
        },
        Config {
            name: "tracing-flame",
            dispatch: Dispatch::new(tracing_subscriber::registry().with(flame_layer)),
            samples: Vec::new(),
            wall: Vec::new(),
        },
        Config {
            name: "perfkit",
            dispatch: Dispatch::new(tracing_subscriber::registry().with(perf_layer)),
            samples: Vec::new(),
            wall: Vec::new(),
        },
    ];
    if let Some(only) = &only {
        configs.retain(|c| c.name == only.as_str());
    }
    // Warm up every configuration (callsite registration, buffers, page faults).
    for c in &configs {
        time_round(&c.dispatch, iters / 10);
    }
    for _ in 0..rounds {
        for c in &mut configs {
            let (cpu, wall) = time_round(&c.dispatch, iters);
            c.samples.push(cpu);
            c.wall.push(wall);
            // Let the writer threads of the layers catch up between measurements.
            if c.name == "perfkit" {
                perf_guard.flush();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let perf_stats = perf_guard.finish();
    drop(chrome_guard);
    let _ = flame_guard;

    let meds: Vec<(&str, f64, f64, f64)> = configs
        .iter_mut()
        .map(|c| {
            let med = median(&mut c.samples);
            let min = c.samples.iter().copied().fold(f64::INFINITY, f64::min);
            let wall = median(&mut c.wall);
            (c.name, med, min, wall)
        })
        .collect();
    let get = |n: &str| meds.iter().find(|m| m.0 == n).map_or(f64::NAN, |m| m.1);
    let registry = get("registry alone");
    let chrome = get("tracing-chrome");
    let perfkit = get("perfkit");

    println!();
    println!(
        "span overhead: ns per span (create+enter+exit+close, nested 3 deep), thread CPU time, median of {rounds} rounds x {} spans",
        iters * 3
    );
    println!(
        "{:<16} {:>10} {:>10} {:>12} {:>14}",
        "subscriber", "median", "min", "wall median", "vs registry"
    );
    for (name, med, min, wall) in &meds {
        let extra = if *name == "no subscriber" {
            String::from("-")
        } else {
            format!("{:+.1} ns", med - registry)
        };
        println!("{name:<16} {med:>10.1} {min:>10.1} {wall:>12.1} {extra:>14}");
    }
    println!();
    println!(
        "perfkit - registry = {:.1} ns per span (target <= 80): {}",
        perfkit - registry,
        verdict(perfkit - registry <= 80.0)
    );
    println!(
        "tracing-chrome / perfkit = {:.2}x (target >= 2x): {}",
        chrome / perfkit,
        verdict(chrome / perfkit >= 2.0)
    );
    println!(
        "perfkit records dropped during the overhead rounds: {} of {} written",
        perf_stats.dropped, perf_stats.records
    );

    if args.iter().any(|a| a == "--no-throughput") {
        return;
    }
    println!();
    println!(
        "writer throughput: spans nested 3 deep from N threads into one session whose producers wait"
    );
    println!(
        "briefly instead of dropping (records = span new/enter/exit/close); capacity = records per"
    );
    println!(
        "second of writer CPU time (what one core sustains, independent of the producers' speed)"
    );
    println!(
        "{:<8} {:>10} {:>9} {:>12} {:>8} {:>13} {:>12} {:>13}",
        "threads",
        "records",
        "seconds",
        "records/s",
        "dropped",
        "writer ns/rec",
        "capacity/s",
        "bytes/record"
    );
    let spans_per_thread = if quick { 300_000 } else { 1_500_000 };
    let mut best = 0.0f64;
    for threads in [1usize, 2, 4] {
        let t = throughput(&tmp, threads, spans_per_thread);
        let per_rec = t.writer_cpu_ns as f64 / t.records.max(1) as f64;
        let capacity = if per_rec > 0.0 {
            1e9 / per_rec
        } else {
            f64::NAN
        };
        if t.dropped == 0 {
            best = best.max(capacity);
        }
        println!(
            "{threads:<8} {:>10} {:>9.3} {:>12} {:>8} {:>13.1} {:>12} {:>13.2}",
            t.records,
            t.secs,
            format!("{:.2}M", t.records as f64 / t.secs / 1e6),
            t.dropped,
            per_rec,
            format!("{:.1}M", capacity / 1e6),
            t.bytes as f64 / t.records.max(1) as f64
        );
    }
    println!(
        "sustained writer capacity without drops: {:.1}M records/s (target >= 5M): {}",
        best / 1e6,
        verdict(best >= 5e6)
    );

    // Reading it back: the streaming reader over the largest trace just written.
    let path = tmp.path().join("throughput-4.pktrace");
    let t = Instant::now();
    let mut reader = perfkit_profiler::TraceReader::open(&path).expect("trace");
    let mut n = 0u64;
    for rec in reader.by_ref() {
        black_box(rec.expect("valid trace"));
        n += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    println!();
    println!(
        "reader: {n} records in {secs:.3} s = {:.2}M records/s (streaming, one thread)",
        n as f64 / secs / 1e6
    );
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

struct Throughput {
    records: u64,
    secs: f64,
    dropped: u64,
    writer_cpu_ns: u64,
    bytes: u64,
}

/// Records `spans` spans (nested 3 deep) on each of `threads` threads into one session.
fn throughput(tmp: &tempfile::TempDir, threads: usize, spans: u64) -> Throughput {
    let path = tmp.path().join(format!("throughput-{threads}.pktrace"));
    let (layer, guard) = perfkit_profiler::Builder::new()
        .output(&path)
        .buffer_size(1 << 18)
        .wait_when_full(Duration::from_secs(5))
        .build_local()
        .expect("perfkit session")
        .expect("output set");
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(layer));
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let d = dispatch.clone();
            s.spawn(move || tracing::dispatcher::with_default(&d, || nested3(spans / 3)));
        }
    });
    let stats = guard.finish();
    let secs = t.elapsed().as_secs_f64();
    Throughput {
        records: stats.records,
        secs,
        dropped: stats.dropped,
        writer_cpu_ns: stats.writer_cpu_ns,
        bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
    }
}
