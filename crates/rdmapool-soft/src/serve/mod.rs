//! The responder's driver: one thread per process owns the listeners of every soft NIC in
//! it and every incoming connection, in one epoll loop (tokio's driver/registration split:
//! the loop owns the sockets, each connection is a state machine it steps when its socket or
//! timer is ready). A connection never blocks the loop: sockets are non-blocking, answers
//! that do not fit wait in their connection, and a peer that stops reading or writing is
//! given up on its own deadline. So the thread count stays one whatever the number of
//! connections and NICs, and an idle connection costs nothing but its socket.
//!
//! One loop for all the NICs of a process, not one per NIC: a loop spins for a while after
//! traffic (a request usually follows its predecessor within microseconds), and several
//! NICs' loops spinning at once on a machine with fewer cores took the cores from the
//! threads they waited for (three pool servers in one process ran at 0.35× one server over
//! TCP). One loop spins once for all of them. The loop starts with the first NIC of the
//! process and ends when the last one closes.
//!
//! What a connection does is the sans-IO [`Responder`](super::proto::responder::Responder)'s;
//! this module only moves its bytes ([`conn`]), runs the handshake ([`hello`]) and takes
//! connections off the listeners ([`accept`]).

mod accept;
mod conn;
mod hello;
mod nics;

pub(crate) use nics::start;
use nics::Nic;

use super::context::{ConnSlot, CtxShared};
use super::peer::{own_uid, PeerInfo};
use super::waker::{epoll_wait, EventFd};
use crate::util::spin::AdaptiveSpin;
use accept::{AcceptOutcome, Accepted};
use conn::{End, Serving, Wait};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Epoll data of the loop's own waker (a NIC was added); connections count up from
/// `FIRST_CONN`; a NIC's waker and listeners carry [`NIC_TOKEN`] with the NIC's number.
const LOOP_WAKE: u64 = 0;
const FIRST_CONN: u64 = 16;
const NIC_TOKEN: u64 = 1 << 63;
/// What a NIC token names (its low two bits).
const WAKE: u64 = 0;
const TCP: u64 = 1;
const UNIX: u64 = 2;
/// How long after the last traffic the loop still spins before it sleeps.
const IDLE_SPIN_WINDOW: Duration = Duration::from_millis(1);
/// Connections taken off one listener in a row before the others get a turn.
const ACCEPT_BURST: usize = 64;
/// How long accepting pauses when the process is out of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

fn ctl(epoll: &OwnedFd, op: libc::c_int, fd: RawFd, events: u32, data: u64) -> bool {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: an epoll descriptor we hold, a descriptor the caller owns, and a local event.
    unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd, &mut ev) == 0 }
}

const IN: u32 = libc::EPOLLIN as u32;

/// One connection the loop owns.
struct Entry {
    fd: OwnedFd,
    /// The NIC it came in on.
    nic: u64,
    ctx: Arc<CtxShared>,
    local: bool,
    peer: PeerInfo,
    _slot: ConnSlot,
    phase: Phase,
    /// The epoll events it is registered for now.
    events: u32,
    /// Its earliest timer in the heap, if any.
    timer: Option<Instant>,
}

enum Phase {
    /// Challenged, its hello not yet whole.
    Hello(hello::Pending),
    /// Serving its QP.
    Serving(Box<Serving>),
}

/// The loop's state; only its thread touches it.
struct Loop {
    epoll: Arc<OwnedFd>,
    wake: Arc<EventFd>,
    nics: HashMap<u64, Nic>,
    conns: HashMap<u64, Entry>,
    next_token: u64,
    /// Connection timers, earliest first; an entry whose connection has since moved its
    /// timer is skipped when it comes up.
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    last_traffic: Instant,
    /// The connection serving each QP, by NIC and QP number.
    by_qpn: HashMap<(u64, u32), u64>,
    /// The traffic after which the loop last spun in vain (it spins once per burst).
    spun_after: Option<Instant>,
    /// How long it spins now: up to the longest `spin` of its NICs, less while spinning
    /// finds nothing.
    spin: AdaptiveSpin,
    spin_max: Duration,
    /// The descriptor of this process's life page, which the loop's thread holds while it
    /// runs (`None` where the system has none): handed to local peers with each local
    /// handshake.
    life: Option<RawFd>,
}

