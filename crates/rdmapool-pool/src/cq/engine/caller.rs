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
//! The rule, one budget per engine, learnt from every stretch of a wait from one
//! completion of the engine to the next (a store put waits for three in a row): a spin
//! that a completion ended keeps (or grows back) the budget; one that ran out halves it,
//! down to none (the wait sleeps at once); a sleep that a completion ended within the
//! longest spin makes the next spin twice that long. So one client whose round trips take
//! 20 µs spins through them, while eight clients sharing two cores, whose spins keep
//! running out, sleep and leave the cores to the threads they wait for.
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

/// Where a caller-driven wait is. A future may need several completions one after
/// another (a store put takes three rounds): each stretch from one completion of the
/// engine to the next is a wait of its own, with its own spin and its own lesson.
pub(super) struct CallerWait<'a> {
    shared: &'a Shared,
    /// The engine's completion count when this stretch started.
    completions: u64,
    /// When the stretch started, and when its spin ends.
    started: Instant,
    spin_until: Instant,
    /// Whether it slept (its spin ran out).
    slept: bool,
}

impl<'a> CallerWait<'a> {
    /// A wait starting now, with the engine's current spin budget.
    pub(super) fn start(shared: &'a Shared) -> Self {
        let started = Instant::now();
        Self {
            shared,
            completions: shared.completions.load(Ordering::Relaxed),
            started,
            spin_until: started + shared.future_spin(),
            slept: false,
        }
    }

    /// After a poll of the future that left it pending: if the engine took completions
    /// since the stretch started, the stretch ended (its lesson is learnt) and a new one
    /// starts. Then whether to spin on (the caller pauses and polls again) or sleep.
    pub(super) fn pending(&mut self) -> bool {
        let completions = self.shared.completions.load(Ordering::Relaxed);
        if completions != self.completions {
            self.end_stretch();
            *self = Self::start(self.shared);
            return true;
        }
        !self.slept && Instant::now() < self.spin_until
    }

    /// The spin ran out: sleeps on the completion channels until a completion is there or
    /// a [`SLEEP_SLICE`] passed.
    pub(super) fn sleep(&mut self) {
        if !self.slept {
            self.slept = true;
            self.learn(|spin| spin.spun(false));
        }
        sleep_on_channels(self.shared, SLEEP_SLICE);
    }

    /// The future resolved: what the last stretch teaches the budget.
    pub(super) fn done(self) {
        self.end_stretch();
    }

    fn end_stretch(&self) {
        if self.slept {
            let waited = self.started.elapsed();
            self.learn(|spin| spin.slept(waited));
        } else {
            self.learn(|spin| spin.spun(true));
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

/// Arms every CQ of the engine, polls each once (completions from before the arm raise no
/// event) and, if that found nothing, sleeps in `poll(2)` on their completion channels for
/// `timeout` at most; then consumes the events.
///
/// Every CQ is armed again before every sleep, even one armed before: arming is also what
/// tells a provider to watch for what would complete the operations in flight (the soft
/// provider's TCP path then has its NIC thread read the connection, which it may have
/// left to a poll of the CQ that this thread made, and that found nothing yet). Arming an
/// armed CQ is harmless; missing that would leave the wait to its slice.
fn sleep_on_channels(s: &Shared, timeout: Duration) {
    let n = s.pool.cqs().len();
    let mut buf = [Completion::EMPTY; 16];
    let mut found = 0;
    for cq in 0..n {
        if let Err(e) = s.cq(cq).req_notify() {
            tracing::error!(cq, "cannot arm the completion queue: {e}");
        }
        found += s.poll_once(cq, &mut buf);
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
        }
    }
}
