//! Completion queues of the soft provider.

use super::qp::SoftQp;
use crate::fabric::Completion;
use crate::{Error, Result};
use crossbeam_queue::ArrayQueue;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;

/// A bounded, lock-free completion queue. Polling it also drives the send side of the QPs
/// bound to it (the requester half of the emulated NIC is caller-driven).
pub(crate) struct SoftCq {
    queue: ArrayQueue<Completion>,
    depth: u32,
    overrun: AtomicBool,
    senders: RwLock<Vec<Weak<SoftQp>>>,
}

impl SoftCq {
    pub(crate) fn new(depth: u32) -> Self {
        Self {
            queue: ArrayQueue::new(depth.max(1) as usize),
            depth,
            overrun: AtomicBool::new(false),
            senders: RwLock::new(Vec::new()),
        }
    }

    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// Adds a completion; a full queue is an overrun (the completion is lost, as on a NIC).
    pub(crate) fn push(&self, c: Completion) {
        if self.queue.push(c).is_err() {
            self.overrun.store(true, Ordering::Release);
            tracing::error!(depth = self.depth, "completion queue overrun");
        }
    }

    /// Binds a QP whose send completions land here.
    pub(crate) fn attach_sender(&self, qp: Weak<SoftQp>) {
        let mut s = self.senders.write();
        s.retain(|w| w.strong_count() > 0);
        s.push(qp);
    }

    /// Progresses bound QPs, then moves up to `out.len()` completions into `out`.
    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        for w in self.senders.read().iter() {
            if let Some(qp) = w.upgrade() {
                qp.progress();
            }
        }
        if self.overrun.load(Ordering::Acquire) {
            return Err(Error::CqOverrun { depth: self.depth });
        }
        let mut n = 0;
        while n < out.len() {
            match self.queue.pop() {
                Some(c) => {
                    out[n] = c;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}