impl Loop {
    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, data: u64) -> bool {
        ctl(&self.epoll, op, fd, events, data)
    }

    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            let n = self.wait(&mut events);
            let now = Instant::now();
            for ev in &events[..n] {
                let token = ev.u64; // a copy: the event struct is packed
                match token {
                    LOOP_WAKE => {
                        self.wake.drain();
                        self.take_new_nics();
                    }
                    t if t & NIC_TOKEN != 0 => {
                        let nic = (t & !NIC_TOKEN) >> 2;
                        match t & 3 {
                            WAKE => self.nic_woken(nic),
                            what => self.accept(nic, what, now),
                        }
                    }
                    conn => self.step(conn, now),
                }
            }
            self.fire_timers(now);
            let resume: Vec<u64> = self
                .nics
                .values()
                .filter(|n| n.accept_paused_until.is_some_and(|t| now >= t))
                .map(|n| n.id)
                .collect();
            for id in resume {
                if let Some(nic) = self.nics.get_mut(&id) {
                    nic.accept_paused_until = None;
                }
                if let Some(nic) = self.nics.get(&id) {
                    self.listeners(nic, libc::EPOLL_CTL_MOD, IN);
                }
            }
            if self.nics.is_empty() && self.may_end() {
                return;
            }
        }
    }

    /// When the loop must wake up on its own. Timers that no longer apply are dropped first,
    /// so that none of them wakes the loop.
    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, token))) = self.timers.peek() {
            if self.conns.get(&token).is_some_and(|e| e.timer == Some(at)) {
                break;
            }
            self.timers.pop();
        }
        let timer = self.timers.peek().map(|Reverse((t, _))| *t);
        let paused = self
            .nics
            .values()
            .filter_map(|n| n.accept_paused_until)
            .min();
        [timer, paused].into_iter().flatten().min()
    }

    /// Waits for events: spinning right after traffic (a request usually follows its
    /// predecessor within microseconds, and a sleep/wake-up pair costs more), for as long
    /// as [`AdaptiveSpin`] allows (less after spins that found nothing), then sleeping
    /// until the next deadline.
    fn wait(&mut self, events: &mut [libc::epoll_event]) -> usize {
        let now = Instant::now();
        let deadline = self.next_deadline();
        let spin = self.spin.budget();
        let recent = now.saturating_duration_since(self.last_traffic) < IDLE_SPIN_WINDOW;
        // One spin per burst of traffic: once it found nothing, the loop sleeps until the
        // next event, as it would after any spin.
        if !spin.is_zero() && recent && self.spun_after != Some(self.last_traffic) {
            let until = deadline.map_or(now + spin, |d| d.min(now + spin));
            // A plain spin: yielding here hands the core to busy-polling clients for whole
            // time slices, which then wait longer for this NIC's answers (measured with
            // `bench data --async --transport tcp`); how long it spins adapts instead.
            let found = loop {
                let n = epoll_wait(&self.epoll, events, Some(Duration::ZERO));
                if n > 0 {
                    break Some(n);
                }
                if Instant::now() >= until {
                    break None;
                }
                std::hint::spin_loop();
            };
            self.spin.spun(found.is_some());
            if let Some(n) = found {
                return n;
            }
            self.spun_after = Some(self.last_traffic);
        }
        let slept = Instant::now();
        let timeout = deadline.map(|d| d.saturating_duration_since(slept));
        let n = epoll_wait(&self.epoll, events, timeout);
        if n > 0 && recent {
            self.spin.slept(slept.elapsed());
        }
        n
    }

    /// Takes what is waiting on a NIC's listener.
    fn accept(&mut self, id: u64, which: u64, now: Instant) {
        let Some(nic) = self.nics.get(&id) else {
            self.take_new_nics(); // its listener was ready before the loop took it
            return;
        };
        let ctx = nic.ctx.clone();
        for _ in 0..ACCEPT_BURST {
            let Some(nic) = self.nics.get(&id) else {
                return;
            };
            let outcome = match which {
                TCP => nic.tcp.as_ref().map(|l| accept::tcp(l, &ctx)),
                _ => nic.unix.as_ref().map(|l| accept::unix(l, &ctx)),
            };
            match outcome.unwrap_or(AcceptOutcome::Closed) {
                AcceptOutcome::Admitted(a) => self.challenge(id, &ctx, a, now),
                AcceptOutcome::Refused => {}
                AcceptOutcome::Empty => return,
                AcceptOutcome::OutOfDescriptors => {
                    self.listeners(nic, libc::EPOLL_CTL_MOD, 0);
                    if let Some(nic) = self.nics.get_mut(&id) {
                        nic.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    }
                    return;
                }
                AcceptOutcome::Closed => {
                    // Shut down (the context closes) or broken: stop listening on it.
                    let Some(nic) = self.nics.get_mut(&id) else {
                        return;
                    };
                    let l: Option<OwnedFd> = match which {
                        TCP => nic.tcp.take().map(Into::into),
                        _ => nic.unix.take().map(Into::into),
                    };
                    if let Some(l) = l {
                        self.ctl(libc::EPOLL_CTL_DEL, l.as_raw_fd(), 0, 0);
                    }
                    return;
                }
            }
        }
    }

    /// Challenges a new connection of NIC `nic` and starts watching it.
    fn challenge(&mut self, nic: u64, ctx: &Arc<CtxShared>, a: Accepted, now: Instant) {
        let Some(pending) = hello::challenge(a.fd.as_raw_fd(), now) else {
            return;
        };
        let token = self.next_token;
        self.next_token += 1;
        if !self.ctl(libc::EPOLL_CTL_ADD, a.fd.as_raw_fd(), IN, token) {
            return;
        }
        let deadline = pending.deadline;
        self.conns.insert(
            token,
            Entry {
                fd: a.fd,
                nic,
                ctx: ctx.clone(),
                local: a.local,
                peer: a.peer,
                _slot: a.slot,
                phase: Phase::Hello(pending),
                events: IN,
                timer: None,
            },
        );
        self.schedule(token, deadline);
    }

    /// Steps one connection: its socket is ready, or its timer came up.
    fn step(&mut self, token: u64, now: Instant) {
        let life = self.life;
        let Some(e) = self.conns.get_mut(&token) else {
            return;
        };
        let ctx = &*e.ctx;
        let fd = e.fd.as_raw_fd();
        if let Phase::Hello(p) = &mut e.phase {
            match p.advance(ctx, fd, e.local, &e.peer, life) {
                hello::Step::Waiting if now < p.deadline => return,
                hello::Step::Waiting | hello::Step::Refused => {
                    self.conns.remove(&token);
                    return; // closing the socket also takes it out of the epoll set
                }
                hello::Step::Accepted(qp) => {
                    let mappable =
                        e.local && ctx.admission.local_mappings && e.peer.uid == Some(own_uid());
                    e.phase = Phase::Serving(Box::new(Serving::new(ctx, &qp, mappable)));
                    self.by_qpn.insert((e.nic, qp.qpn()), token);
                    e.timer = None; // the hello deadline no longer applies
                }
            }
        }
        let Phase::Serving(s) = &mut e.phase else {
            return;
        };
        let outcome = s.step(ctx, fd, now);
        self.last_traffic = self.last_traffic.max(s.last_progress);
        match outcome {
            Ok(wait) => self.rearm(token, wait),
            Err(end) => self.close(token, end),
        }
    }

    /// Watches a connection for what it waits for.
    fn rearm(&mut self, token: u64, wait: Wait) {
        let Some(e) = self.conns.get_mut(&token) else {
            return;
        };
        if e.events != wait.events {
            e.events = wait.events;
            let fd = e.fd.as_raw_fd();
            self.ctl(libc::EPOLL_CTL_MOD, fd, wait.events, token);
        }
        if let Some(t) = wait.until {
            self.schedule(token, t);
        }
    }

    /// Steps `token` at `at` at the latest. A connection keeps one timer: a later one is set
    /// when the earlier comes up (a connection stepped early only does nothing).
    fn schedule(&mut self, token: u64, at: Instant) {
        let Some(e) = self.conns.get_mut(&token) else {
            return;
        };
        if e.timer.is_none_or(|t| at < t) {
            e.timer = Some(at);
            self.timers.push(Reverse((at, token)));
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, token))) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            let current = self.conns.get_mut(&token).filter(|e| e.timer == Some(at));
            if let Some(e) = current {
                e.timer = None;
                self.step(token, now);
            }
        }
    }

    /// Ends a served connection. When it ends while its QP lives, the QP learns that its
    /// peer is gone (ERR and an event).
    fn close(&mut self, token: u64, end: End) {
        let Some(mut e) = self.conns.remove(&token) else {
            return;
        };
        let fd = e.fd.as_raw_fd();
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0);
        let Phase::Serving(s) = &mut e.phase else {
            return;
        };
        self.by_qpn.remove(&(e.nic, s.qpn));
        s.finish(fd);
        if let End::Failed(reason) = &end {
            tracing::debug!(qpn = s.qpn, "connection ended: {reason}");
            accept::reset_if_unsent(fd);
        }
        if !e.ctx.is_closing() {
            if let Some(qp) = s.qp() {
                qp.peer_lost();
            }
        }
    }
}
