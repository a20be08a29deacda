//! The caller-driven wait of [`super::Engine::run_until`]: poll while a completion is
//! plausibly near, then sleep on the CQs' completion channels.
//!
//! With [`super::Progress::Caller`] nobody polls the CQs but the thread that waits. A wait
//! that only spins (polling, then `sched_yield` between polls) keeps its core busy for the
//! whole round trip; with more waiting clients than cores (eight pool clients, the soft
//! NICs' threads and a server on two cores) the spinners take the cores from the threads
//! whose work would end their waits, and the slowest operations wait for whole time
//! slices. So a wait polls for as long as [`AdaptiveSpin`] allows, the engine's
//! [`super::EngineConfig::spin`] at most, and then sleeps in `poll(2)` on the completion
//! channels of the engine's CQs, armed first (completions that arrived before the arm are
//! polled then, they raise no event).
//!
//! The rule, one budget per engine: a spin that ended with the operation done keeps (or
//! grows back) the budget; one that ran out halves it, down to none (the wait sleeps at
//! once); a sleep that a completion ended within the longest spin makes the next spin
//! twice that long. So one client whose round trips take 20 µs spins through them, while
//! eight clients sharing two cores, whose spins keep running out, sleep and leave the cores
//! to the threads they wait for.
//!
//! A sleep lasts [`SLEEP_SLICE`] at most: the future may wait for something no completion
//! announces (a deadline, another thread's work), and it is polled again after each slice.

use super::Shared;
use crate::fabric::Completion;
use crate::util::spin::AdaptiveSpin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The longest sleep on the completion channels before the future is polled again.
pub(super) const SLEEP_SLICE: Duration = Duration::from_millis(1);

/// Where a caller-driven wait is.
pub(super) struct CallerWait<'a> {
    shared: &'a Shared,
    /// When the wait started, and when its spin ends.
    started: Instant,
    spin_until: Instant,
    /// When it first slept (the spin ran out), if it did.
    slept_at: Option<Instant>,
}

impl<'a> CallerWait<'a> {
    /// A wait starting now, with the engine's current spin budget.
    pub(super) fn start(shared: &'a Shared) -> Self {
        let started = Instant::now();
        let budget = shared.caller_spin.lock().budget();
        Self {
            shared,
            started,
            spin_until: started + budget,
            slept_at: None,
        }
    }

    /// Whether the wait is still spinning (then the caller pauses and polls again).
    pub(super) fn spinning(&self) -> bool {
        self.slept_at.is_none() && Instant::now() < self.spin_until
    }

    /// The spin ran out: sleeps on the completion channels until a completion is there or
    /// a [`SLEEP_SLICE`] passed.
    pub(super) fn sleep(&mut self) {
        if self.slept_at.is_none() {
            self.slept_at = Some(Instant::now());
            self.learn(|spin| spin.spun(false));
        }
        sleep_on_channels(self.shared, SLEEP_SLICE);
    }

    /// The future resolved: what this wait teaches the budget.
    pub(super) fn done(self) {
        let started = self.started;
        match self.slept_at {
            None => self.learn(|spin| spin.spun(true)),
            Some(_) => self.learn(|spin| spin.slept(started.elapsed())),
        }
    }

    /// Updates the engine's budget (and the copy the futures read).
    fn learn(&self, f: impl FnOnce(&mut AdaptiveSpin)) {
        let mut spin = self.shared.caller_spin.lock();
        f(&mut spin);
        let ns = spin.budget().as_nanos() as u64;
        self.shared.caller_spin_ns.store(ns, Ordering::Relaxed);
    }
}

/// The budget a caller-driven engine starts with: spins up to `max`.
pub(super) fn budget(max: Duration) -> parking_lot::Mutex<AdaptiveSpin> {
    parking_lot::Mutex::new(AdaptiveSpin::new(max))
}

/// Arms every CQ of the engine not armed yet, polls the ones it armed (their completions
/// from before the arm raise no event) and, if that found nothing, sleeps in `poll(2)` on
/// their completion channels for `timeout` at most; then consumes the events and marks
/// the CQs that raised one unarmed.
fn sleep_on_channels(s: &Shared, timeout: Duration) {
    let n = s.pool.cqs().len();
    let mut buf = [Completion::EMPTY; 16];
    let mut found = 0;
    for cq in 0..n {
        if s.ensure_armed(cq) {
            found += s.poll_once(cq, &mut buf);
        }
    }
    if found > 0 {
        return;
    }
    let mut fds: Vec<libc::pollfd> = (0..n)
        .map(|cq| libc::pollfd {
            fd: s.cq(cq).event_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a live array of `fds.len()` pollfds for the call's duration; the
    // descriptors are the CQs' channels, open while the engine holds its CQs.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if ready <= 0 {
        return; // the slice passed (or a signal): the caller polls again
    }
    s.wakeups.fetch_add(1, Ordering::Relaxed);
    for (cq, p) in fds.iter().enumerate() {
        if p.revents & libc::POLLIN != 0 {
            let _ = s.cq(cq).ack_events();
            // The request that raised the event is used up.
            s.armed[cq].store(false, Ordering::SeqCst);
        }
    }
}
