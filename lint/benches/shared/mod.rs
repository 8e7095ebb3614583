//! What both lint benchmarks share: the process's CPU clock, the pass that keeps each group's
//! trees, and the table of the lint's stages (`--stages`).

use std::time::Duration;

/// CPU time (user + system) of this process so far, all threads counted, those that have ended
/// too (the worker pools of earlier passes): `CLOCK_PROCESS_CPUTIME_ID`, in nanoseconds. The
/// `/proc/self/stat` counters it replaces tick at 100 per second, which left a ratio of two
/// passes of under a second each uncertain by 3 %. `None` where the clock cannot be read.
pub fn process_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer, which is valid for it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    ))
}

/// Parses the files of each crate or package of `plan` (the groups the lint forms, see
/// `perfkit_lint::lint_plan`) and keeps every file's tree until its whole group is parsed, then
/// drops the group's trees together: what the lint cannot avoid as long as its rules read a
/// crate's trees after the crate-wide analysis. Groups are taken largest first from one queue by
/// the pool's threads, as the lint takes them; `after_group` runs on the thread once a group's
/// trees are dropped. Returns the files that could not be read or parsed.
pub fn retain_pass<T>(
    pool: &rayon::ThreadPool,
    plan: &[perfkit_lint::PlannedJob],
    parse: &(dyn Fn(&std::path::Path) -> Option<T> + Sync),
    after_group: &(dyn Fn() + Sync),
) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    pool.scope(|scope| {
        for _ in 0..pool.current_num_threads() {
            scope.spawn(|_| {
                while let Some(job) = plan.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let mut kept = Vec::with_capacity(job.files.len());
                    for file in &job.files {
                        match parse(file) {
                            Some(tree) => kept.push(tree),
                            None => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    drop(kept);
                    after_group();
                }
            });
        }
    });
    failed.into_inner()
}

/// The best wall and CPU times of one pass over the runs.
#[derive(Clone, Copy, Debug)]
pub struct Best {
    pub wall: Duration,
    pub cpu: Duration,
}

impl Default for Best {
    fn default() -> Best {
        Best {
            wall: Duration::MAX,
            cpu: Duration::MAX,
        }
    }
}

impl Best {
    /// Times `f` (wall and CPU time, all threads) and keeps the better of each.
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let cpu_start = process_cpu_time().unwrap_or_default();
        let start = std::time::Instant::now();
        let value = f();
        self.wall = self.wall.min(start.elapsed());
        self.cpu = self.cpu.min(
            process_cpu_time()
                .unwrap_or_default()
                .saturating_sub(cpu_start),
        );
        value
    }
}

/// One pass's ratio to the floor in every round, the two timed one after the other so that both
/// see the same machine. On a shared machine whose load comes and goes, the ratio of the two best
/// runs compares runs that saw different loads; the median of the rounds' own ratios does not,
/// and an outlier round moves it little. Both are printed.
#[derive(Clone, Debug, Default)]
pub struct Rounds {
    cpu: Vec<f64>,
    wall: Vec<f64>,
}

impl Rounds {
    /// Records one round: the pass's wall and CPU times, and the floor's of the same round.
    pub fn push(
        &mut self,
        floor_wall: Duration,
        floor_cpu: Duration,
        wall: Duration,
        cpu: Duration,
    ) {
        self.cpu.push(ratio(cpu, floor_cpu));
        self.wall.push(ratio(wall, floor_wall));
    }

    /// `median (lowest to highest)` of the CPU-time ratios, then of the wall-time ratios.
    pub fn text(&self) -> String {
        format!(
            "{} in CPU time, {} in wall time ({} rounds)",
            spread(&self.cpu),
            spread(&self.wall),
            self.cpu.len()
        )
    }
}

/// `t` over `of` (a pass's time over the floor's).
fn ratio(t: Duration, of: Duration) -> f64 {
    t.as_secs_f64() / of.as_secs_f64().max(1e-9)
}

/// `median (lowest to highest)`; `-` when there is nothing.
fn spread(values: &[f64]) -> String {
    if values.is_empty() {
        return "-".to_string();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    format!("{median:.2} ({:.2} to {:.2})", sorted[0], sorted[n - 1])
}

/// The lint cut after each stage (`LintOptions::stop_after`): what the stages cost, each measured
/// as the whole lint up to its end.
pub const STAGES: [(Option<perfkit_lint::Stage>, &str); 4] = [
    (
        Some(perfkit_lint::Stage::Parse),
        "walk, read and parse, each group's trees kept",
    ),
    (Some(perfkit_lint::Stage::Facts), "+ each file's facts"),
    (
        Some(perfkit_lint::Stage::Analysis),
        "+ the crate- or package-wide analysis",
    ),
    (None, "+ the rules (the whole lint)"),
];

/// Prints where the lint's time goes: each stage's cumulative time against the floor's, and what
/// it adds to the stage before it.
pub fn print_stages(floor: Best, plan: Best, stages: &[Best; 4]) {
    println!();
    println!(
        "where the lint's time goes (each row: the lint ended after that stage, best of the runs):"
    );
    println!();
    println!(
        "| stage | CPU s | ratio (CPU) | added (CPU) | wall s | ratio (wall) | added (wall) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| floor: read and parse, each tree dropped at once | {:.3} | 1.00 | - | {:.3} | 1.00 | - |",
        floor.cpu.as_secs_f64(),
        floor.wall.as_secs_f64()
    );
    println!(
        "| the walk and the grouping alone (`lint_plan`) | {:.3} | {:.3} | - | {:.3} | {:.3} | - |",
        plan.cpu.as_secs_f64(),
        ratio(plan.cpu, floor.cpu),
        plan.wall.as_secs_f64(),
        ratio(plan.wall, floor.wall)
    );
    let (mut cpu_before, mut wall_before) = (None, None);
    for ((_, name), best) in STAGES.iter().zip(stages) {
        let (cpu, wall) = (ratio(best.cpu, floor.cpu), ratio(best.wall, floor.wall));
        let added = |now: f64, before: Option<f64>| {
            before.map_or_else(|| "-".to_string(), |b: f64| format!("{:+.3}", now - b))
        };
        println!(
            "| {name} | {:.3} | {cpu:.3} | {} | {:.3} | {wall:.3} | {} |",
            best.cpu.as_secs_f64(),
            added(cpu, cpu_before),
            best.wall.as_secs_f64(),
            added(wall, wall_before)
        );
        (cpu_before, wall_before) = (Some(cpu), Some(wall));
    }
}
