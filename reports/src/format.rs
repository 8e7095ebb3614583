//! Human formatting of durations, sizes and rates.

/// `1.23 s`, `12.3 ms`, `4.56 us`, `789 ns`.
pub fn duration(ns: u64) -> String {
    let v = ns as f64;
    if ns >= 1_000_000_000 {
        format!("{:.3} s", v / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3} ms", v / 1e6)
    } else if ns >= 1_000 {
        format!("{:.2} us", v / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// Signed duration: `+1.2 ms`, `-3.4 us`.
pub fn signed_duration(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    format!(
        "{sign}{}",
        duration(ns.unsigned_abs().min(u128::from(u64::MAX)) as u64)
    )
}

/// `1.5 GiB`, `12.0 MiB`, `3.0 KiB`, `17 B` (the terminal summary's format).
pub use perfkit_profiler::summary::format_bytes as bytes;

/// A bandwidth given in GB/s, in the unit that fits: `12.00 GB/s`, `3.40 MB/s`, `20.00 KB/s`.
pub fn rate_gbps(gbps: f64) -> String {
    if gbps >= 1.0 {
        format!("{gbps:.2} GB/s")
    } else if gbps >= 1e-3 {
        format!("{:.2} MB/s", gbps * 1e3)
    } else {
        format!("{:.2} KB/s", gbps * 1e6)
    }
}

/// `12.3 %` of a share in 0..1.
pub fn percent(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

/// `+12.3 %` of a relative change.
pub fn signed_percent(change: f64) -> String {
    format!("{:+.1} %", change * 100.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats() {
        assert_eq!(super::duration(1_500_000_000), "1.500 s");
        assert_eq!(super::duration(2_500_000), "2.500 ms");
        assert_eq!(super::duration(2_500), "2.50 us");
        assert_eq!(super::duration(25), "25 ns");
        assert_eq!(super::signed_duration(-2_500), "-2.50 us");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30), "3.0 GiB");
        assert_eq!(super::percent(0.1234), "12.3 %");
        assert_eq!(super::signed_percent(-0.05), "-5.0 %");
        assert_eq!(super::rate_gbps(24.0), "24.00 GB/s");
        assert_eq!(super::rate_gbps(0.0034), "3.40 MB/s");
        assert_eq!(super::rate_gbps(0.00002), "20.00 KB/s");
    }
}
