//! What a registrar counts: the counters behind [`RegistrarStats`] and the registration
//! latency per size class ([`LatencyClass`]).

use super::Registrar;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of everything a registrar did (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistrarStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Registrations handed to callers.
    pub completed: u64,
    /// Requests that failed (any reason but cancellation).
    pub failed: u64,
    /// Requests cancelled before completion.
    pub cancelled: u64,
    /// Retries made after ENOMEM/EAGAIN.
    pub retries: u64,
    /// Registrations that finished after their request was cancelled, and were undone.
    pub undone_after_cancel: u64,
    /// Requests that hit their timeout.
    pub timed_out: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) submitted: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) undone_after_cancel: AtomicU64,
    pub(super) timed_out: AtomicU64,
}

pub(super) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Upper bounds (bytes) of the size classes registration latency is recorded by.
pub const LATENCY_CLASSES: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, u64::MAX];

/// Registration latency (submission to completion) of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyClass {
    /// Largest region size in the class, bytes (`u64::MAX`: the rest).
    pub up_to: u64,
    /// Registrations recorded.
    pub count: u64,
    /// Median, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Maximum, ns.
    pub max_ns: u64,
}

/// One empty latency histogram per size class ([`LATENCY_CLASSES`]).
pub(super) fn latency_histograms() -> Vec<hdrhistogram::Histogram<u64>> {
    LATENCY_CLASSES
        .iter()
        .map(|_| {
            hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
        })
        .collect()
}

impl Registrar {
    /// A snapshot of the counters.
    pub fn stats(&self) -> RegistrarStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RegistrarStats {
            submitted: g(&c.submitted),
            completed: g(&c.completed),
            failed: g(&c.failed),
            cancelled: g(&c.cancelled),
            retries: g(&c.retries),
            undone_after_cancel: g(&c.undone_after_cancel),
            timed_out: g(&c.timed_out),
        }
    }

    /// Registration latency per size class ([`LATENCY_CLASSES`]), for classes that saw any.
    pub fn latency(&self) -> Vec<LatencyClass> {
        let h = self.shared.latency.lock();
        LATENCY_CLASSES
            .iter()
            .zip(h.iter())
            .filter(|(_, h)| !h.is_empty())
            .map(|(&up_to, h)| LatencyClass {
                up_to,
                count: h.len(),
                p50_ns: h.value_at_quantile(0.5),
                p99_ns: h.value_at_quantile(0.99),
                max_ns: h.max(),
            })
            .collect()
    }
}
