//! What a client keeps per memory server (its descriptor, QP, lease, chunk book) and the
//! registered scratch words its atomics land in.

use super::super::descriptor::PoolDescriptor;
use super::super::lease::Holder;
use super::chunks::Book;
use crate::cq::AsyncQp;
use crate::fabric::{Mr, RemoteAddr};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One memory server as this client uses it.
pub(super) struct Node {
    pub(super) desc: PoolDescriptor,
    /// Where it was reached (a down node is dialled again there: see `rejoin`).
    pub(super) addr: SocketAddr,
    pub(super) qp: AsyncQp,
    /// Offset of this client's lease slot (set once it is taken).
    pub(super) slot: AtomicU64,
    /// Its chunks as this client knows them (locked only between operations, never across).
    pub(super) book: Mutex<Book>,
    /// Woken when a chunk claim on this node ends (tasks wait for it: `Next::Wait`).
    pub(super) claimed: tokio::sync::Notify,
    /// The durable chunks this client claimed here (table entries `DURABLE_TAG | id`, which
    /// no lease expiry takes back: the object store's), and its own claim notice.
    pub(super) durable_book: Mutex<Book>,
    pub(super) durable_claimed: tokio::sync::Notify,
    /// Why it is down, once it is (never cleared: a node that comes back is a new `Node`).
    pub(super) down: Mutex<Option<String>>,
    /// Set once `down` is (read first, so an operation on an up node takes no lock).
    pub(super) is_down: AtomicBool,
    pub(super) draining: AtomicBool,
    /// The lease as this client holds it (when it may use the node).
    pub(super) lease: Mutex<Holder>,
    /// The lease heartbeat as this client last left it (only this client adds to it; the
    /// server zeroes it when the lease expires, which the next renewal notices).
    pub(super) beat: AtomicU64,
    /// On a node that isolates its clients: the windows it granted, and the control channel.
    pub(super) windows: Option<super::isolated::Windows>,
}

/// Which of a node's books a machine runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Books {
    /// The pool's chunks, under this client's lease.
    Pool,
    /// The durable chunks (`DURABLE_TAG | id`): the object store's.
    Durable,
}

impl Node {
    /// The book `which`, and the notice of its claims.
    pub(super) fn book_of(&self, which: Books) -> (&Mutex<Book>, &tokio::sync::Notify) {
        match which {
            Books::Pool => (&self.book, &self.claimed),
            Books::Durable => (&self.durable_book, &self.durable_claimed),
        }
    }

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
        if self.is_down.load(Ordering::Acquire) {
            if let Some(reason) = &*self.down.lock() {
                return Err(Error::NodeDown {
                    node: self.desc.node,
                    reason: reason.clone(),
                });
            }
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
        self.is_down.store(true, Ordering::Release);
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
