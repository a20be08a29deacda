//! The lease rules as pure decisions over what was read and `now` (no I/O, no clock): when a
//! client may use a node ([`Holder`]) and when the server's reaper expires a client
//! ([`Reaper`]). Both sides call these; the simulated-time tests below drive them together
//! over random schedules (renewal round trips, lost renewals, freezes, reaper phases) and
//! check the one invariant the pool rests on: a client never uses a node at a time when the
//! server may already have taken its chunks back.
//!
//! The timeline (docs/RELIABILITY.md, "Failure model of the remote pool"), with `L` the lease:
//! a client renews every `L/4`; it may use a node until `3L/4` after *sending* the last renewal
//! that came back intact; the server expires it once a heartbeat value it read stays unchanged
//! for more than `L` after it first read it. The heartbeat changes when the renewal executes,
//! after it was sent, and the server first reads the new value after that, so the server's
//! earliest expiry is more than `L` after the send: at least `L/4` after the client stopped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A client's view of its lease on one node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder {
    lease: Duration,
    /// When the newest renewal that came back intact was sent.
    renewed_from: Instant,
    /// Until when the node may be used: three quarters of a lease after `renewed_from`
    /// (kept beside it: every operation asks).
    usable_until: Instant,
}

impl Holder {
    /// A lease of `lease` taken at `now` (the slot was claimed, or taken over, after `now`).
    pub(crate) fn new(lease: Duration, now: Instant) -> Self {
        Self {
            lease,
            renewed_from: now,
            usable_until: usable_until(lease, now),
        }
    }

    /// A renewal sent at `sent` came back intact (the heartbeat was what this client left).
    pub(crate) fn renewed(&mut self, sent: Instant) {
        self.renewed_from = self.renewed_from.max(sent);
        self.usable_until = usable_until(self.lease, self.renewed_from);
    }

    /// How long ago the newest intact renewal was sent.
    pub(crate) fn since(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.renewed_from)
    }

    /// Whether the node may be used at `now`: within three quarters of a lease of the newest
    /// intact renewal's sending.
    pub(crate) fn may_use(&self, now: Instant) -> bool {
        now <= self.usable_until
    }

    /// How often to renew.
    pub(crate) fn renew_every(&self) -> Duration {
        self.lease / 4
    }
}

/// Three quarters of `lease` after `renewed_from` (at `renewed_from` itself if that is past
/// what an `Instant` holds: the node is then usable only until the next renewal).
fn usable_until(lease: Duration, renewed_from: Instant) -> Instant {
    renewed_from
        .checked_add(lease * 3 / 4)
        .unwrap_or(renewed_from)
}

/// The server's view of its clients' heartbeats, slot by slot.
#[derive(Debug)]
pub(crate) struct Reaper {
    lease: Duration,
    /// slot -> (owner, heartbeat, when this pair was first read).
    seen: HashMap<u64, (u64, u64, Instant)>,
}

impl Reaper {
    /// A reaper for leases of `lease`.
    pub(crate) fn new(lease: Duration) -> Self {
        Self {
            lease,
            seen: HashMap::new(),
        }
    }

    /// How often the server reads the slots.
    pub(crate) fn tick(&self) -> Duration {
        (self.lease / 4).max(Duration::from_millis(5))
    }

