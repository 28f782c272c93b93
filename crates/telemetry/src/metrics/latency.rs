//! Latency histograms kept with a model version's statistics, for the status page's percentiles
//! (`/console`): Triton's statistics only sum durations, and the Prometheus summaries exist only
//! with `summary_latencies`. Counts are cumulative; the page takes percentiles of the difference
//! between two readings, so they describe the last seconds rather than the version's lifetime.

/// Upper bounds of the buckets in microseconds: 1, 1.5, 2, 3, 5 and 7 per decade from 10 µs to
/// 70 s (neighbouring bounds at most 1.67× apart: coarse, enough for a dashboard). A last
/// bucket takes everything slower.
pub const BOUNDS_US: [u64; 42] = bounds();

const fn bounds() -> [u64; 42] {
    const STEPS: [u64; 6] = [10, 15, 20, 30, 50, 70];
    let mut out = [0; 42];
    let mut decade = 1;
    let mut i = 0;
    while i < 42 {
        out[i] = STEPS[i % 6] * decade;
        if i % 6 == 5 {
            decade *= 10;
        }
        i += 1;
    }
    out
}

/// Cumulative counts per bucket of [`BOUNDS_US`], plus one for slower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u64; BOUNDS_US.len() + 1],
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram {
            counts: [0; BOUNDS_US.len() + 1],
        }
    }
}

impl LatencyHistogram {
    pub fn record(&mut self, micros: u64) {
        let bucket = BOUNDS_US.partition_point(|&bound| bound < micros);
        self.counts[bucket] += 1;
    }

    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_rise_from_ten_microseconds_to_seventy_seconds() {
        assert_eq!(BOUNDS_US[..7], [10, 15, 20, 30, 50, 70, 100]);
        assert_eq!(BOUNDS_US[BOUNDS_US.len() - 1], 70_000_000);
        assert!(BOUNDS_US.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn a_value_lands_in_the_first_bucket_whose_bound_holds_it() {
        let mut histogram = LatencyHistogram::default();
        for micros in [0, 10, 11, 100, 80_000_000] {
            histogram.record(micros);
        }
        let counts = histogram.counts();
        assert_eq!(counts[0], 2); // 0 and 10
        assert_eq!(counts[1], 1); // 11 ≤ 15
        assert_eq!(counts[6], 1); // 100
        assert_eq!(counts[BOUNDS_US.len()], 1); // past 70 s
        assert_eq!(counts.iter().sum::<u64>(), 5);
    }
}
