//! Taking this client's lease slot on a node, as a state machine without I/O: it says which
//! one-sided operation to make next ([`Step`]) and decides from what that operation read and
//! `now`. The driver (`Shared::take_slot`) performs the steps; the tests below run it
//! against a simulated slot, a simulated old holder and the server's [`Reaper`] in virtual
//! time.
//!
//! The rules: read every slot's owner word; if one holds the id (an earlier run's slot), that
//! is the slot. Else probe slots from a hash of the id for one whose owner word can be
//! swapped from 0 to the id. A slot that already holds the id belongs to an earlier run of this client
//! (a restart) or to a live client with the same id: watch its heartbeat for half a lease;
//! if it moves, a live client renews it (`ClientIdInUse`), unless the server cleared the slot
//! meanwhile (the old lease expired: claim it afresh). If it stands still, take it over with
//! a compare-and-swap of the heartbeat from the value watched to the next: if the server
//! expired the old lease between the last look and the swap, the slot is no longer this
//! id's (its chunks are gone too) and it must be claimed afresh. A slot claimed afresh gets
//! a random non-zero heartbeat: every renewal is a compare-and-swap from the value this
//! client left, and a slot that was expired and claimed by another client since never holds
//! that value (its heartbeat counts from another random start), so the renewal fails
//! instead of being taken for this client's own.

use std::time::{Duration, Instant};

/// The heartbeat after `beat` (a renewal's swap): never 0, which means "expired".
pub(crate) fn next_beat(beat: u64) -> u64 {
    beat.wrapping_add(1).max(1)
}

/// How often a held slot's heartbeat is read while it is watched.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(5);

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Read the owner word of every slot; feed them, in slot order, to
    /// [`Takeover::on_owners`].
    ReadOwners,
    /// Compare-and-swap slot `slot`'s owner word from 0 to the id; feed the old value to
    /// [`Takeover::on_claim`].
    Claim { slot: u64 },
    /// Read slot `slot`'s heartbeat, not before `at`; feed it to [`Takeover::on_beat`].
    ReadBeat { slot: u64, at: Instant },
    /// Read slot `slot`'s owner word; feed it to [`Takeover::on_owner`].
    ReadOwner { slot: u64 },
    /// Compare-and-swap slot `slot`'s heartbeat from `expected` to `new`; feed the old value
    /// to [`Takeover::on_renewed`].
    Renew { slot: u64, expected: u64, new: u64 },
    /// Done: the slot is this client's, its heartbeat is `beat` now.
    Taken { slot: u64, beat: u64 },
    /// A live client holds the id.
    InUse,
    /// Every slot holds another client.
    Full,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Looking for a slot that already holds the id.
    Scan,
    /// Claim the slot at probe position `k`.
    Probe,
    /// The slot holds the id: watch its heartbeat (`before`, first read at `since`).
    Watch { before: Option<u64>, since: Instant },
    /// The heartbeat moved (to `beat`): is the owner still the id?
    Moved { beat: u64 },
    /// Swapping the heartbeat from `expected` to `new` (a slot claimed afresh: from 0 to the
    /// random start; taken over: from the watched value to the next).
    Renewing { expected: u64, new: u64 },
    /// Ended: `next` says how.
    Done,
}

/// Taking a lease slot (see the module docs).
#[derive(Debug)]
pub(crate) struct Takeover {
    id: u64,
    lease: Duration,
    slots: u64,
    start: u64,
    /// The heartbeat a slot claimed afresh starts at (random, non-zero).
    base: u64,
    k: u64,
    /// Slots the owner scan saw held by another id: not probed (a pool whose slots are all
    /// taken is `Full` after one READ, not after a CAS per slot).
    taken: Vec<bool>,
    state: State,
    next: Step,
}

impl Takeover {
    /// Takes one of `slots` slots for `id`, probing from `start`, under leases of `lease`; a
    /// slot claimed afresh gets the heartbeat `base` (random, non-zero; 1 if 0 is given).
    pub(crate) fn new(id: u64, lease: Duration, slots: u64, start: u64, base: u64) -> Self {
        let mut t = Self {
            id,
            lease,
            slots,
            start,
            base: base.max(1),
            k: 0,
            taken: Vec::new(),
            state: State::Scan,
            next: Step::ReadOwners,
        };
        if slots == 0 {
            t.done(Step::Full);
        }
        t
    }

