//! The soft NIC's own thread: what a NIC does without being asked.
//!
//! One thread per context runs the requester side of every QP when nobody else does:
//! - retry timeouts: it sleeps until the earliest deadline of any QP with requests in
//!   flight and completes the timed-out ones (so a consumer waiting on the completion
//!   channel learns of a dead peer without polling);
//! - responses while a CQ is armed: the connections of its QPs are watched (one-shot) and
//!   the thread processes what arrives, which pushes completions and signals the CQ.
//!
//! Applications that poll do the same work themselves, without waiting (`Cq::poll`); the QP
//! lock makes sure only one of them does it at a time.

use super::waker::{epoll, epoll_wait, EventFd};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A QP's requester side, as the thread drives it.
pub(crate) trait Drive: Send + Sync {
    /// Reads what has arrived, completes what timed out at `now`, and returns the next
    /// deadline (`Ok(None)`: nothing in flight). `Err(())` when the QP is busy (someone else
    /// is driving it): the thread tries again shortly.
    fn drive(&self, now: Instant) -> std::result::Result<Option<Instant>, ()>;
}

/// How soon the thread retries a QP that was busy (its data left unread by whoever held
/// it: a thread that polls the CQ, then sleeps on its channel, waits for this retry).
/// Timed to the microsecond where the kernel has `epoll_pwait2`.
const BUSY_RETRY: Duration = Duration::from_micros(20);
/// `sleeping_until` while the thread is awake and scanning.
const SCANNING: u64 = 0;
/// `sleeping_until` when no deadline is pending.
const FOREVER: u64 = u64::MAX;

/// The context's driver thread and what it watches.
pub(crate) struct Driver {
    epoll: OwnedFd,
    /// Signalled to wake the thread (a new deadline, or shutdown).
    wake: EventFd,
    /// Every QP with a connection, by its socket descriptor.
    qps: Mutex<HashMap<RawFd, Weak<dyn Drive>>>,
    /// When the thread will next wake on its own (nanoseconds since `epoch`), SCANNING while
    /// it is awake, FOREVER when it sleeps until woken.
    sleeping_until: AtomicU64,
    epoch: Instant,
    stop: AtomicBool,
}

/// The epoll data of the wake descriptor (sockets use their descriptor number).
const WAKE: u64 = u64::MAX;

impl Driver {
    /// Starts the thread.
    pub(crate) fn start() -> Result<Arc<Self>> {
        let epoll = epoll()?;
        let wake = EventFd::new()?;
        let d = Arc::new(Self {
            epoll,
            wake,
            qps: Mutex::new(HashMap::new()),
            sleeping_until: AtomicU64::new(FOREVER),
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
        });
        if d.ctl(
            libc::EPOLL_CTL_ADD,
            d.wake.as_raw_fd(),
            libc::EPOLLIN as u32,
            WAKE,
        ) != 0
        {
            return Err(Error::last_os("epoll_ctl"));
        }
        let t = d.clone();
        std::thread::Builder::new()
            .name("rdmapool-soft-nic".into())
            .spawn(move || t.run())
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
            })?;
        Ok(d)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, data: u64) -> libc::c_int {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: our epoll descriptor, a descriptor the caller owns, and a local event.
        unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) }
    }

    /// Watches a QP's connection (disarmed until [`Self::arm`]).
    pub(crate) fn watch(&self, fd: RawFd, qp: Weak<dyn Drive>) {
        self.qps.lock().insert(fd, qp);
        self.ctl(
            libc::EPOLL_CTL_ADD,
            fd,
            libc::EPOLLONESHOT as u32,
            fd as u64,
        );
    }

    /// Stops watching (before the descriptor is closed or shut down).
    pub(crate) fn unwatch(&self, fd: RawFd) {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0);
        self.qps.lock().remove(&fd);
    }

    /// The thread processes the next data (or EOF) on `fd`, once.
    pub(crate) fn arm(&self, fd: RawFd) {
        let ev = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
        self.ctl(libc::EPOLL_CTL_MOD, fd, ev, fd as u64);
    }

    fn nanos(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_nanos() as u64).clamp(1, FOREVER - 1)
    }

    /// A QP has a request in flight again that times out at `deadline`: wakes the thread if
    /// it would otherwise sleep past it. Called after the request is visible to `drive`.
    pub(crate) fn deadline(&self, deadline: Instant) {
        let until = self.sleeping_until.load(Ordering::SeqCst);
        if until == SCANNING || until > self.nanos(deadline) {
            self.poke();
        }
    }

    fn poke(&self) {
        self.wake.signal();
    }

    /// Ends the thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.poke();
    }

    fn drive_one(&self, fd: RawFd, now: Instant) -> Option<Instant> {
        let qp = self.qps.lock().get(&fd).and_then(Weak::upgrade)?;
        match qp.drive(now) {
            Ok(next) => next,
            Err(()) => Some(now + BUSY_RETRY),
        }
    }

    fn run(&self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 32];
        // The earliest deadline known (a lower bound: waking early only costs a scan).
        let mut next: Option<Instant> = None;
        while !self.stop.load(Ordering::SeqCst) {
            let timeout = next.map(|t| t.saturating_duration_since(Instant::now()));
            let n = epoll_wait(&self.epoll, &mut events, timeout) as i32;
            // From here until the store below, a QP that starts a request pokes us: we may
            // not see it in the scan.
            self.sleeping_until.store(SCANNING, Ordering::SeqCst);
            let now = Instant::now();
            let mut scan = n == 0 || next.is_some_and(|d| now >= d);
            for ev in events.iter().take(n.max(0) as usize) {
                if ev.u64 == WAKE {
                    self.wake.drain();
                    scan = true;
                } else if let Some(d) = self.drive_one(ev.u64 as RawFd, now) {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
            if scan {
                // Every QP's next deadline; timed-out requests complete on the way.
                let fds: Vec<RawFd> = self.qps.lock().keys().copied().collect();
                next = fds
                    .into_iter()
                    .filter_map(|fd| self.drive_one(fd, now))
                    .min();
                self.qps.lock().retain(|_, w| w.strong_count() > 0);
            }
            let until = next.map_or(FOREVER, |t| self.nanos(t));
            self.sleeping_until.store(until, Ordering::SeqCst);
        }
    }
}
