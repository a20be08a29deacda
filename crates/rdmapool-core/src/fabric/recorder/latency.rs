//! Latency histograms: what a registration, a deregistration or a sampled work request
//! took, kept in an HDR histogram and summarised as percentiles and Prometheus buckets.

use parking_lot::Mutex;
use std::time::Duration;

/// Quantiles (percent) a [`LatencySummary`] carries, in order.
pub const PERCENTILES: [f64; 8] = [50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0];

/// Upper bounds (seconds) of the Prometheus histogram buckets of both latency histograms.
pub const BUCKETS_SECONDS: [f64; 20] = [
    5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
    100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone)]
#[doc(hidden)]
pub struct Latency {
    hist: hdrhistogram::Histogram<u64>,
    sum_ns: u128,
}

impl Latency {
    /// Adds what `other` recorded (both have the same bounds, so nothing is lost).
    #[doc(hidden)]
    pub fn add(&mut self, other: &Latency) {
        let _ = self.hist.add(&other.hist);
        self.sum_ns += other.sum_ns;
    }

    #[doc(hidden)]
    pub fn record(&mut self, d: Duration) {
        let ns = d.as_nanos().max(1);
        self.hist.saturating_record(ns.min(u64::MAX as u128) as u64);
        self.sum_ns += ns;
    }

    #[doc(hidden)]
    pub fn summary(&self) -> LatencySummary {
        let h = &self.hist;
        let mut buckets = [0u64; BUCKETS_SECONDS.len()];
        for v in h.iter_recorded() {
            let secs = h.highest_equivalent(v.value_iterated_to()) as f64 / 1e9;
            for (b, &le) in buckets.iter_mut().zip(BUCKETS_SECONDS.iter()) {
                if secs <= le {
                    *b += v.count_at_value();
                }
            }
        }
        LatencySummary {
            count: h.len(),
            sum_seconds: self.sum_ns as f64 / 1e9,
            percentiles_us: PERCENTILES.map(|p| {
                let ns = if p >= 100.0 {
                    h.max()
                } else {
                    h.value_at_percentile(p)
                };
                ns as f64 / 1e3
            }),
            buckets,
        }
    }
}

/// The summary of several histograms together (empty when there are none).
#[doc(hidden)]
pub fn merged<'a>(parts: impl IntoIterator<Item = &'a Mutex<Latency>>) -> LatencySummary {
    let mut all = empty();
    for p in parts {
        all.add(&p.lock());
    }
    all.summary()
}

fn empty() -> Latency {
    Latency {
        hist: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("valid bounds"),
        sum_ns: 0,
    }
}

#[doc(hidden)]
pub fn latency() -> Mutex<Latency> {
    Mutex::new(empty())
}

/// Count, sum and percentiles of one latency histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Sum of all values, seconds.
    pub sum_seconds: f64,
    /// Values at [`PERCENTILES`], microseconds, in the same order (100 is the maximum).
    pub percentiles_us: [f64; PERCENTILES.len()],
    /// Cumulative counts of values at most each of [`BUCKETS_SECONDS`].
    pub buckets: [u64; BUCKETS_SECONDS.len()],
}

impl LatencySummary {
    /// The value at percentile `p` (one of [`PERCENTILES`]) in microseconds.
    pub fn percentile_us(&self, p: f64) -> Option<f64> {
        PERCENTILES
            .iter()
            .position(|&q| (q - p).abs() < 1e-9)
            .map(|i| self.percentiles_us[i])
    }
}
