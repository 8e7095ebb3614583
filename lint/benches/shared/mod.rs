//! What both lint benchmarks share: the process's CPU clock.

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
