//! Completion queues of the soft provider.

use super::qp::SoftQp;
use crate::fabric::Completion;
use crate::{Error, Result};
use crossbeam_queue::ArrayQueue;
use parking_lot::RwLock;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Weak;

/// A bounded, lock-free completion queue. Polling it also drives the send side of the QPs
/// bound to it (the requester half of the emulated NIC is caller-driven).
pub(crate) struct SoftCq {
    queue: ArrayQueue<Completion>,
    depth: u32,
    overrun: AtomicBool,
    senders: RwLock<Vec<Weak<SoftQp>>>,
    /// Armed by `req_notify`; the next completion signals `events` and disarms.
    armed: AtomicBool,
    /// An eventfd: the completion channel.
    events: OwnedFd,
}

impl SoftCq {
    pub(crate) fn new(depth: u32) -> Result<Self> {
        // SAFETY: eventfd with valid flags; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        Ok(Self {
            queue: ArrayQueue::new(depth.max(1) as usize),
            depth,
            overrun: AtomicBool::new(false),
            senders: RwLock::new(Vec::new()),
            armed: AtomicBool::new(false),
            // SAFETY: a fresh descriptor nobody else owns.
            events: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Arms the CQ: the next completion makes the event fd readable.
    pub(crate) fn req_notify(&self) {
        self.armed.store(true, Ordering::Release);
        // A completion that raced ahead of arming still notifies (like a NIC's CQ arm with
        // entries pending, this errs on the side of waking the consumer).
        if !self.queue.is_empty() {
            self.notify();
        }
    }

    fn notify(&self) {
        if self.armed.swap(false, Ordering::AcqRel) {
            let one = 1u64;
            // SAFETY: writing 8 bytes from a local to our eventfd.
            unsafe { libc::write(self.events.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    pub(crate) fn event_fd(&self) -> RawFd {
        self.events.as_raw_fd()
    }

    /// Reads (and so clears) the pending notifications.
    pub(crate) fn ack_events(&self) -> usize {
        let mut n = 0u64;
        // SAFETY: reading 8 bytes into a local from our non-blocking eventfd.
        let r = unsafe { libc::read(self.events.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        if r == 8 {
            n as usize
        } else {
            0
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
        if self.armed.load(Ordering::Relaxed) {
            self.notify();
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
