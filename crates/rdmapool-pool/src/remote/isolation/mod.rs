//! Isolated tenants: a server mode in which the NIC confines each client to its own lease
//! slot and chunks (docs/PROTOCOL.md section 7.6, docs/SECURITY.md).
//!
//! The region is registered without remote rights; each connection gets type-2 memory
//! windows bound through its own QP: one read-only over the header, the lease slots and the
//! chunk table, one over its lease slot, and one per chunk it owns. Chunks are claimed and
//! released through the server with two-sided control messages (docs/PROTOCOL.md section 7.6); allocation,
//! free, reads and writes inside an owned chunk stay one-sided.

mod wire;

pub(crate) use wire::{Control, CONTROL_LEN, NO_SLOT, QUOTA_REACHED, REFUSED};

/// Whether a memory server trusts its clients with its whole region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Every connected client may READ, WRITE and run atomics on any byte of the region (as
    /// in FaRM, Sherman, FUSEE and Mooncake): fastest, and for clients that trust each other.
    #[default]
    Trusted,
    /// Each client reaches only its own lease slot and chunks (and reads the header, slots
    /// and chunk table), enforced by the NIC through memory windows bound to its connection;
    /// chunk claims and releases go through the server.
    Isolated,
}
