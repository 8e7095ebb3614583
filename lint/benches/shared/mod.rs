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
