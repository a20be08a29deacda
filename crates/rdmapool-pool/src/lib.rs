//! rdmapool-pool: rdmapool's local RDMA memory and its remote memory pool. Use it through
//! the `rdmapool` crate, which re-exports every path of this one.
//!
//! The [`fabric`] module is the provider-independent object model (crate `rdmapool-core`);
//! the `soft` provider (crate `rdmapool-soft`, here as [`soft`]) runs it on any Linux machine
//! (no NIC), and the verbs provider (crate `rdmapool-verbs`) drives real hardware. [`devices`]
//! lists the providers and their devices, and [`fabric::Context::open`] opens one. This crate
//! builds registration, buffer pools, the progress engine, connections and the remote pool on
//! them.
//!
//! ```
//! use rdmapool_pool::fabric::*;
//! # fn main() -> rdmapool_pool::Result<()> {
//! let ctx = Context::open(SoftConfig::default())?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64)?;
//! let target = pd.alloc_mr(4096, AccessFlags::all_remote())?;
//! let local = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
//! let (a, b) = (pd.create_qp(&cq, &cq, &QpConfig::default())?, pd.create_qp(&cq, &cq, &QpConfig::default())?);
//! a.connect(&b.endpoint())?;
//! b.connect(&a.endpoint())?;
//! local.write_at(0, b"hello")?;
//! let sge = [local.sge(0, 5)?];
//! a.post_send(&[SendWr { wr_id: 1, op: WrOp::Write { remote: target.remote_at(0)?, imm: None }, sg_list: &sge, signaled: true }])?;
//! let done = cq.wait(1, std::time::Duration::from_secs(5))?;
//! assert!(done[0].is_ok());
//! let mut out = [0u8; 5];
//! target.read_at(0, &mut out)?;
//! assert_eq!(&out, b"hello");
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod buf;
pub mod conn;
pub mod cq;
#[cfg(test)]
mod doc_check;
pub mod fabric;
#[cfg(all(feature = "fuzzing", not(loom)))]
#[doc(hidden)]
pub mod fuzzing;
mod loom;
pub mod metrics;
pub mod mr;
mod providers;
#[cfg(not(loom))]
pub mod remote;

pub use providers::devices;
mod error;
pub use error::{CoreError, Error, Result};
/// The soft provider (crate `rdmapool-soft`): its options, and [`soft::tcp_addr`].
pub use rdmapool_soft as soft;

// The core crate's shared helpers, under the names this crate's files use.
use rdmapool_core::{os, util};
