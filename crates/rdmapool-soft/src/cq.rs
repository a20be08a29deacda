//! Completion queues of the soft provider: a bounded lock-free ring and an eventfd.
//!
//! The NIC (a QP's requester and responder, the context's driver thread) pushes completions;
//! `poll` copies them out. Before it does, it lends the caller's thread to the NIC for one
//! pass over the bound QPs that never waits (responses already received are applied), the
//! way a busy-polling consumer would otherwise spin until the NIC's thread got to them.
//!
//! As on mlx5 and rxe, a work queue's entry is free again only once its completion has been
//! *polled*: each completion carries the [`Release`] of the queue entries it retires, and
//! `poll` hands them back ([`QueueSlots`]).

use crate::fabric::Completion;
use crate::{Error, Result};
use crossbeam_queue::ArrayQueue;
use parking_lot::RwLock;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Entries of one work queue that were retired by a completion the application has polled,
/// counted from the QP's creation. The queue's owner counts what it retired; the difference
/// is held until polled.
#[derive(Default)]
pub(crate) struct QueueSlots {
    polled: AtomicU64,
}

impl QueueSlots {
    /// Entries whose completion has been polled so far.
    pub(crate) fn polled(&self) -> u64 {
        self.polled.load(Ordering::Acquire)
    }
}

/// The queue entries a completion retires once it is polled: its own, and on a send queue
/// the unsignaled ones completed before it.
pub(crate) struct Release {
    pub(crate) slots: Arc<QueueSlots>,
    pub(crate) entries: u64,
}

/// A completion as the ring holds it.
struct Entry {
    completion: Completion,
    release: Option<Release>,
}

/// A QP bound to a CQ, as the CQ sees it.
pub(crate) trait Bound: Send + Sync {
    /// Applies what has arrived without waiting (nothing if someone else is at it).
    fn progress_nowait(&self);
    /// The CQ was armed: make the NIC's thread watch for this QP's next response.
    fn armed(&self);
}

/// A bounded, lock-free completion queue.
pub(crate) struct SoftCq {
    queue: ArrayQueue<Entry>,
    depth: u32,
    overrun: AtomicBool,
    bound: RwLock<Vec<Weak<dyn Bound>>>,
    /// Armed by `req_notify`; the next completion signals `events` and disarms.
    armed: AtomicBool,
    /// The completion channel: an eventfd, written when an armed CQ gets a completion.
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
            bound: RwLock::new(Vec::new()),
            armed: AtomicBool::new(false),
            // SAFETY: a fresh descriptor nobody else owns.
            events: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Arms the CQ: the next completion makes the event fd readable.
    pub(crate) fn req_notify(&self) {
        // SeqCst, paired with `is_armed` after a QP's first request goes out: either that QP
        // sees the CQ armed and has its connection watched, or the loop below sees it.
        self.armed.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        for w in self.bound.read().iter() {
            if let Some(qp) = w.upgrade() {
                qp.armed();
            }
        }
        // Completions already queued raise no event, as on rxe: only the next one does. (An
        // mlx5 CQ armed with entries pending may raise one at once; ibv_req_notify_cq(3)
        // promises only the next.) So a consumer that arms must poll once more, and one
        // that forgets hangs here as it would on rxe.
    }

    /// Whether the CQ is armed (see `req_notify`).
    /// The caller fences first: its request must be visible before it looks.
    pub(crate) fn is_armed(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.armed.load(Ordering::SeqCst)
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

    /// Adds a completion that frees `release`'s queue entries when it is polled; a full
    /// queue is an overrun (the completion is lost, as on a NIC).
    pub(crate) fn push(&self, completion: Completion, release: Option<Release>) {
        let e = Entry {
            completion,
            release,
        };
        if self.queue.push(e).is_err() {
            self.overrun.store(true, Ordering::Release);
            tracing::error!(depth = self.depth, "completion queue overrun");
        }
        if self.armed.load(Ordering::Relaxed) {
            self.notify();
        }
    }

    /// Binds a QP whose completions land here.
    pub(crate) fn bind(&self, qp: Weak<dyn Bound>) {
        let mut s = self.bound.write();
        s.retain(|w| w.strong_count() > 0);
        s.push(qp);
    }

    /// Moves up to `out.len()` completions into `out`, after one pass of the bound QPs that
    /// applies what has arrived. Never waits.
    pub(crate) fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        for w in self.bound.read().iter() {
            if let Some(qp) = w.upgrade() {
                qp.progress_nowait();
            }
        }
        if self.overrun.load(Ordering::Acquire) {
            return Err(Error::CqOverrun { depth: self.depth });
        }
        let mut n = 0;
        while n < out.len() {
            match self.queue.pop() {
                Some(e) => {
                    if let Some(r) = e.release {
                        r.slots.polled.fetch_add(r.entries, Ordering::AcqRel);
                    }
                    out[n] = e.completion;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}
