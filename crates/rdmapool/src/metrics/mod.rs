//! Metrics as data: each [`crate::fabric::Context`] owns a recorder that its objects (PDs,
//! regions, CQs, QPs) and everything built on them (registrars, caches, buffer pools,
//! connections, memory servers) record into; [`crate::fabric::Context::metrics`] reads it
//! ([`ContextMetrics`]). Nothing in the library writes to a process-global registry. The
//! recorder itself lives with the object model (`fabric`, which every layer above reports
//! through); this module is what reads it: the data types, their Prometheus text and JSON,
//! and an [`Endpoint`] that serves the contexts it watches (JSON on a Unix socket,
//! Prometheus text over loopback HTTP). A registrar, cache or pool also has statistics of
//! its own (`stats()`), which say the same things about that one object.
//!
//! Nothing is served unless [`Endpoint::start`] or [`Endpoint::from_env`] is called:
//!
//! ```
//! use rdmapool::fabric::{AccessFlags, Context, SoftConfig};
//! use rdmapool::metrics::{Endpoint, EndpointConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::open(SoftConfig::default())?;
//! let ep = Endpoint::start(EndpointConfig {
//!     unix: None,
//!     http: Some("127.0.0.1:0".parse()?),
//! })?;
//! ep.watch(ctx.metrics());
//! println!("curl http://{}/metrics", ep.http_addr().unwrap());
//! drop(ctx.alloc_pd()?.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
//! let now = ep.snapshot();                      // the same numbers, in process
//! assert_eq!(now.registrations, 1);
//! # Ok(()) }
//! ```
//!
//! Every metric is described in `docs/METRICS.md`.

mod endpoint;
mod json;
mod prometheus;

pub use crate::fabric::recorder::{
    opcode_label, snapshot_of, ContextMetrics, LatencySummary, ObjectCompletions, ServerStats,
    Snapshot, BUCKETS_SECONDS, DEFAULT_OP_SAMPLE_EVERY, MAX_LISTED, PERCENTILES,
};
pub use crate::os::pinned_bytes;
pub use endpoint::{
    Endpoint, EndpointConfig, EndpointError, UnixName, ENV_HTTP, ENV_OP_SAMPLE, ENV_PER_OBJECT,
    ENV_SOCKET,
};
pub use prometheus::status_label;

#[cfg(test)]
mod tests;
