//! Metrics as data: each [`crate::fabric::Context`] owns a recorder that its objects (PDs,
//! regions, CQs, QPs) and everything built on them (registrars, caches, buffer pools,
//! connections, memory servers) record into; [`crate::fabric::Context::metrics`] reads it
//! ([`ContextMetrics`]). Nothing in the library writes to a process-global registry. The
//! recorder itself lives with the object model (`fabric` in `rdmapool-core`, which every
//! layer above reports through), with the data types and their two text forms,
//! [`Snapshot::to_prometheus`] and [`Snapshot::to_json`]; this module gathers what reads it. Serving them (HTTP, Unix socket)
//! is the `rdmapool-exporter` crate's job. A registrar, cache or pool also has statistics of
//! its own (`stats()`), which say the same things about that one object.
//!
//! ```
//! use rdmapool_pool::fabric::{AccessFlags, Context, SoftConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::open(SoftConfig::default())?;
//! drop(ctx.alloc_pd()?.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
//! let now = ctx.metrics().snapshot();
//! assert_eq!(now.registrations, 1);
//! assert!(now.to_prometheus().contains("rdmapool_registrations_total 1\n"));
//! # Ok(()) }
//! ```
//!
//! Every metric is described in `docs/METRICS.md`.

pub use crate::fabric::recorder::{
    opcode_label, snapshot_of, status_label, ContextMetrics, LatencySummary, ObjectCompletions,
    Section, Series, SeriesKind, Snapshot, BUCKETS_SECONDS, DEFAULT_OP_SAMPLE_EVERY, MAX_LISTED,
    PERCENTILES,
};
pub use crate::os::pinned_bytes;
/// A memory server's counters (defined with the pool, `remote::ServerStats`).
#[cfg(not(loom))]
pub use crate::remote::ServerStats;

// The tests build a memory server's section (the pool is not built under loom).
#[cfg(all(test, not(loom)))]
mod tests;
