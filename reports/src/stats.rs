//! Small statistics: percentiles of durations and unions of time intervals.

use perfkit_profiler::summary::StepStats;
use serde::{Deserialize, Serialize};

/// Distribution of a set of durations (nanoseconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Arithmetic mean.
    pub mean_ns: u64,
    /// Median (for an even count the mean of the two middle samples, rounded half up).
    pub median_ns: u64,
    /// 95th percentile (nearest rank).
    pub p95_ns: u64,
    /// Shortest sample.
    pub min_ns: u64,
    /// Longest sample.
    pub max_ns: u64,
    /// Standard deviation (population).
    pub stddev_ns: u64,
    /// Median absolute deviation from the median, scaled by 1.4826 (a robust
    /// estimate of the standard deviation that ignores outliers such as warm-up steps).
    pub mad_ns: u64,
}

impl Distribution {
    /// Computes the distribution of `samples` (any order): the profiler's step statistics
    /// (the terminal summary's figures), plus the MAD.
    pub fn of(samples: &[u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut sorted = samples.to_vec();
        let s = StepStats::from_durations("", &mut sorted);
        let median = s.median_ns.unwrap_or(0);
        let mut deviations: Vec<u64> = sorted.iter().map(|&v| v.abs_diff(median)).collect();
        deviations.sort_unstable();
        let mad = median_sorted(&deviations) as f64 * 1.4826;
        Self {
            count: s.count,
            mean_ns: s.mean_ns.unwrap_or(0),
            median_ns: median,
            p95_ns: s.p95_ns.unwrap_or(0),
            min_ns: s.min_ns.unwrap_or(0),
            max_ns: s.max_ns.unwrap_or(0),
            stddev_ns: s.stddev_ns.unwrap_or(0),
            mad_ns: mad.round() as u64,
        }
    }

    /// Standard error of the median (1.2533 x robust sigma / sqrt(n)), in nanoseconds.
    pub fn median_standard_error_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let sigma = if self.mad_ns > 0 {
            self.mad_ns
        } else {
            self.stddev_ns
        };
        1.2533 * sigma as f64 / (self.count as f64).sqrt()
    }
}

/// Median of an ascending slice: the middle sample, or for an even count the mean of the two
/// middle samples rounded half up (0 for an empty slice).
pub fn median_sorted(sorted: &[u64]) -> u64 {
    let n = sorted.len();
    if n == 0 {
        return 0;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        let sum = u128::from(sorted[n / 2 - 1]) + u128::from(sorted[n / 2]);
        u64::try_from(sum.div_ceil(2)).unwrap_or(u64::MAX)
    }
}

/// A union of half-open time intervals, sorted and disjoint, with prefix sums so that
/// the covered length inside any window is answered in `O(log n)`.
#[derive(Debug, Clone, Default)]
pub struct IntervalUnion {
    starts: Vec<u64>,
    ends: Vec<u64>,
    /// `prefix[i]` = total length of intervals `0..i`.
    prefix: Vec<u64>,
}

impl IntervalUnion {
    /// Builds the union of `intervals` (`(start, end)`, any order; empty ones ignored).
    pub fn build(mut intervals: Vec<(u64, u64)>) -> Self {
        intervals.retain(|&(s, e)| e > s);
        intervals.sort_unstable();
        let mut starts = Vec::new();
        let mut ends: Vec<u64> = Vec::new();
        for (s, e) in intervals {
            match ends.last_mut() {
                Some(last) if s <= *last => *last = (*last).max(e),
                _ => {
                    starts.push(s);
                    ends.push(e);
                }
            }
        }
        let mut prefix = Vec::with_capacity(starts.len() + 1);
        let mut acc = 0u64;
        prefix.push(0);
        for (s, e) in starts.iter().zip(&ends) {
            acc += e - s;
            prefix.push(acc);
        }
        Self {
            starts,
            ends,
            prefix,
        }
    }

    /// Union of two unions.
    pub fn merge(&self, other: &IntervalUnion) -> IntervalUnion {
        let mut all: Vec<(u64, u64)> = self.iter().collect();
        all.extend(other.iter());
        Self::build(all)
    }

    /// The disjoint intervals, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.starts.iter().copied().zip(self.ends.iter().copied())
    }

    /// Number of disjoint intervals.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True when the union covers nothing.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Total covered length.
    pub fn total(&self) -> u64 {
        self.prefix.last().copied().unwrap_or(0)
    }

    /// Covered length inside `[a, b)`.
    pub fn covered(&self, a: u64, b: u64) -> u64 {
        if b <= a || self.starts.is_empty() {
            return 0;
        }
        self.covered_before(b) - self.covered_before(a)
    }

    /// Covered length inside `(-inf, t)`.
    fn covered_before(&self, t: u64) -> u64 {
        // Index of the first interval starting at or after t.
        let i = self.starts.partition_point(|&s| s < t);
        if i == 0 {
            return 0;
        }
        let last = i - 1;
        self.prefix[last] + (self.ends[last].min(t) - self.starts[last])
    }

    /// The gaps (uncovered stretches) inside `[a, b)`, ascending.
    pub fn gaps(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cursor = a;
        let first = self.ends.partition_point(|&e| e <= a);
        for i in first..self.starts.len() {
            let (s, e) = (self.starts[i], self.ends[i]);
            if s >= b {
                break;
            }
            if s > cursor {
                out.push((cursor, s.min(b)));
            }
            cursor = cursor.max(e);
        }
        if cursor < b {
            out.push((cursor, b));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_of_known_samples() {
        let d = Distribution::of(&[10, 20, 30, 40, 100]);
        assert_eq!(d.count, 5);
        assert_eq!(d.mean_ns, 40);
        assert_eq!(d.median_ns, 30);
        assert_eq!(d.p95_ns, 100);
        assert_eq!(d.min_ns, 10);
        assert_eq!(d.max_ns, 100);
        // deviations from 30: 20,10,0,10,70 -> median 10 -> 14.826
        assert_eq!(d.mad_ns, 15);
        // population stddev of 10,20,30,40,100: sqrt(1000) = 31.6
        assert_eq!(d.stddev_ns, 32);
        assert_eq!(Distribution::of(&[]).count, 0);
        assert_eq!(
            Distribution::of(&[1, 2, 4, 9]).median_ns,
            3,
            "even count: mean of 2 and 4"
        );
        assert_eq!(Distribution::of(&[1, 2]).median_ns, 2, "rounded half up");
    }

    #[test]
    fn union_merges_overlaps_and_measures_windows() {
        let u = IntervalUnion::build(vec![(10, 20), (15, 30), (40, 50), (5, 5)]);
        assert_eq!(u.len(), 2);
        assert_eq!(u.total(), 30);
        assert_eq!(u.covered(0, 100), 30);
        assert_eq!(u.covered(12, 45), 18 + 5);
        assert_eq!(u.covered(31, 39), 0);
        assert_eq!(u.gaps(0, 60), vec![(0, 10), (30, 40), (50, 60)]);
        assert_eq!(u.gaps(12, 18), vec![]);
    }
}
