//! The replicated object store (issue #23, docs/STORE.md): keyed objects on the remote
//! memory pool whose get, put and remove are one-sided RDMA only.
//!
//! [`Store`] is the client: `put`, `get`, `remove` and `exists` on a
//! [`PoolClient`](rdmapool_pool::remote::PoolClient)'s servers, `r` replicas per object. Beneath it,
//! each a piece without I/O: the byte formats ([`format`](mod@self::format): the 8-byte index slot, the block
//! with its version and checksum), replica placement ([`placement`]), the decisions from
//! what was read ([`decide`]), what a cache evicts ([`evict`]), the timing rules of space and tombstones (`timing`, in
//! virtual time), and, crate-private, the lookup, the get, the put and the
//! making of a node's index as state machines (tested in a simulated cluster, `sim`).
//! docs/STORE.md says which parts of the design are built.

mod client;
pub mod decide;
pub mod evict;
pub mod format;
pub(crate) mod get;
pub(crate) mod lookup;
pub mod placement;
pub(crate) mod put;
pub(crate) mod repair;
pub(crate) mod root;
#[cfg(test)]
mod sim;
pub mod stripe;
pub(crate) mod timing;
pub mod view;

#[cfg(feature = "etcd")]
pub use client::VIEW_KEY;
pub use client::{
    CacheConfig, Located, PutOptions, RepairReport, Repairer, RepairerStats, ServerStats,
    ServerUsage, Store, StoreConfig, StoreStats,
};
pub use evict::Eviction;
pub use format::{KeyHash, Kind, Pin, Version};
