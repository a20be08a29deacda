//! A QP's share of the engine, what an operation's future works with: the queue entries it
//! may take (credits) and the CQ it is bound to.

use super::drivers::Progressors;
use super::slots::{Holder, ANY_SOURCE};
use super::Shared;
use crate::fabric::Qp;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A QP's share of the engine: its queues' free entries and the CQ it is bound to.
pub(super) struct QpShared {
    pub(super) qp: Qp,
    /// Free send-queue entries; a post takes as many as it has work requests and the
    /// completion gives them back, so posting never overflows the queue.
    send_credits: AtomicU32,
    send_depth: u32,
    recv_credits: AtomicU32,
    recv_depth: u32,
    /// Index of the CQ in the engine, or `ANY_SOURCE` for a wrapped QP.
    pub(super) cq: usize,
    /// Entries this QP reserved in its CQ (released on drop).
    reserved: u64,
    pub(super) engine: Arc<Shared>,
    _progressors: Arc<Progressors>,
}

/// The queue entries one operation holds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Credits {
    /// On the receive queue (else the send queue).
    pub(super) recv: bool,
    /// How many.
    pub(super) n: u32,
}

impl QpShared {
    /// `qp`'s share, bound to CQ `cq` of `engine` (where it reserved `reserved` entries), with
    /// its queues' full depths free.
    pub(super) fn new(
        qp: Qp,
        cq: usize,
        reserved: u64,
        engine: Arc<Shared>,
        progressors: Arc<Progressors>,
    ) -> Self {
        let capacity = qp.capacity();
        Self {
            qp,
            send_credits: AtomicU32::new(capacity.send),
            send_depth: capacity.send,
            recv_credits: AtomicU32::new(capacity.recv),
            recv_depth: capacity.recv,
            cq,
            reserved,
            engine,
            _progressors: progressors,
        }
    }

    #[inline]
    fn credits(&self, recv: bool) -> &AtomicU32 {
        if recv {
            &self.recv_credits
        } else {
            &self.send_credits
        }
    }

    /// The depth of the receive or the send queue.
    #[inline]
    pub(super) fn depth(&self, recv: bool) -> u32 {
        if recv {
            self.recv_depth
        } else {
            self.send_depth
        }
    }

    /// Free entries of the receive or the send queue now.
    #[inline]
    pub(super) fn free(&self, recv: bool) -> u32 {
        self.credits(recv).load(Ordering::Acquire)
    }

    /// Takes `n` free entries of a queue, if it has them.
    #[inline]
    pub(super) fn take(&self, recv: bool, n: u32) -> bool {
        self.credits(recv)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(n))
            .is_ok()
    }

    /// Gives `n` entries back to a queue.
    #[inline]
    pub(super) fn give(&self, recv: bool, n: u32) {
        self.credits(recv).fetch_add(n, Ordering::AcqRel);
    }
}

impl Holder for QpShared {
    type Lease = Credits;

    #[inline]
    fn give_back(&self, c: Credits) {
        self.give(c.recv, c.n);
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        if self.cq != ANY_SOURCE {
            self.engine.pool.unreserve(self.cq, self.reserved);
        }
    }
}
