//! A simulated cluster for the client's machines, in virtual time: one node's region as
//! words in memory, the server's sweep (`remote/sweep.rs`) every quarter lease, and several
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

use super::chunks::{Alloc, Answer, Book, Checked, Free, Io, Machine, Next, Recover};
use super::takeover::{next_beat, Step, Takeover};
use crate::remote::layout::hash64;
use crate::remote::layout::{self, size_class, ChunkShape, Layout};
use crate::remote::lease::{Holder, Reaper};
use crate::remote::sweep::{self, Words};
use crate::remote::RemotePtr;
use crate::Error;
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

mod region;
use region::Region;

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
        renew_sent: Option<Instant>,
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
    region: Region,
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
            region: Region::new(layout, 1),
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
                ),
                renew_sent: None,
            },
            book: Book::new(id, self.region.incarnation, l),
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
                    let swept =
                        sweep::sweep(&mut self.reaper, &self.region.layout, &self.region, at);
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
            _ => unreachable!(),
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
        self.region = Region::new(self.region.layout, self.incarnations);
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

    /// Goes as far as the takeover can at this time (the real client reads the watched
    /// heartbeat every few milliseconds, whoever else runs).
    fn join_step(&mut self, i: usize) {
        for _ in 0..64 {
            let before = self.now;
            let waiting = match &self.clients[i].life {
                Life::Joining { t, .. } => {
                    matches!(t.step(), Step::ReadBeat { at, .. } if at > self.at(before))
                }
                _ => true,
            };
            if waiting {
                return;
            }
            self.join_once(i);
        }
    }

    fn join_once(&mut self, i: usize) {
        let now = self.now;
        let l = self.region.layout;
        let c = &mut self.clients[i];
        let Life::Joining { t, renew_sent } = &mut c.life else {
            return;
        };
        match t.step() {
            Step::ReadOwners => {
                let owners: Vec<u64> = (0..l.client_count)
                    .map(|s| self.region.load(l.client_slot(s)))
                    .collect();
                t.on_owners(&owners);
            }
            Step::Claim { slot } => {
                let old = self.region.apply(&Io::Cas {
                    at: l.client_slot(slot),
                    expected: 0,
                    swap: c.id,
                });
                t.on_claim(
                    match old {
                        Answer::Word(w) => w,
                        _ => unreachable!(),
                    },
                    self.t0 + Duration::from_millis(now),
                );
            }
            Step::ReadBeat { slot, at } => {
                if at > self.t0 + Duration::from_millis(now) {
                    return; // not yet
                }
                let beat = self.region.load(l.client_slot(slot) + 8);
                t.on_beat(beat, self.t0 + Duration::from_millis(now));
            }
            Step::ReadOwner { slot } => t.on_owner(self.region.load(l.client_slot(slot))),
            Step::Renew {
                slot,
                expected,
                new,
            } => {
                *renew_sent = Some(self.t0 + Duration::from_millis(now));
                let old = self.region.apply(&Io::Cas {
                    at: l.client_slot(slot) + 8,
                    expected,
                    swap: new,
                });
                t.on_renewed(match old {
                    Answer::Word(w) => w,
                    _ => unreachable!(),
                });
            }
            Step::Taken { slot, beat } => {
                if let Some(sent) = *renew_sent {
                    c.holder.renewed(sent);
                }
                c.slot = l.client_slot(slot);
                c.beat = beat;
                c.next_renew = now;
                c.life = Life::Recovering {
                    m: Recover::new(),
                    pending: None,
                };
                self.recover_step(i);
            }
            Step::InUse => {
                // The predecessor is alive for the server: wait and try again.
                let base = hash64(self.randoms.get());
                self.randoms.set(self.randoms.get() + 1);
                c.life = Life::Joining {
                    t: Takeover::new(
                        c.id,
                        self.lease,
                        l.client_count,
                        hash64(c.id) % l.client_count,
                        base,
                    ),
                    renew_sent: None,
                };
            }
            Step::Full => panic!("eight slots, at most four clients: {:?}", self.log),
        }
    }

    fn recover_step(&mut self, i: usize) {
        let at = self.at(self.now);
        let c = &mut self.clients[i];
        if !c.holder.may_use(at) {
            c.life = Life::Down;
            return;
        }
        let Life::Recovering { m, pending } = &mut c.life else {
            return;
        };
        let answer = pending.take().map(|io| self.region.apply(&io));
        match m
            .advance(&mut c.book, answer)
            .expect("recovery decides without errors")
        {
            Next::Io(io) => *pending = Some(io),
            Next::Wait => unreachable!("recovery claims nothing"),
            Next::Done(()) => {
                c.life = Life::Up;
                self.joined(i);
            }
        }
    }

    /// Checks what a client that just joined finds: stale pointers refused, and what it
    /// recovered against what its predecessor held.
    fn joined(&mut self, i: usize) {
        let c = &mut self.clients[i];
        for ptr in std::mem::take(&mut c.stale) {
            match c.book.check(ptr, false) {
                Err(Error::StalePointer { .. }) => {}
                other => panic!("{ptr} after a server restart: {other:?}\n{:#?}", self.log),
            }
        }
        let mut recovered = Vec::new();
        for (chunk, shape) in c.book.owned() {
            let base = self.region.layout.chunk(chunk) + shape.first_object;
            let bits = self.region.apply(&Io::Read {
                at: self.region.layout.chunk(chunk) + layout::chunk::BITMAP,
                words: shape.object_count.div_ceil(64) as usize,
            });
            let bits = match bits {
                Answer::Word(w) => vec![w],
                Answer::Words(w) => w,
                Answer::Written => unreachable!(),
            };
            for obj in 0..shape.object_count {
                if bits[(obj / 64) as usize] & (1 << (obj % 64)) != 0 {
                    recovered.push(base + obj * shape.object_size);
                }
            }
        }
        let expiries_now = self.expiries.get(&c.id).copied().unwrap_or(0);
        c.expiries_at_join = expiries_now;
        let Some(Predecessor {
            held,
            freeing,
            expiries_at_join,
            lost,
        }) = c.predecessor.take()
        else {
            assert!(
                recovered.is_empty(),
                "a first start recovered {recovered:?}"
            );
            return;
        };
        let expired = expiries_now != expiries_at_join;
        if expired {
            assert!(
                recovered.is_empty(),
                "{}: the server expired the id, yet {recovered:?} were recovered\n{:#?}",
                c.id,
                self.log
            );
        } else if !lost {
            // Everything held, and of what was being freed, what the free had not cleared.
            let missing: Vec<u64> = held
                .iter()
                .map(|h| h.ptr.offset)
                .filter(|o| !recovered.contains(o))
                .collect();
            let extra: Vec<u64> = recovered
                .iter()
                .copied()
                .filter(|o| !held.iter().chain(&freeing).any(|h| h.ptr.offset == *o))
                .collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{}: not recovered {missing:?}, recovered but not held {extra:?}\n{:#?}",
                c.id,
                self.log
            );
        }
        for off in recovered {
            let shape = c
                .book
                .owned()
                .into_iter()
                .find(|(ch, _)| self.region.layout.chunk_of(off) == Some(*ch))
                .map(|(_, s)| s)
                .expect("recovered in an owned chunk");
            let ptr = RemotePtr {
                node: 1,
                offset: off,
                len: shape.object_size,
                incarnation: c.incarnation,
            };
            let tag = match held.iter().chain(&freeing).find(|h| h.ptr.offset == off) {
                Some(h) => {
                    let found = self.region.load(off);
                    assert_eq!(
                        found, h.tag,
                        "{}: {ptr} recovered with other bytes\n{:#?}",
                        c.id, self.log
                    );
                    h.tag
                }
                None => {
                    // Its allocation's answer was lost: it is ours now, tag it.
                    c.seq += 1;
                    let tag = c.id << 32 | c.seq;
                    self.region.store(off, tag);
                    tag
                }
            };
            c.held.push(Held { ptr, tag });
        }
    }

    fn start_task(&mut self, i: usize, pick: u8) {
        let now = self.now;
        let l = self.region.layout;
        let c = &mut self.clients[i];
        let kind = pick % 3;
        if kind == 0 || (kind == 1 && c.held.is_empty()) {
            let size = SIZES[pick as usize / 3 % SIZES.len()];
            let class = size_class(size, l.chunk_size).expect("fits");
            c.tasks.push((
                Task::Alloc {
                    m: Alloc::new(class),
                    size,
                },
                None,
            ));
        } else if kind == 1 {
            let h = c.held.swap_remove(pick as usize % c.held.len());
            let obj = match c.book.check(h.ptr, true) {
                Ok(Checked::Known(o)) => o,
                other => panic!(
                    "{now} ms: own {} checks as {other:?}\n{:#?}",
                    h.ptr, self.log
                ),
            };
            let found = self.region.load(h.ptr.offset);
            assert_eq!(
                found, h.tag,
                "{}: {} holds other bytes\n{:#?}",
                c.id, h.ptr, self.log
            );
            c.freeing.push(h);
            c.tasks.push((
                Task::Free {
                    m: Free::new(h.ptr, obj),
                    ptr: h.ptr,
                },
                None,
            ));
        } else {
            // Look at every object held: each still holds this client's tag.
            for h in &c.held {
                assert!(matches!(c.book.check(h.ptr, false), Ok(Checked::Known(_))));
                let found = self.region.load(h.ptr.offset);
                assert_eq!(
                    found, h.tag,
                    "{now} ms: {} found other bytes in {}\n{:#?}",
                    c.id, h.ptr, self.log
                );
            }
            return;
        }
        let t = c.tasks.len() - 1;
        self.task_step(i, t);
    }

    /// Task `t` of client `i`: performs its pending operation (if any) and advances it.
    fn task_step(&mut self, i: usize, t: usize) {
        let now = self.now;
        let at = self.at(now);
        let c = &mut self.clients[i];
        let pending = c.tasks[t].1.take();
        let answer = match pending {
            Some(io) => {
                let a = self.region.apply(&io);
                if std::mem::take(&mut c.lose_next) {
                    // Landed, but the connection died with the answer: every machine gives
                    // back what it reserved, and the node is down for this client.
                    self.log
                        .push(format!("{now} ms: {} lost the answer to {io:?}", c.id));
                    for (task, _) in &mut c.tasks {
                        match task {
                            Task::Alloc { m, .. } => m.abandon(&mut c.book),
                            Task::Free { m, .. } => m.abandon(&mut c.book),
                        }
                    }
                    c.tasks.clear();
                    c.lost = true;
                    c.life = Life::Down;
                    return;
                }
                Some(a)
            }
            None => None,
        };
        let (task, slot) = &mut c.tasks[t];
        let done = match task {
            Task::Alloc { m, size } => match m.advance(&mut c.book, answer).expect("alloc") {
                Next::Io(io) => {
                    *slot = Some(io);
                    None
                }
                Next::Wait => None,
                Next::Done(Some(offset)) => Some(Some((offset, *size))),
                Next::Done(None) => Some(None),
            },
            Task::Free { m, ptr } => match m.advance(&mut c.book, answer) {
                Ok(Next::Io(io)) => {
                    *slot = Some(io);
                    None
                }
                Ok(Next::Wait) => None,
                Ok(Next::Done(())) => {
                    let p = *ptr;
                    c.freeing.retain(|h| h.ptr.offset != p.offset);
                    Some(None)
                }
                Err(e) => panic!(
                    "{now} ms: {} freeing its own {ptr}: {e}\n{:#?}",
                    c.id, self.log
                ),
            },
        };
        let Some(result) = done else {
            return;
        };
        c.tasks.swap_remove(t);
        let Some((offset, size)) = result else {
            return;
        };
        let id = c.id;
        // No other client that may still use this object holds it.
        for o in &self.clients {
            let may = o.id == id || (matches!(o.life, Life::Up) && o.holder.may_use(at));
            if may
                && o.held
                    .iter()
                    .chain(&o.freeing)
                    .any(|h| h.ptr.offset == offset)
            {
                panic!(
                    "{now} ms: {offset} handed to {id} while {} holds it\n{:#?}",
                    o.id, self.log
                );
            }
        }
        let c = &mut self.clients[i];
        c.seq += 1;
        let tag = id << 32 | c.seq;
        self.region.store(offset, tag);
        let class = size_class(size, self.region.layout.chunk_size).expect("fits");
        debug_assert!(ChunkShape::new(self.region.layout.chunk_size, class).object_size >= size);
        c.held.push(Held {
            ptr: RemotePtr {
                node: 1,
                offset,
                len: size,
                incarnation: c.incarnation,
            },
            tag,
        });
    }
}

#[cfg(test)]
mod tests;
