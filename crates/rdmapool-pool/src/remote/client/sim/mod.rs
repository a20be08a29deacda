//! A simulated cluster for the client's machines, in virtual time: one node's region (the
//! [`SimRegion`] the store's simulations use too), the server's sweep (`remote/sweep.rs`) every quarter lease, and several
//! clients taking their slots ([`Takeover`]), recovering ([`Recover`]), allocating and
//! freeing ([`Alloc`], [`Free`]) one one-sided operation at a time, renewing their leases
//! and checking them ([`Holder`]) as the real client does. A proptest chooses the order and
//! the faults: clients frozen past their lease, crashed and restarted with the same id,
//! connections lost with an operation's answer, the server restarted with the same node id.
//!
//! The oracle is the pool's promise. Each client writes its own tag into every object it
//! allocates and checks it whenever it looks: a client never finds another's bytes in an
//! object it holds and may use, no object is handed to a client while another that may
//! still use it holds it, a restarted client recovers exactly what its predecessor held
//! (nothing, if the server expired the id meanwhile), and a pointer into a restarted
//! server's old memory is refused as stale.

use super::chunks::{Alloc, Answer, Book, Checked, Free, Io, Machine, Recover};
use super::takeover::{next_beat, Takeover};
use crate::remote::layout::hash64;
use crate::remote::layout::{self, size_class, ChunkShape, Layout};
use crate::remote::lease::{Holder, Reaper};
use crate::remote::sim::SimRegion;
use crate::remote::step::{Op, Step};
use crate::remote::sweep;
use crate::remote::RemotePtr;
use crate::Error;
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

mod life;

/// The simulated node's id.
const NODE: u32 = 1;

/// An allocation a client holds, with the tag it wrote into the object's first word.
#[derive(Debug, Clone, Copy)]
struct Held {
    ptr: RemotePtr,
    tag: u64,
}

enum Task {
    Alloc { m: Alloc, size: u64 },
    Free { m: Free, ptr: RemotePtr },
}

/// Where a client is in its life.
enum Life {
    /// Taking its slot (then recovering, then up).
    Joining {
        t: Takeover,
        /// The operation it asked for, performed at the next step.
        asked: Option<Op>,
    },
    Recovering {
        m: Recover,
        pending: Option<Io>,
    },
    Up,
    /// Its node is down for it (lease lost, connection lost): the next step restarts it.
    Down,
}

struct Client {
    id: u64,
    incarnation: u64,
    life: Life,
    book: Book,
    holder: Holder,
    slot: u64,
    beat: u64,
    next_renew: u64,
    frozen_until: u64,
    /// Its lease renewals stall (the lease thread starved, renewals lost) until then, while
    /// the client itself goes on.
    stalled_until: u64,
    held: Vec<Held>,
    /// Held objects being freed (until the free is done).
    freeing: Vec<Held>,
    /// How many times the server had expired this id when it joined.
    expiries_at_join: u64,
    /// Pointers into the server's memory before it restarted: refused as stale once joined.
    stale: Vec<RemotePtr>,
    tasks: Vec<(Task, Option<Io>)>,
    /// The next operation lands but its answer is lost with the connection.
    lose_next: bool,
    /// What the predecessor (before a crash) held and was freeing, the id's expiry count
    /// when it joined, and whether an answer of its was lost (that operation's effect is
    /// unknown).
    predecessor: Option<Predecessor>,
    lost: bool,
    seq: u64,
}

struct Predecessor {
    held: Vec<Held>,
    freeing: Vec<Held>,
    expiries_at_join: u64,
    lost: bool,
}

struct Cluster {
    lease: Duration,
    t0: Instant,
    now: u64,
    region: SimRegion,
    reaper: Reaper,
    next_sweep: u64,
    clients: Vec<Client>,
    /// Per id, how many times the server expired it.
    expiries: HashMap<u64, u64>,
    /// What happened, for the failure message.
    log: Vec<String>,
    incarnations: u64,
    /// Counts the pseudo-random heartbeat starts handed out.
    randoms: Cell<u64>,
}

const SIZES: [u64; 7] = [1, 64, 100, 1000, 5000, 16_000, 40_000];

impl Cluster {
    fn new(lease_ms: u64, clients: u64) -> Self {
        let layout = Layout::new(64 << 10 << 3, 64 << 10, 8).expect("layout");
        let lease = Duration::from_millis(lease_ms);
        let t0 = Instant::now();
        let mut c = Self {
            lease,
            t0,
            now: 0,
            region: SimRegion::new(layout, 1),
            reaper: Reaper::new(lease),
            next_sweep: 0,
            clients: Vec::new(),
            expiries: HashMap::new(),
            log: Vec::new(),
            incarnations: 1,
            randoms: Cell::new(1),
        };
        for id in 1..=clients {
            let client = c.fresh_client(id * 7, None);
            c.clients.push(client);
        }
        c
    }

