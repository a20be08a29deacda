//! Metrics: a process-global registry every registration, deregistration, cache lookup,
//! pool allocation and completion poll records into, an opt-in [`Endpoint`] serving it
//! (JSON on a Unix socket, Prometheus text over loopback HTTP), and [`Metrics`], a snapshot
//! of particular registrars, caches and pools.
//!
//! Nothing is served unless [`Endpoint::start`] or [`Endpoint::from_env`] is called:
//!
//! ```
//! use rdmapool::metrics::{Endpoint, EndpointConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ep = Endpoint::start(EndpointConfig {
//!     unix: None,
//!     http: Some("127.0.0.1:0".parse()?),
//! })?;
//! println!("curl http://{}/metrics", ep.http_addr().unwrap());
//! let now = rdmapool::metrics::snapshot();          // the same numbers, in process
//! assert!(now.registrations >= now.registration_latency.count);
//! # Ok(()) }
//! ```
//!
//! Every metric is described in `docs/METRICS.md`.

mod collect;
mod endpoint;
mod json;
mod latency;
pub(crate) mod objects;
pub(crate) mod ops;
mod opt_in;
pub(crate) mod pool_servers;
mod prometheus;
pub(crate) mod registry;

pub use crate::os::pinned_bytes;
pub use collect::Metrics;
pub use endpoint::{
    Endpoint, EndpointConfig, EndpointError, UnixName, ENV_HTTP, ENV_OP_SAMPLE, ENV_PER_OBJECT,
    ENV_SOCKET,
};
pub use latency::{LatencySummary, BUCKETS_SECONDS, PERCENTILES};
pub use objects::{objects_tracked, track_objects, ObjectCompletions, MAX_LISTED};
pub use ops::{op_sample_every, opcode_label, sample_op_latency, DEFAULT_OP_SAMPLE_EVERY};
pub use pool_servers::ServerStats;
pub use prometheus::status_label;
pub use registry::{snapshot, Snapshot};

#[cfg(test)]
mod tests;
