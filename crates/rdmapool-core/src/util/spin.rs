//! How long a thread that waits for work polls before it sleeps, adapted to what polling
//! gained it, and polling that gives the core away to threads that want it.
//!
//! Polling wins when work follows within microseconds: a sleep and wake-up cost more. On a
//! machine with more polling threads than cores (four pool clients and a soft NIC on two
//! cores), a plain spin takes the core from a thread with work for a whole time slice. So a
//! client's busy-wait polls plainly for its first [`PLAIN_SPIN`] (an intra-host operation
//! completes within it), then *yielding* ([`PollPause`]: `sched_yield` between polls, which
//! costs a system call when the core is free and hands it over at once when it is not). A
//! thread that can sleep (a soft NIC's serving loop) polls for as long as [`AdaptiveSpin`]
//! says: a spin that found nothing halves the next one (down to none: the
//! thread sleeps at once); one that found work, or a sleep that work ended within the
//! longest spin (to twice that wait), grows it back. The policy is pure (the caller reports), so its rules are
//! tested without clocks.

use std::time::{Duration, Instant};

/// The spin budget of one waiting thread (see the module docs).
#[derive(Debug, Clone)]
pub struct AdaptiveSpin {
    max: Duration,
    budget: Duration,
}

/// A budget below this is not worth a spin: the thread sleeps at once.
const MIN_SPIN: Duration = Duration::from_micros(1);

impl AdaptiveSpin {
    /// A policy that spins at most `max` (zero: never), starting at `max`.
    pub fn new(max: Duration) -> Self {
        Self { max, budget: max }
    }

    /// How long to spin now (zero: sleep at once).
    pub fn budget(&self) -> Duration {
        if self.budget < MIN_SPIN {
            Duration::ZERO
        } else {
            self.budget
        }
    }

    /// Takes the outcome of a spin: whether it found work.
    pub fn spun(&mut self, found: bool) {
        if found {
            self.budget = (self.budget * 2).max(self.max / 8).min(self.max);
        } else {
            self.budget /= 2;
        }
    }

    /// Takes a sleep that ended after `waited` because work arrived: work that came within
    /// the longest spin would have been caught by one, so the next wait spins for twice
    /// that long (at least an eighth of the longest spin, at most all of it).
    pub fn slept(&mut self, waited: Duration) {
        if waited < self.max {
            let enough = (waited * 2).clamp(self.max / 8, self.max);
            self.budget = self.budget.max(enough);
        }
    }
}

/// How long a busy-wait pauses with a CPU hint only, before it yields between polls.
pub const PLAIN_SPIN: Duration = Duration::from_micros(2);

/// The pause between two polls of a busy-wait: a CPU hint for the first [`PLAIN_SPIN`],
/// then `sched_yield`, so that threads with work (a server's NIC thread, other clients)
/// get the core when there are more runnable threads than cores.
#[derive(Debug)]
pub struct PollPause {
    plain: Duration,
    yield_from: Option<Instant>,
}

impl Default for PollPause {
    fn default() -> Self {
        Self::new()
    }
}

impl PollPause {
    /// A busy-wait that starts now (its clock starts at the first pause).
    pub fn new() -> Self {
        Self::with_plain(PLAIN_SPIN)
    }

    /// A busy-wait that pauses with a CPU hint for its first `plain` only.
    pub fn with_plain(plain: Duration) -> Self {
        Self {
            plain,
            yield_from: None,
        }
    }

    /// Pauses once between polls; returns whether it yielded the CPU.
    pub fn pause(&mut self) -> bool {
        let now = Instant::now();
        if now >= *self.yield_from.get_or_insert(now + self.plain) {
            std::thread::yield_now();
            true
        } else {
            std::hint::spin_loop();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(50);

    #[test]
    fn spins_that_find_work_keep_the_whole_budget() {
        let mut p = AdaptiveSpin::new(MAX);
        for _ in 0..100 {
            p.spun(true);
        }
        assert_eq!(p.budget(), MAX);
    }

    #[test]
    fn wasted_spins_halve_the_budget_and_a_quick_sleep_brings_a_short_one_back() {
        let mut p = AdaptiveSpin::new(MAX);
        p.spun(false);
        assert_eq!(p.budget(), MAX / 2);
        for _ in 0..5 {
            p.spun(false);
        }
        assert_eq!(p.budget(), Duration::ZERO, "sleeps at once");
        p.slept(Duration::from_millis(5)); // work came late: spinning would not have helped
        assert_eq!(p.budget(), Duration::ZERO);
        p.slept(Duration::from_micros(2)); // work came soon: spin again, an eighth at least
        assert_eq!(p.budget(), MAX / 8);
        p.slept(Duration::from_micros(15)); // a spin of twice the gap would have caught it
        assert_eq!(p.budget(), Duration::from_micros(30));
        p.slept(Duration::from_micros(5)); // never shrinks the budget
        assert_eq!(p.budget(), Duration::from_micros(30));
        p.spun(true);
        assert_eq!(p.budget(), MAX, "grows back while spins pay off");
    }

    #[test]
    fn a_zero_maximum_never_spins() {
        let mut p = AdaptiveSpin::new(Duration::ZERO);
        assert_eq!(p.budget(), Duration::ZERO);
        p.spun(true);
        p.slept(Duration::ZERO);
        assert_eq!(p.budget(), Duration::ZERO);
    }

    #[test]
    fn a_pause_hints_during_the_plain_spin_and_yields_after_it() {
        let mut hour = PollPause::with_plain(Duration::from_secs(3600));
        assert!(!hour.pause() && !hour.pause());
        let mut none = PollPause::with_plain(Duration::ZERO);
        assert!(none.pause() && none.pause());
    }
}