    /// Every slot's owner word, in slot order. A slot that holds the id already (an earlier
    /// run's) is the one to take over: claiming a free one instead would leave the id in
    /// two slots, and when the old one expired the server would take back the chunks of
    /// the id, the new run's among them.
    pub(crate) fn on_owners(&mut self, owners: &[u64]) {
        if !matches!(self.state, State::Scan) {
            return;
        }
        self.taken = (0..self.slots as usize)
            .map(|i| owners.get(i).is_some_and(|&o| o != 0 && o != self.id))
            .collect();
        if let Some(slot) = owners
            .iter()
            .take(self.slots as usize)
            .position(|&o| o == self.id)
        {
            // Probe from there (and on round the table if it is not ours any more).
            self.start = slot as u64;
            self.k = 0;
        }
        self.probe();
    }

    /// The next step.
    pub(crate) fn step(&self) -> Step {
        self.next
    }

    fn slot(&self) -> u64 {
        (self.start + self.k) % self.slots.max(1)
    }

    fn probe(&mut self) {
        while self.k < self.slots && self.taken.get(self.slot() as usize) == Some(&true) {
            self.k += 1;
        }
        self.state = State::Probe;
        self.next = if self.k >= self.slots {
            Step::Full
        } else {
            Step::Claim { slot: self.slot() }
        };
    }

    fn done(&mut self, step: Step) {
        self.state = State::Done;
        self.next = step;
    }

    /// The owner word the claim replaced, read at `now`.
    pub(crate) fn on_claim(&mut self, old: u64, now: Instant) {
        let slot = self.slot();
        if old == 0 {
            self.renew(slot, 0, self.base);
        } else if old == self.id {
            self.state = State::Watch {
                before: None,
                since: now,
            };
            self.next = Step::ReadBeat { slot, at: now };
        } else {
            self.k += 1;
            self.probe();
        }
    }

    /// The heartbeat of the watched slot, read at `now`.
    pub(crate) fn on_beat(&mut self, beat: u64, now: Instant) {
        let State::Watch { before, since } = self.state else {
            return;
        };
        let slot = self.slot();
        match before {
            None => {
                self.state = State::Watch {
                    before: Some(beat),
                    since: now,
                };
                self.next = Step::ReadBeat {
                    slot,
                    at: now + WATCH_EVERY,
                };
            }
            Some(b) if b != beat => {
                self.state = State::Moved { beat };
                self.next = Step::ReadOwner { slot };
            }
            // A heartbeat that stood at 0 is a lease being expired (a live holder's is never
            // 0), not one to take over: claim again until the server releases the slot.
            Some(0) if now.saturating_duration_since(since) >= self.lease / 2 => self.probe(),
            Some(b) if now.saturating_duration_since(since) >= self.lease / 2 => {
                self.renew(slot, b, next_beat(b));
            }
            Some(_) => {
                self.next = Step::ReadBeat {
                    slot,
                    at: now + WATCH_EVERY,
                };
            }
        }
    }

    /// The owner word of a slot whose heartbeat moved while watched.
    pub(crate) fn on_owner(&mut self, owner: u64) {
        let State::Moved { beat } = self.state else {
            return;
        };
        if owner == self.id && beat == 0 {
            // Zeroed: the server is expiring the old lease and releases the owner word once
            // its chunks are taken back (remote/sweep.rs). Claim again until it has.
            self.probe();
        } else if owner == self.id {
            self.done(Step::InUse);
        } else {
            // The server expired the old lease and cleared the slot: claim it afresh.
            self.probe();
        }
    }

    fn renew(&mut self, slot: u64, expected: u64, new: u64) {
        self.state = State::Renewing { expected, new };
        self.next = Step::Renew {
            slot,
            expected,
            new,
        };
    }

