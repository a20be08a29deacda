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
    /// An eventfd, written when an armed CQ gets a completion.
    events: OwnedFd,
    /// The completion channel users wait on: an epoll set of `events` and the sockets of
    /// bound QPs that await responses. The requester half of this NIC runs when the CQ is
    /// polled, so a response arriving must wake an event-driven consumer too; sockets are
    /// one-shot and re-armed by `req_notify`, so a dead peer cannot keep the channel
    /// readable.
    channel: OwnedFd,
}

impl SoftCq {
    pub(crate) fn new(depth: u32) -> Result<Self> {
        // SAFETY: eventfd with valid flags; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let events = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: epoll_create1 with a valid flag; the descriptor is owned below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(Error::last_os("epoll_create1"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let channel = unsafe { OwnedFd::from_raw_fd(ep) };
        let cq = Self {
            queue: ArrayQueue::new(depth.max(1) as usize),
            depth,
            overrun: AtomicBool::new(false),
            senders: RwLock::new(Vec::new()),
            armed: AtomicBool::new(false),
            events,
            channel,
        };
        if cq.epoll(
            libc::EPOLL_CTL_ADD,
            cq.events.as_raw_fd(),
            libc::EPOLLIN as u32,
        ) != 0
        {
            return Err(Error::last_os("epoll_ctl"));
        }
        Ok(cq)
    }

    fn epoll(&self, op: libc::c_int, fd: RawFd, events: u32) -> libc::c_int {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: our epoll descriptor, a descriptor the caller owns, and a local event.
        unsafe { libc::epoll_ctl(self.channel.as_raw_fd(), op, fd, &mut ev) }
    }

    /// Adds a bound QP's connection to the channel (disarmed until `rearm_socket`).
    pub(crate) fn watch_socket(&self, fd: RawFd) {
        self.epoll(
            libc::EPOLL_CTL_ADD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
        );
    }

    /// Makes the channel readable once when `fd` has data (or is closed).
    pub(crate) fn rearm_socket(&self, fd: RawFd) {
        self.epoll(
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
        );
    }

    /// Removes a connection (broken or closing) from the channel.
    pub(crate) fn unwatch_socket(&self, fd: RawFd) {
        self.epoll(libc::EPOLL_CTL_DEL, fd, 0);
    }

    /// Arms the CQ: the next completion makes the event fd readable, and so does a
    /// response for a request a bound QP still waits for.
    pub(crate) fn req_notify(&self) {
        // SeqCst, paired with `is_armed` after a QP's first request goes out: either that QP
        // sees the CQ armed and arms its socket, or the loop below sees the request.
        self.armed.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        for w in self.senders.read().iter() {
            if let Some(qp) = w.upgrade() {
                qp.arm_response_wakeup(self);
            }
        }
        // A completion that raced ahead of arming still notifies (like a NIC's CQ arm with
        // entries pending, this errs on the side of waking the consumer).
        if !self.queue.is_empty() {
            self.notify();
        }
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
        self.channel.as_raw_fd()
    }

    /// Reads (and so clears) the pending notifications, and consumes the channel's ready
    /// sockets (which disarms them until the next `req_notify`).
    pub(crate) fn ack_events(&self) -> usize {
        let mut n = 0u64;
        // SAFETY: reading 8 bytes into a local from our non-blocking eventfd.
        let r = unsafe { libc::read(self.events.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        let mut ready = [libc::epoll_event { events: 0, u64: 0 }; 16];
        loop {
            // SAFETY: our epoll descriptor and a local array of the length given; timeout 0.
            let k = unsafe {
                libc::epoll_wait(
                    self.channel.as_raw_fd(),
                    ready.as_mut_ptr(),
                    ready.len() as i32,
                    0,
                )
            };
            // Every ready socket is reported (and so disarmed) once; the eventfd, level
            // triggered and just read, is not among them unless written again.
            if k < ready.len() as i32 {
                break;
            }
        }
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
