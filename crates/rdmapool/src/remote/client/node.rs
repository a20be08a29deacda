//! What a client keeps per memory server (its descriptor, QP, lease, chunk views) and the
//! registered scratch words its atomics land in.

use super::super::descriptor::PoolDescriptor;
use super::super::layout::ChunkShape;
use super::super::lease::Holder;
use crate::cq::AsyncQp;
use crate::fabric::{Mr, RemoteAddr};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

/// A chunk this client owns: its shape and what it knows of its bitmap (the client is the
/// only one that sets bits; others only clear them, so a set bit here may be stale, a clear
/// one never is).
pub(super) struct ChunkView {
    pub(super) index: u64,
    pub(super) shape: ChunkShape,
    pub(super) bits: Vec<u64>,
    /// Objects reserved locally and not yet committed remotely.
    pub(super) pending: u64,
}

impl ChunkView {
    pub(super) fn free_bit(&self) -> Option<u64> {
        for (w, &word) in self.bits.iter().enumerate() {
            if word != u64::MAX {
                let bit = (!word).trailing_zeros() as u64;
                let obj = w as u64 * 64 + bit;
                if obj < self.shape.object_count {
                    return Some(obj);
                }
            }
        }
        None
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pending == 0 && self.bits.iter().all(|&w| w == 0)
    }
}

/// One memory server as this client uses it.
pub(super) struct Node {
    pub(super) desc: PoolDescriptor,
    /// Where it was reached (a down node is dialled again there: see `rejoin`).
    pub(super) addr: SocketAddr,
    pub(super) qp: AsyncQp,
    /// Size classes of chunks (chunk index -> object size): this client's own from the claim
    /// on (exact), others' as last read from their headers, so checking a pointer costs a
    /// lookup, and a READ only the first time a chunk of another client is used.
    pub(super) shapes: Mutex<HashMap<u64, u64>>,
    /// Offset of this client's lease slot (set once it is taken).
    pub(super) slot: AtomicU64,
    pub(super) chunks: Mutex<Vec<ChunkView>>,
    /// Chunk claims of this client on this node, one at a time.
    pub(super) claiming: tokio::sync::Mutex<()>,
    pub(super) down: Mutex<Option<String>>,
    pub(super) draining: AtomicBool,
    /// The lease as this client holds it (when it may use the node).
    pub(super) lease: Mutex<Holder>,
    /// The lease heartbeat as this client last left it (only this client adds to it; the
    /// server zeroes it when the lease expires, which the next renewal notices).
    pub(super) beat: AtomicU64,
    pub(super) used: AtomicU64,
}

impl Node {
    pub(super) fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.desc.region.addr + offset,
            rkey: self.desc.region.rkey,
        }
    }

    /// Whether the node may be used now: not marked down, and the lease renewed within three
    /// quarters of a lease (a client that was frozen, or whose renewals stalled, must stop
    /// before the server may reclaim its chunks: docs/RELIABILITY.md, "Failure model").
    pub(super) fn check_up(&self) -> Result<()> {
        if let Some(reason) = &*self.down.lock() {
            return Err(Error::NodeDown {
                node: self.desc.node,
                reason: reason.clone(),
            });
        }
        let holder = *self.lease.lock();
        let now = Instant::now();
        if !holder.may_use(now) {
            let since = holder.since(now);
            let reason = format!(
                "lease not renewed for {since:?} (lease {:?}): the server may take the chunks \
                 back",
                self.desc.lease
            );
            self.mark_down(reason.clone());
            return Err(Error::NodeDown {
                node: self.desc.node,
                reason,
            });
        }
        Ok(())
    }

    pub(super) fn mark_down(&self, reason: String) {
        tracing::warn!(node = self.desc.node, "pool node down: {reason}");
        self.down.lock().get_or_insert(reason);
    }
}

/// Registered scratch words for atomics results and staged chunk headers.
pub(super) struct Scratch {
    pub(super) mr: Arc<Mr>,
    pub(super) free: Mutex<Vec<usize>>,
}

/// One scratch word, given back on drop.
pub(super) struct Word {
    pub(super) scratch: Arc<Scratch>,
    pub(super) offset: usize,
}

impl Drop for Word {
    fn drop(&mut self) {
        self.scratch.free.lock().push(self.offset);
    }
}
