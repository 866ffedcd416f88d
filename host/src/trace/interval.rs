//! Time intervals on the trace's clock and the measure of their unions, which the summary's
//! definitions are written in (overlapping work counts once).

use serde::{Deserialize, Serialize};

/// `[start_ns, end_ns)` on the trace's clock (nanoseconds from the trace's first event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interval {
    /// First nanosecond.
    pub start_ns: u64,
    /// One past the last nanosecond (`≥ start_ns`).
    pub end_ns: u64,
}

impl Interval {
    /// `[start_ns, end_ns)`; an end before the start is read as an empty interval at the start.
    #[must_use]
    pub fn new(start_ns: u64, end_ns: u64) -> Self {
        Interval {
            start_ns,
            end_ns: end_ns.max(start_ns),
        }
    }

    /// Its length in nanoseconds.
    #[must_use]
    pub fn len_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// Whether `other` lies inside it.
    #[must_use]
    pub fn contains(&self, other: &Interval) -> bool {
        self.start_ns <= other.start_ns && other.end_ns <= self.end_ns
    }
}

/// The union of intervals as disjoint, sorted intervals (empty ones dropped).
#[must_use]
pub fn union(intervals: impl IntoIterator<Item = Interval>) -> Vec<Interval> {
    let mut sorted: Vec<Interval> = intervals.into_iter().filter(|i| i.len_ns() > 0).collect();
    sorted.sort_by_key(|i| i.start_ns);
    let mut merged: Vec<Interval> = Vec::with_capacity(sorted.len());
    for i in sorted {
        match merged.last_mut() {
            Some(last) if i.start_ns <= last.end_ns => last.end_ns = last.end_ns.max(i.end_ns),
            _ => merged.push(i),
        }
    }
    merged
}

/// The length of the union of `intervals` (time covered by at least one).
#[must_use]
pub fn measure(intervals: impl IntoIterator<Item = Interval>) -> u64 {
    union(intervals).iter().map(Interval::len_ns).sum()
}

/// The length of the time covered by `intervals` but by none of `minus`: `|∪ intervals \ ∪ minus|`.
#[must_use]
pub fn measure_outside(
    intervals: impl IntoIterator<Item = Interval>,
    minus: impl IntoIterator<Item = Interval>,
) -> u64 {
    let covered = union(intervals);
    let minus = union(minus);
    let inside: u64 = covered
        .iter()
        .flat_map(|c| {
            minus.iter().map(move |m| {
                let (s, e) = (c.start_ns.max(m.start_ns), c.end_ns.min(m.end_ns));
                e.saturating_sub(s)
            })
        })
        .sum();
    covered.iter().map(Interval::len_ns).sum::<u64>() - inside
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(s: u64, e: u64) -> Interval {
        Interval::new(s, e)
    }

    #[test]
    fn overlapping_time_counts_once() {
        assert_eq!(
            union([iv(5, 9), iv(0, 2), iv(1, 3), iv(9, 10), iv(4, 4)]),
            vec![iv(0, 3), iv(5, 10)]
        );
        assert_eq!(measure([iv(0, 10), iv(2, 3), iv(20, 25)]), 15);
        assert_eq!(measure([]), 0);
    }

    #[test]
    fn time_outside_a_cover_is_what_the_cover_leaves() {
        // [0,10) ∪ [20,30) minus [5,25): [0,5) and [25,30).
        assert_eq!(measure_outside([iv(0, 10), iv(20, 30)], [iv(5, 25)]), 10);
        assert_eq!(measure_outside([iv(0, 10)], []), 10);
        assert_eq!(measure_outside([iv(0, 10)], [iv(0, 4), iv(3, 12)]), 0);
        // Intervals that overlap each other on both sides.
        assert_eq!(
            measure_outside([iv(0, 6), iv(4, 10)], [iv(2, 3), iv(8, 9)]),
            8
        );
    }

    #[test]
    fn a_backwards_interval_is_empty() {
        assert_eq!(iv(7, 3).len_ns(), 0);
        assert!(iv(0, 10).contains(&iv(2, 10)));
        assert!(!iv(0, 10).contains(&iv(2, 11)));
    }
}
