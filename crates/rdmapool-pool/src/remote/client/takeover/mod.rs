//! Taking this client's lease slot on a node, as a [`Machine`] of the shared vocabulary
//! (`remote/step.rs`): it says which one-sided operation to make next, or until when to
//! wait, and decides from what that operation read and `now`, a value it is given. The
//! driver (`Shared::take_slot`) performs the steps, the pool's simulated cluster too, on
//! its [`SimRegion`](crate::remote::sim::SimRegion); the tests below feed its decisions
//! (`on_*`, what it waits for: [`Pending`]) against a simulated slot, a simulated old holder
//! and the server's [`Reaper`] in virtual time.
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

use crate::remote::layout::{self, Layout};
use crate::remote::step::{Answer, Io, Machine, Step};
use crate::{Error, Result};
use std::time::{Duration, Instant};

/// The heartbeat after `beat` (a renewal's swap): never 0, which means "expired".
pub(crate) fn next_beat(beat: u64) -> u64 {
    beat.wrapping_add(1).max(1)
}

/// How often a held slot's heartbeat is read while it is watched.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(5);

/// What the machine waits for: the operation it asks for next, or how it ended. Its
/// [`Machine`] steps say the same in the shared vocabulary; the tests and the lease fuzz
/// target also read it directly and feed the `on_*` decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
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
    next: Pending,
    /// Run as a machine: the node, its layout, and whether it is isolated (the server gave
    /// the id its slot at setup and owns the owner words: a claim reads the owner word,
    /// which must be the id, instead of swapping it).
    on: Option<(u32, Layout, bool)>,
    /// When the last renewal was asked for (the lease counts from it).
    renew_asked: Option<Instant>,
}

/// How a takeover run as a [`Machine`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The slot's region offset.
    pub(crate) slot_at: u64,
    /// Its heartbeat now.
    pub(crate) beat: u64,
    /// When the renewal that took it was asked for: the lease counts from then (a takeover
    /// watches for half a lease; counting from before it would leave a quarter to recover).
    pub(crate) renewed: Option<Instant>,
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
            next: Pending::ReadOwners,
            on: None,
            renew_asked: None,
        };
        if slots == 0 {
            t.done(Pending::Full);
        }
        t
    }

    /// The same takeover, run as a [`Machine`] on node `node` laid out as `layout`
    /// (`isolated`: the server's record gave the id its slot, see [`Takeover`]'s fields).
    pub(crate) fn on_node(mut self, node: u32, layout: Layout, isolated: bool) -> Self {
        self.on = Some((node, layout, isolated));
        self
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

    /// What it waits for now (the tests and the lease fuzz target feed the `on_*`
    /// decisions by hand).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn pending(&self) -> Pending {
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
            Pending::Full
        } else {
            Pending::Claim { slot: self.slot() }
        };
    }

    fn done(&mut self, step: Pending) {
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
            self.next = Pending::ReadBeat { slot, at: now };
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
                self.next = Pending::ReadBeat {
                    slot,
                    at: now + WATCH_EVERY,
                };
            }
            Some(b) if b != beat => {
                self.state = State::Moved { beat };
                self.next = Pending::ReadOwner { slot };
            }
            // A heartbeat that stood at 0 is a lease being expired (a live holder's is never
            // 0), not one to take over: claim again until the server releases the slot.
            Some(0) if now.saturating_duration_since(since) >= self.lease / 2 => self.probe(),
            Some(b) if now.saturating_duration_since(since) >= self.lease / 2 => {
                self.renew(slot, b, next_beat(b));
            }
            Some(_) => {
                self.next = Pending::ReadBeat {
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
            self.done(Pending::InUse);
        } else {
            // The server expired the old lease and cleared the slot: claim it afresh.
            self.probe();
        }
    }

    fn renew(&mut self, slot: u64, expected: u64, new: u64) {
        self.state = State::Renewing { expected, new };
        self.next = Pending::Renew {
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
            self.done(Pending::Taken { slot, beat: new });
        } else {
            // Expired (zeroed) between the last look and the renewal, or (claimed afresh) a
            // heartbeat already moving: the slot and its chunks are not this id's as it
            // thought. Claim again.
            self.probe();
        }
    }
}

impl Machine for Takeover {
    type Output = Taken;
    type Context = ();

    fn advance(&mut self, _: &mut (), now: Instant, answers: &[Answer]) -> Result<Step<Taken>> {
        let Some((node, l, isolated)) = self.on else {
            return Err(Error::Core(crate::CoreError::Malformed {
                what: "lease slot takeover",
                reason: "run as a machine without its node (Takeover::on_node)".into(),
            }));
        };
        if let Some(answer) = answers.first() {
            if answer.failed() {
                return Err(Error::NodeDown {
                    node,
                    reason: "an operation on its lease slots failed".into(),
                });
            }
            match self.next {
                Pending::ReadOwners => {
                    let per_slot = (layout::CLIENT_SLOT / 8) as usize;
                    let owners: Vec<u64> = answer.words().into_iter().step_by(per_slot).collect();
                    self.on_owners(&owners);
                }
                Pending::Claim { slot } => {
                    let old = answer.word();
                    if isolated && old != self.id {
                        return Err(Error::NodeDown {
                            node,
                            reason: format!(
                                "slot {slot} the server gave client {} names {old:#x} (its \
                                 lease ended during setup; connect again)",
                                self.id
                            ),
                        });
                    }
                    self.on_claim(old, now);
                }
                Pending::ReadBeat { .. } => self.on_beat(answer.word(), now),
                Pending::ReadOwner { .. } => self.on_owner(answer.word()),
                Pending::Renew { .. } => self.on_renewed(answer.word()),
                Pending::Taken { .. } | Pending::InUse | Pending::Full => {}
            }
        }
        let io = match self.next {
            Pending::ReadOwners => Io::Read {
                at: l.client_slot(0),
                len: l.client_count * layout::CLIENT_SLOT,
            },
            Pending::Claim { slot } => {
                let at = l.client_slot(slot) + layout::slot::OWNER;
                if isolated {
                    Io::Read { at, len: 8 }
                } else {
                    Io::Cas {
                        at,
                        expected: 0,
                        swap: self.id,
                    }
                }
            }
            Pending::ReadBeat { at, .. } if now < at => return Ok(Step::Sleep(at)),
            Pending::ReadBeat { slot, .. } => Io::Read {
                at: l.client_slot(slot) + 8,
                len: 8,
            },
            Pending::ReadOwner { slot } => Io::Read {
                at: l.client_slot(slot),
                len: 8,
            },
            Pending::Renew {
                slot,
                expected,
                new,
            } => {
                // Renewed at once: a short-lived client that exits before its lease
                // thread's first round still leaves a heartbeat the reaper has seen move.
                self.renew_asked = Some(now);
                Io::Cas {
                    at: l.client_slot(slot) + 8,
                    expected,
                    swap: new,
                }
            }
            Pending::Taken { slot, beat } => {
                return Ok(Step::Done(Taken {
                    slot_at: l.client_slot(slot),
                    beat,
                    renewed: self.renew_asked,
                }))
            }
            Pending::InUse => return Err(Error::ClientIdInUse { id: self.id, node }),
            Pending::Full => {
                return Err(Error::LeasesFull {
                    node,
                    slots: l.client_count,
                })
            }
        };
        Ok(Step::one(node, io))
    }
}

#[cfg(test)]
mod tests;
