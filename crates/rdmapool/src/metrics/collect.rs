//! One snapshot of what the registrar, caches and pools did, as a struct and as Prometheus
//! text exposition.

use crate::buf::{BufferPool, PoolStats};
use crate::mr::{CacheStats, LatencyClass, RegCache, Registrar, RegistrarStats};
use std::fmt::Write;

use crate::os::pinned_bytes;

/// Counters and latency histograms of the parts given to [`Metrics::collect`].
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// The registrar's counters.
    pub registrar: Option<RegistrarStats>,
    /// Registration latency per size class.
    pub latency: Vec<LatencyClass>,
    /// The cache's counters.
    pub cache: Option<CacheStats>,
    /// The pool's counters.
    pub pool: Option<PoolStats>,
    /// Bytes pinned by soft-provider registrations in this process.
    pub pinned_bytes: u64,
}

impl Metrics {
    /// Takes a snapshot of whichever parts are given.
    pub fn collect(
        registrar: Option<&Registrar>,
        cache: Option<&RegCache>,
        pool: Option<&BufferPool>,
    ) -> Self {
        Self {
            registrar: registrar.map(Registrar::stats),
            latency: registrar.map(Registrar::latency).unwrap_or_default(),
            cache: cache.map(RegCache::stats),
            pool: pool.map(BufferPool::stats),
            pinned_bytes: pinned_bytes(),
        }
    }

    /// The snapshot in Prometheus text format (counters, gauges and a summary of
    /// registration latency in seconds).
    pub fn to_prometheus(&self) -> String {
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(
                o,
                "# HELP rdmapool_{name} {help}\n# TYPE rdmapool_{name} {kind}\nrdmapool_{name} {v}"
            );
        };
        if let Some(r) = &self.registrar {
            metric(
                "registrations_submitted_total",
                "counter",
                "Registration requests submitted.",
                r.submitted,
            );
            metric(
                "registrations_completed_total",
                "counter",
                "Registrations completed.",
                r.completed,
            );
            metric(
                "registrations_failed_total",
                "counter",
                "Registrations failed.",
                r.failed,
            );
            metric(
                "registrations_cancelled_total",
                "counter",
                "Registrations cancelled.",
                r.cancelled,
            );
            metric(
                "registration_retries_total",
                "counter",
                "Retries after ENOMEM/EAGAIN.",
                r.retries,
            );
            metric(
                "registrations_timed_out_total",
                "counter",
                "Registrations past their timeout.",
                r.timed_out,
            );
        }
        if let Some(c) = &self.cache {
            metric(
                "cache_hits_total",
                "counter",
                "Registration cache hits.",
                c.hits,
            );
            metric(
                "cache_misses_total",
                "counter",
                "Registration cache misses.",
                c.misses,
            );
            metric(
                "cache_evictions_total",
                "counter",
                "Registration cache evictions.",
                c.evictions,
            );
            metric(
                "cache_invalidations_total",
                "counter",
                "Cache entries dropped because memory changed.",
                c.invalidations,
            );
            metric(
                "cache_bytes_pinned",
                "gauge",
                "Bytes kept registered by the cache.",
                c.bytes_pinned,
            );
            metric(
                "cache_entries",
                "gauge",
                "Entries in the registration cache.",
                c.live_entries,
            );
        }
        if let Some(p) = &self.pool {
            metric("pool_chunks", "gauge", "Registered pool chunks.", p.chunks);
            metric(
                "pool_buffers_in_use",
                "gauge",
                "Pool buffers handed out.",
                p.in_use,
            );
            metric(
                "pool_allocations_total",
                "counter",
                "Pool buffers handed out over time.",
                p.allocations,
            );
            metric(
                "pool_empty_total",
                "counter",
                "Allocations that found no free slot.",
                p.empty,
            );
        }
        metric(
            "pinned_bytes",
            "gauge",
            "Bytes pinned by soft-provider registrations.",
            self.pinned_bytes,
        );
        if !self.latency.is_empty() {
            let _ = writeln!(o, "# HELP rdmapool_registration_seconds Registration latency, submission to completion.");
            let _ = writeln!(o, "# TYPE rdmapool_registration_seconds summary");
            for l in &self.latency {
                let class = if l.up_to == u64::MAX {
                    "+Inf".to_string()
                } else {
                    l.up_to.to_string()
                };
                for (q, v) in [("0.5", l.p50_ns), ("0.99", l.p99_ns), ("1", l.max_ns)] {
                    let _ = writeln!(
                        o,
                        "rdmapool_registration_seconds{{size_le=\"{class}\",quantile=\"{q}\"}} {}",
                        v as f64 / 1e9
                    );
                }
                let _ = writeln!(
                    o,
                    "rdmapool_registration_seconds_count{{size_le=\"{class}\"}} {}",
                    l.count
                );
            }
        }
        o
    }
}