    /// A heartbeat start, as `util::random_nonzero` gives the real client (deterministic
    /// here, so a failing schedule replays).
    fn random(&self) -> u64 {
        let n = self.randoms.get();
        self.randoms.set(n + 1);
        hash64(n).max(1)
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn fresh_client(&self, id: u64, predecessor: Option<Predecessor>) -> Client {
        let l = self.region.layout;
        Client {
            id,
            incarnation: self.region.incarnation,
            life: Life::Joining {
                t: Takeover::new(
                    id,
                    self.lease,
                    l.client_count,
                    hash64(id) % l.client_count,
                    self.random(),
                )
                .on_node(NODE, l, false),
                asked: None,
            },
            book: Book::new(id, NODE, self.region.incarnation, l),
            holder: Holder::new(self.lease, self.at(self.now)),
            slot: 0,
            beat: 0,
            next_renew: u64::MAX,
            frozen_until: 0,
            stalled_until: 0,
            held: Vec::new(),
            freeing: Vec::new(),
            expiries_at_join: 0,
            stale: Vec::new(),
            tasks: Vec::new(),
            lose_next: false,
            predecessor,
            lost: false,
            seq: 0,
        }
    }

    /// Lets `ms` pass: the server sweeps at its ticks, unfrozen clients renew on time.
    fn advance(&mut self, ms: u64) {
        let end = self.now + ms;
        loop {
            let renew = self
                .clients
                .iter()
                .enumerate()
                .filter(|(_, c)| matches!(c.life, Life::Up))
                .map(|(i, c)| (c.next_renew.max(c.frozen_until).max(c.stalled_until), i))
                .min();
            let sweep_at = self.next_sweep;
            match renew {
                Some((t, i)) if t <= end && t <= sweep_at => {
                    self.now = self.now.max(t);
                    self.renew(i);
                }
                _ if sweep_at <= end => {
                    self.now = self.now.max(sweep_at);
                    let at = self.at(self.now);
                    let swept = sweep::sweep(
                        &mut self.reaper,
                        &self.region.layout,
                        &self.region,
                        at,
                        sweep::Reclaim::Now,
                    );
                    for id in swept.expired {
                        *self.expiries.entry(id).or_default() += 1;
                        self.log
                            .push(format!("{} ms: server expired {id}", self.now));
                    }
                    self.next_sweep += self.reaper.tick().as_millis() as u64;
                }
                _ => break,
            }
        }
        self.now = end;
    }

    fn renew(&mut self, i: usize) {
        let now = self.now;
        let sent = self.at(now);
        let c = &mut self.clients[i];
        let next = next_beat(c.beat);
        let old = match self.region.apply(&Io::Cas {
            at: c.slot + 8,
            expected: c.beat,
            swap: next,
        }) {
            Answer::Word(w) => w,
            other => unreachable!("a heartbeat swap answered {other:?}"),
        };
        c.next_renew = now + (self.lease.as_millis() as u64 / 4).max(1);
        if old != c.beat {
            self.log
                .push(format!("{now} ms: {} lost its lease (beat {old})", c.id));
            c.life = Life::Down;
            return;
        }
        c.beat = next;
        c.holder.renewed(sent);
    }

    /// The server restarts with the same node id: fresh memory, a new incarnation; every
    /// client's connection dies and it joins the new incarnation, keeping its old pointers.
    fn restart_server(&mut self) {
        self.incarnations += 1;
        self.region = SimRegion::new(self.region.layout, self.incarnations);
        self.reaper = Reaper::new(self.lease);
        self.log.push(format!("{} ms: server restarted", self.now));
        for i in 0..self.clients.len() {
            let old = &self.clients[i];
            let mut stale: Vec<RemotePtr> =
                old.held.iter().chain(&old.freeing).map(|h| h.ptr).collect();
            stale.extend(old.stale.iter().copied());
            let mut c = self.fresh_client(old.id, None);
            c.stale = stale;
            c.frozen_until = old.frozen_until;
            self.clients[i] = c;
        }
    }

    /// The client at `i` takes one step: `pick` chooses what it starts.
    fn step(&mut self, i: usize, pick: u8) {
        let now = self.now;
        let at = self.at(now);
        if self.clients[i].frozen_until > now {
            return;
        }
        match self.clients[i].life {
            Life::Down => {
                // Restarted (a crash, or the process noticing): same id, nothing in memory.
                self.crash(i);
            }
            Life::Joining { .. } => self.join_step(i),
            Life::Recovering { .. } => self.recover_step(i),
            Life::Up => {
                let c = &mut self.clients[i];
                // As `Node::check_up`: past three quarters of a lease without renewal, stop.
                if !c.holder.may_use(at) {
                    self.log
                        .push(format!("{now} ms: {} stops (lease not renewed)", c.id));
                    c.life = Life::Down;
                    return;
                }
                if c.tasks.is_empty() || (c.tasks.len() < 2 && pick.is_multiple_of(4)) {
                    self.start_task(i, pick);
                } else {
                    let t = pick as usize % c.tasks.len();
                    self.task_step(i, t);
                }
            }
        }
    }

    fn crash(&mut self, i: usize) {
        let old = &mut self.clients[i];
        let pred = match old.predecessor.take() {
            // Crashed again before it joined: what it would have recovered is still its
            // first predecessor's.
            Some(mut p) => {
                p.lost |= old.lost;
                p
            }
            None => Predecessor {
                held: old.held.clone(),
                freeing: old.freeing.clone(),
                expiries_at_join: old.expiries_at_join,
                lost: old.lost,
            },
        };
        let id = old.id;
        self.log.push(format!("{} ms: {id} restarts", self.now));
        let c = self.fresh_client(id, Some(pred));
        self.clients[i] = c;
    }
}

#[cfg(test)]
mod tests;
