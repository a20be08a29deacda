//! The takeover against a simulated slot, old holder and reaper in virtual time, and its
//! corner cases one by one.

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
fn run(c: &mut Cluster, start: u64) -> (Pending, u64) {
    let mut t = Takeover::new(ID, Duration::from_millis(c.lease_ms), 1, 0, BASE);
    let mut now = start;
    for _ in 0..100_000 {
        c.advance(now);
        match t.pending() {
            Pending::ReadOwners => t.on_owners(&[c.owner]),
            Pending::Claim { .. } => {
                let old = c.owner;
                if old == 0 {
                    c.owner = ID;
                }
                t.on_claim(old, c.at(now));
            }
            Pending::ReadBeat { at, .. } => {
                now = now.max((at - c.t0).as_millis() as u64);
                c.advance(now);
                t.on_beat(c.beat, c.at(now));
            }
            Pending::ReadOwner { .. } => t.on_owner(c.owner),
            Pending::Renew { expected, new, .. } => {
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
            prop_assert_eq!(end, Pending::InUse, "a live holder's id was taken");
        } else {
            let Pending::Taken { beat, .. } = end else {
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
        t.pending(),
        Pending::Renew {
            slot: 0,
            expected: 41,
            new: 42
        }
    );
    t.on_renewed(0); // zeroed by the server meanwhile
    assert_eq!(t.pending(), Pending::Claim { slot: 0 });
    t.on_claim(0, t0 + Duration::from_millis(61));
    assert_eq!(
        t.pending(),
        Pending::Renew {
            slot: 0,
            expected: 0,
            new: BASE
        }
    );
    t.on_renewed(0);
    assert_eq!(
        t.pending(),
        Pending::Taken {
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
    assert_eq!(t.pending(), Pending::ReadOwner { slot: 0 });
    t.on_owner(ID);
    assert_eq!(
        t.pending(),
        Pending::Claim { slot: 0 },
        "claimed again, not InUse"
    );
    // Still (ID, 0): watched, and a heartbeat standing at 0 is not taken over.
    t.on_claim(ID, ms(6));
    t.on_beat(0, ms(6));
    t.on_beat(0, ms(60));
    assert_eq!(
        t.pending(),
        Pending::Claim { slot: 0 },
        "claimed again, not taken over"
    );
    // Released: claimed afresh.
    t.on_claim(0, ms(61));
    t.on_renewed(0);
    assert_eq!(
        t.pending(),
        Pending::Taken {
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
    assert_eq!(t.pending(), Pending::Taken { slot: 0, beat: 5 });
    let mut u = Takeover::new(78, Duration::from_secs(2), 1, 0, 9);
    u.on_owners(&[0]);
    u.on_claim(0, Instant::now());
    assert_eq!(
        u.pending(),
        Pending::Renew {
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
    assert_eq!(t.pending(), Pending::Claim { slot: 3 });
    let mut t = Takeover::new(ID, Duration::from_secs(2), 4, 2, BASE);
    t.on_owners(&[ID, 0, 6, 5]);
    assert_eq!(t.pending(), Pending::Claim { slot: 0 });
    let mut t = Takeover::new(ID, Duration::from_secs(2), 4, 2, BASE);
    t.on_owners(&[5, 0, 0, 5]);
    assert_eq!(
        t.pending(),
        Pending::Claim { slot: 2 },
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
    assert_eq!(t.pending(), Pending::Claim { slot: 2 });
    t.on_claim(78, Instant::now());
    assert_eq!(
        t.pending(),
        Pending::Claim { slot: 0 },
        "slot 0 was free in the scan"
    );
}

#[test]
fn a_pool_whose_slots_are_all_taken_is_full_after_one_read() {
    // Issue #22: a server with many slots all answering "taken" made the client probe
    // CAS after CAS; the owner scan decides it at once.
    let mut t = Takeover::new(ID, Duration::from_secs(2), 1000, 17, BASE);
    t.on_owners(&[9; 1000]);
    assert_eq!(t.pending(), Pending::Full);
    // Slots seen taken are not probed; one seen free is, even far from the hash.
    let mut t = Takeover::new(ID, Duration::from_secs(2), 1000, 17, BASE);
    let mut owners = [9; 1000];
    owners[3] = 0;
    t.on_owners(&owners);
    assert_eq!(t.pending(), Pending::Claim { slot: 3 });
}

#[test]
fn slots_of_others_are_skipped_and_a_full_pool_says_so() {
    let t0 = Instant::now();
    let mut t = Takeover::new(ID, Duration::from_secs(2), 3, 2, BASE);
    assert_eq!(t.pending(), Pending::ReadOwners);
    t.on_owners(&[0, 0, 0]); // all free when scanned, taken by the time of the claims
    assert_eq!(t.pending(), Pending::Claim { slot: 2 });
    t.on_claim(5, t0);
    assert_eq!(t.pending(), Pending::Claim { slot: 0 });
    t.on_claim(6, t0);
    t.on_claim(7, t0);
    assert_eq!(t.pending(), Pending::Full);
}
