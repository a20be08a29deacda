//! rdmapool: safe, fast RDMA memory.
//!
//! The [`fabric`] module is the provider-independent object model (crate `rdmapool-core`);
//! the `soft` provider (crate `rdmapool-soft`, here as [`soft`]) runs it on any Linux machine
//! (no NIC), and the verbs provider (crate `rdmapool-verbs`) drives real hardware. [`devices`]
//! lists the providers and their devices, and [`fabric::Context::open`] opens one. On them:
//! registration, buffer pools, the progress engine, connections and the remote memory pool
//! (crate `rdmapool-pool`; its etcd membership, crate `rdmapool-etcd`, with the feature
//! `etcd`), and the replicated object store, [`store`] (crate
//! `rdmapool-store`), which reaches the pool only through its public seam,
//! [`remote::regions`]. This crate is the facade: every path is re-exported from the crate
//! that holds it (docs/ARCHITECTURE.md).
//!
//! ```
//! use rdmapool::fabric::*;
//! # fn main() -> rdmapool::Result<()> {
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

pub use rdmapool_pool::*;

/// The remote memory pool (crate `rdmapool-pool`), with its etcd membership (crate
/// `rdmapool-etcd`, feature `etcd`).
#[cfg(not(loom))]
pub mod remote {
    pub use rdmapool_pool::remote::*;
    /// Cluster membership on etcd (crate `rdmapool-etcd`).
    #[cfg(feature = "etcd")]
    pub mod etcd {
        pub use rdmapool_etcd::*;
    }
    #[cfg(feature = "etcd")]
    pub use rdmapool_etcd::{
        EtcdConfig, EtcdCredentials, EtcdElection, EtcdFollower, EtcdMember, EtcdMembership,
        EtcdRegistration, EtcdTls, FollowerStats,
    };
}

/// The replicated object store (crate `rdmapool-store`; docs/STORE.md).
#[cfg(not(loom))]
pub mod store {
    pub use rdmapool_store::*;
}

/// The README's Rust snippet, compiled as a doc test so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