    /// Slot `slot` read at `now` as `owner` (0: free) with heartbeat `beat`: true when that
    /// owner's lease has expired (its heartbeat stood still for more than a lease since it
    /// was first read). The caller then reclaims and clears the slot.
    pub(crate) fn observe(&mut self, slot: u64, owner: u64, beat: u64, now: Instant) -> bool {
        if owner == 0 {
            self.seen.remove(&slot);
            return false;
        }
        match self.seen.get(&slot) {
            Some(&(o, b, since)) if o == owner && b == beat => {
                if now.saturating_duration_since(since) > self.lease {
                    self.seen.remove(&slot);
                    return true;
                }
                false
            }
            _ => {
                self.seen.insert(slot, (owner, beat, now));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One simulated run: a client renewing on one node, the server's reaper reading its
    /// slot, all in virtual time (milliseconds from `t0`).
    #[derive(Debug, Clone)]
    struct Schedule {
        lease_ms: u64,
        /// Per renewal: round trip (ms), when the heartbeat's fetch-and-add executes within
        /// it (fraction), and whether the answer is lost.
        renewals: Vec<(u64, f64, bool)>,
        /// The client is frozen (sends nothing, checks nothing) over [start, end).
        freeze: (u64, u64),
        /// The reaper's first read, in ms.
        reaper_phase: u64,
    }

    fn schedules() -> impl Strategy<Value = Schedule> {
        (10u64..3000).prop_flat_map(|lease_ms| {
            let renewal = (0..lease_ms, 0.0f64..=1.0, proptest::bool::weighted(0.1));
            (
                Just(lease_ms),
                proptest::collection::vec(renewal, 1..64),
                (0..lease_ms * 8, 0..lease_ms * 3),
                0..lease_ms,
            )
                .prop_map(|(lease_ms, renewals, (fs, flen), reaper_phase)| Schedule {
                    lease_ms,
                    renewals,
                    freeze: (fs, fs + flen),
                    reaper_phase,
                })
        })
    }

    /// Runs `s`; returns (the times the client found the node usable, when the server
    /// expired the client, if it did), in ms.
    fn run(s: &Schedule) -> (Vec<u64>, Option<u64>) {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let lease = Duration::from_millis(s.lease_ms);
        let mut holder = Holder::new(lease, t0);
        let every = holder.renew_every().as_millis() as u64;
        let frozen = |ms: u64| ms >= s.freeze.0 && ms < s.freeze.1;
        // The client's renewals: sent every L/4 while not frozen (a renewal waits for the
        // previous one's answer, as each node's does).
        let mut beats: Vec<u64> = Vec::new(); // when each fetch-and-add executed
        let mut answers: Vec<(u64, u64)> = Vec::new(); // (completion, sent) of intact ones
        let mut send = 0u64;
        for &(rtt, exec, lost) in &s.renewals {
            while frozen(send) {
                send = s.freeze.1;
            }
            let executed = send + (rtt as f64 * exec) as u64;
            beats.push(executed);
            if !lost {
                answers.push((send + rtt, send));
            }
            send = (send + rtt).max(send + every.max(1));
        }
        let end = send + s.lease_ms * 3;
        // The reaper: reads the heartbeat at its ticks; after expiry the slot is cleared.
        let mut reaper = Reaper::new(lease);
        let tick = reaper.tick().as_millis() as u64;
        let mut expired = None;
        let mut t = s.reaper_phase;
        while t <= end && expired.is_none() {
            let beat = beats.iter().filter(|&&b| b <= t).count() as u64;
            if reaper.observe(0, 7, beat, at(t)) {
                expired = Some(t);
            }
            t += tick;
        }
        // The client's checks, every millisecond it is not frozen: a renewal that executed
        // after the expiry found the heartbeat zeroed (lease lost) and does not count.
        let mut usable = Vec::new();
        let mut next_answer = 0;
        let mut sorted = answers.clone();
        sorted.sort();
        for ms in 0..=end {
            while next_answer < sorted.len() && sorted[next_answer].0 <= ms {
                let (_, sent) = sorted[next_answer];
                let executed_after_expiry = expired.is_some_and(|e| {
                    beats
                        .iter()
                        .any(|&b| b >= sent && b <= sorted[next_answer].0 && b > e)
                });
                if !executed_after_expiry {
                    holder.renewed(at(sent));
                }
                next_answer += 1;
            }
            if !frozen(ms) && holder.may_use(at(ms)) {
                usable.push(ms);
            }
        }
        (usable, expired)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the round trips, lost answers, freezes and reaper phase: the client never
        /// finds the node usable at or after the moment the server expired it, and stopped
        /// at least a quarter lease before (minus the reaper's millisecond granularity).
        #[test]
        fn a_client_never_uses_a_node_after_the_server_may_reclaim(s in schedules()) {
            let (usable, expired) = run(&s);
            if let Some(e) = expired {
                let last = usable.iter().copied().filter(|&u| u < e).max();
                prop_assert!(usable.iter().all(|&u| u < e), "used at or after expiry {e}: {s:?}");
                if let Some(last) = last {
                    prop_assert!(
                        e - last >= s.lease_ms / 4 - 1,
                        "margin {} ms < L/4 = {} ms: {s:?}", e - last, s.lease_ms / 4
                    );
                }
            }
        }
    }

    #[test]
    fn a_client_that_renews_in_time_is_never_expired() {
        // Round trips well inside a quarter lease, nothing lost, no freeze.
        let s = Schedule {
            lease_ms: 2000,
            renewals: vec![(40, 0.5, false); 200],
            freeze: (0, 0),
            reaper_phase: 123,
        };
        let (usable, expired) = run(&s);
        assert!(expired.is_none() || expired > usable.last().copied());
        let last_send = 200 * 500;
        assert!(expired.is_none_or(|e| e > last_send), "{expired:?}");
    }

    #[test]
    fn a_frozen_client_stops_before_the_server_expires_it() {
        // Frozen from 1 s to 5 s with a 2 s lease: the server expires it during the freeze,
        // and the client, waking, must not use the node.
        let s = Schedule {
            lease_ms: 2000,
            renewals: vec![(10, 0.5, false); 40],
            freeze: (1000, 5000),
            reaper_phase: 0,
        };
        let (usable, expired) = run(&s);
        let e = expired.expect("expired during the freeze");
        assert!((1000..5000).contains(&e), "{e}");
        assert!(usable.iter().all(|&u| u < e));
    }

    #[test]
    fn counting_from_the_answer_instead_of_the_send_breaks_the_margin() {
        // The rule's reason: a renewal answered late (round trip near L/4) would otherwise
        // extend the client's use past the point the server counts from.
        let lease = Duration::from_millis(1000);
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        let mut reaper = Reaper::new(lease);
        // Sent at 0, executed at 1 ms, answered at 240 ms; nothing after.
        assert!(!reaper.observe(0, 7, 1, ms(2)));
        let mut by_send = Holder::new(lease, ms(0));
        by_send.renewed(ms(0));
        let mut by_answer = Holder::new(lease, ms(0));
        by_answer.renewed(ms(240));
        // The server may expire it right after 1002 ms.
        assert!(reaper.observe(0, 7, 1, ms(1003)));
        assert!(!by_send.may_use(ms(760)), "3L/4 after the send");
        assert!(
            by_answer.may_use(ms(990)),
            "counting from the answer would still use it"
        );
    }
}