    /// The heartbeat value the renewal's compare-and-swap found.
    pub(crate) fn on_renewed(&mut self, old: u64) {
        let State::Renewing { expected, new } = self.state else {
            return;
        };
        let slot = self.slot();
        if old == expected {
            self.done(Step::Taken { slot, beat: new });
        } else {
            // Expired (zeroed) between the last look and the renewal, or (claimed afresh) a
            // heartbeat already moving: the slot and its chunks are not this id's as it
            // thought. Claim again.
            self.probe();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::lease::Reaper;
    use proptest::prelude::*;

    /// One slot's words, the old holder (renewing until `dies`, in ms), the server's reaper,
    /// and the new run of the client, in virtual time.
    struct Cluster {
        owner: u64,
        beat: u64,
        reaper: Reaper,
        expired_at: Option<u64>,
        /// How long the server takes from zeroing the heartbeat to releasing the owner word
        /// (it takes the chunks back in between), and when it will.
        gap: u64,
        release_at: Option<u64>,
        lease_ms: u64,
        dies: u64,
        next_renewal: u64,
        next_tick: u64,
        t0: Instant,
    }

    const ID: u64 = 77;
    /// The random start of a heartbeat claimed afresh, in these tests.
    const BASE: u64 = 1000;

    impl Cluster {
        fn new(lease_ms: u64, dies: u64, reaper_phase: u64, gap: u64) -> Self {
            Self {
                owner: ID,
                beat: 1,
                reaper: Reaper::new(Duration::from_millis(lease_ms)),
                expired_at: None,
                gap,
                release_at: None,
                lease_ms,
                dies,
                next_renewal: 0,
                next_tick: reaper_phase,
                t0: Instant::now(),
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        /// Everything the old holder and the reaper do up to `ms`, in time order.
        fn advance(&mut self, ms: u64) {
            loop {
                let renew = (self.next_renewal < self.dies).then_some(self.next_renewal);
                let tick = self.next_tick;
                if self.release_at.is_some_and(|r| r <= ms && r <= tick) {
                    self.owner = 0;
                    self.release_at = None;
                    continue;
                }
                match renew {
                    Some(r) if r <= ms && r <= tick => {
                        if self.owner == ID {
                            self.beat += 1;
                        }
                        self.next_renewal += (self.lease_ms / 4).max(1);
                    }
                    _ if tick <= ms => {
                        if self.release_at.is_none()
                            && self.reaper.observe(0, self.owner, self.beat, self.at(tick))
                        {
                            // remote/sweep.rs: the heartbeat first, the owner word last.
                            self.beat = 0;
                            self.release_at = Some(tick + self.gap);
                            self.expired_at.get_or_insert(tick);
                        }
                        self.next_tick += self.reaper.tick().as_millis() as u64;
                    }
                    _ => return,
                }
            }
        }
    }

    /// Runs a takeover starting at `start` ms; returns its end and when it ended (ms).
    fn run(c: &mut Cluster, start: u64) -> (Step, u64) {
        let mut t = Takeover::new(ID, Duration::from_millis(c.lease_ms), 1, 0, BASE);
        let mut now = start;
        for _ in 0..100_000 {
            c.advance(now);
            match t.step() {
                Step::ReadOwners => t.on_owners(&[c.owner]),
                Step::Claim { .. } => {
                    let old = c.owner;
                    if old == 0 {
                        c.owner = ID;
                    }
                    t.on_claim(old, c.at(now));
                }
                Step::ReadBeat { at, .. } => {
                    now = now.max((at - c.t0).as_millis() as u64);
                    c.advance(now);
                    t.on_beat(c.beat, c.at(now));
                }
                Step::ReadOwner { .. } => t.on_owner(c.owner),
                Step::Renew { expected, new, .. } => {
                    let old = c.beat;
                    if old == expected {
                        c.beat = new;
                    }
                    t.on_renewed(old);
                }
                done => return (done, now),
            }
            now += 1; // every one-sided operation takes a millisecond
        }
        panic!("the takeover never ended");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whenever the old holder died (or not) and the reaper runs: a live holder is never
        /// taken over; a dead one always is; and a takeover never ends holding a slot the
        /// server cleared (its owner word is the id and the heartbeat the one it reported).
        #[test]
        fn a_takeover_never_steals_a_live_id_nor_keeps_an_expired_slot(
            lease_ms in 20u64..2000,
            dies_after in proptest::option::of(0u64..4000),
            restart_after in 0u64..4000,
            phase in 0u64..500,
            gap in 0u64..50,
        ) {
            let dies = dies_after.unwrap_or(u64::MAX);
            let mut c = Cluster::new(lease_ms, dies, phase % lease_ms.max(1), gap);
            let start = dies.saturating_add(restart_after).min(8000);
            let (end, _) = run(&mut c, start);
            if dies_after.is_none() {
                prop_assert_eq!(end, Step::InUse, "a live holder's id was taken");
            } else {
                let Step::Taken { beat, .. } = end else {
                    return Err(TestCaseError::fail(format!("a dead holder's slot was not taken: {end:?}")));
                };
                prop_assert_eq!(c.owner, ID, "taken, but the slot is not the id's");
                prop_assert_eq!(c.beat, beat, "taken, but the heartbeat is not ours");
            }
        }
    }

    #[test]
    fn the_lease_expiring_between_the_watch_and_the_renewal_is_claimed_afresh() {
        // The watch sees the heartbeat stand still, the server expires the slot, then the
        // renewal adds to a zeroed heartbeat: the slot is no longer ours, claim it again.
        let lease = Duration::from_millis(100);
        let t0 = Instant::now();
        let mut t = Takeover::new(ID, lease, 1, 0, BASE);
        t.on_owners(&[ID]);
        t.on_claim(ID, t0);
        t.on_beat(41, t0);
        t.on_beat(41, t0 + Duration::from_millis(60));
        assert_eq!(
            t.step(),
            Step::Renew {
                slot: 0,
                expected: 41,
                new: 42
            }
        );
        t.on_renewed(0); // zeroed by the server meanwhile
        assert_eq!(t.step(), Step::Claim { slot: 0 });
        t.on_claim(0, t0 + Duration::from_millis(61));
        assert_eq!(
            t.step(),
            Step::Renew {
                slot: 0,
                expected: 0,
                new: BASE
            }
        );
        t.on_renewed(0);
        assert_eq!(
            t.step(),
            Step::Taken {
                slot: 0,
                beat: BASE
            }
        );
    }

    #[test]
    fn a_heartbeat_zeroed_while_the_owner_word_still_holds_the_id_is_waited_out() {
        // The server zeroes the heartbeat first and releases the owner word only once the
        // chunks are back: that is an expiry in progress, not a live client (InUse), and not
        // a slot to take over (its chunks are being taken back).
        let lease = Duration::from_millis(100);
        let t0 = Instant::now();
        let ms = |m| t0 + Duration::from_millis(m);
        let mut t = Takeover::new(ID, lease, 1, 0, BASE);
        t.on_owners(&[ID]);
        t.on_claim(ID, ms(0));
        t.on_beat(41, ms(0));
        t.on_beat(0, ms(5));
        assert_eq!(t.step(), Step::ReadOwner { slot: 0 });
        t.on_owner(ID);
        assert_eq!(
            t.step(),
            Step::Claim { slot: 0 },
            "claimed again, not InUse"
        );
        // Still (ID, 0): watched, and a heartbeat standing at 0 is not taken over.
        t.on_claim(ID, ms(6));
        t.on_beat(0, ms(6));
        t.on_beat(0, ms(60));
        assert_eq!(
            t.step(),
            Step::Claim { slot: 0 },
            "claimed again, not taken over"
        );
        // Released: claimed afresh.
        t.on_claim(0, ms(61));
        t.on_renewed(0);
        assert_eq!(
            t.step(),
            Step::Taken {
                slot: 0,
                beat: BASE
            }
        );
    }

    #[test]
    fn a_slot_expired_and_claimed_by_another_client_is_never_renewed_as_ours() {
        // Two clients' heartbeats counted from 1 in the same slot: the old holder's renewal
        // found the value it expected (the new holder's count had reached it) and went on
        // using chunks the server had taken back. Starts are random now, and renewals swap.
        let mut t = Takeover::new(ID, Duration::from_secs(2), 1, 0, 5);
        t.on_owners(&[0]);
        t.on_claim(0, Instant::now());
        t.on_renewed(0);
        assert_eq!(t.step(), Step::Taken { slot: 0, beat: 5 });
        let mut u = Takeover::new(78, Duration::from_secs(2), 1, 0, 9);
        u.on_owners(&[0]);
        u.on_claim(0, Instant::now());
        assert_eq!(
            u.step(),
            Step::Renew {
                slot: 0,
                expected: 0,
                new: 9
            }
        );
        assert_eq!(next_beat(u64::MAX), 1, "a heartbeat never wraps to 0");
    }

    #[test]
    fn the_slot_holding_the_id_is_taken_over_even_past_a_free_one() {
        // Probing from slot 0 would find slot 1 free before the earlier run's slot 3; the
        // id would then hold two slots, and the old one's expiry take the new run's chunks.
        let mut t = Takeover::new(ID, Duration::from_secs(2), 4, 0, BASE);
        t.on_owners(&[5, 0, 6, ID]);
        assert_eq!(t.step(), Step::Claim { slot: 3 });
        let mut t = Takeover::new(ID, Duration::from_secs(2), 4, 2, BASE);
        t.on_owners(&[ID, 0, 6, 5]);
        assert_eq!(t.step(), Step::Claim { slot: 0 });
        let mut t = Takeover::new(ID, Duration::from_secs(2), 4, 2, BASE);
        t.on_owners(&[5, 0, 0, 5]);
        assert_eq!(
            t.step(),
            Step::Claim { slot: 2 },
            "none holds it: probe from the hash"
        );
    }

    #[test]
    fn a_slot_of_the_id_lost_before_the_claim_still_leaves_every_other_slot_to_probe() {
        // Found by the pool_lease fuzz target: the scan saw the id in slot 2 of 3, the claim
        // found another client there, and the probe, counted from the hash (slot 0), ended
        // without trying slot 0.
        let mut t = Takeover::new(ID, Duration::from_secs(2), 3, 0, BASE);
        t.on_owners(&[0, 78, ID]);
        assert_eq!(t.step(), Step::Claim { slot: 2 });
        t.on_claim(78, Instant::now());
        assert_eq!(
            t.step(),
            Step::Claim { slot: 0 },
            "slot 0 was free in the scan"
        );
    }

    #[test]
    fn a_pool_whose_slots_are_all_taken_is_full_after_one_read() {
        // Issue #22: a server with many slots all answering "taken" made the client probe
        // CAS after CAS; the owner scan decides it at once.
        let mut t = Takeover::new(ID, Duration::from_secs(2), 1000, 17, BASE);
        t.on_owners(&[9; 1000]);
        assert_eq!(t.step(), Step::Full);
        // Slots seen taken are not probed; one seen free is, even far from the hash.
        let mut t = Takeover::new(ID, Duration::from_secs(2), 1000, 17, BASE);
        let mut owners = [9; 1000];
        owners[3] = 0;
        t.on_owners(&owners);
        assert_eq!(t.step(), Step::Claim { slot: 3 });
    }

    #[test]
    fn slots_of_others_are_skipped_and_a_full_pool_says_so() {
        let t0 = Instant::now();
        let mut t = Takeover::new(ID, Duration::from_secs(2), 3, 2, BASE);
        assert_eq!(t.step(), Step::ReadOwners);
        t.on_owners(&[0, 0, 0]); // all free when scanned, taken by the time of the claims
        assert_eq!(t.step(), Step::Claim { slot: 2 });
        t.on_claim(5, t0);
        assert_eq!(t.step(), Step::Claim { slot: 0 });
        t.on_claim(6, t0);
        t.on_claim(7, t0);
        assert_eq!(t.step(), Step::Full);
    }
}
