//! The replicated object store (issue #23, docs/STORE.md): keyed objects on the remote
//! memory pool whose get, put and remove are one-sided RDMA only.
//!
//! Built so far, all without I/O: the byte formats ([`format`]: the 8-byte index slot, the
//! block with its version and checksum), replica placement ([`placement`]), the decisions
//! from what was read ([`decide`]), and, crate-private, the making of a node's index and
//! the get as state machines. The client that moves the bytes is not built yet;
//! docs/STORE.md says which parts of the design stand.

pub mod decide;
pub mod format;
pub mod placement;
// The store client that runs these is the next part of #23; until then only tests do.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod get;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod lookup;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod put;
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod root;
#[cfg(test)]
mod sim;

pub use format::{KeyHash, Version};
