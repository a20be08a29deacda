//! `soft_requester`: a [`Requester`] with work requests over real registered memory, fed
//! what a hostile or broken responder may send back ([`Step`]). It must never panic, and:
//!
//! - it takes every byte it is given (a response it cannot use breaks the connection);
//! - the frames it builds decode as what was posted;
//! - READ data and atomic results land only in the local ranges of READs and atomics that
//!   went on the wire; no other byte of memory changes;
//! - every work request handed back completes exactly once, in posting order, and once the
//!   connection is lost nothing stays in flight; the driver is told to close once.

use super::arena::{with_arena, Arena, Range};
use super::input::{Input, Link};
use super::requester_steps::{Resp, Step};
use crate::fabric::{AccessFlags, RemoteAddr, WcOpcode, WcStatus, WrOp};
use crate::soft::keys::{KeyTable, MrInner, Resolved};
use crate::soft::proto::requester::Requester;
use crate::soft::proto::wire::{Request, Response};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEPTH: u32 = 8;
const MAX_MSG: u32 = 4096;
const TIMEOUT: Duration = Duration::from_secs(4);
const MAX_STEPS: usize = 256;
/// The local regions, as (offset, length) in the arena.
const LOCAL: [(usize, usize); 2] = [(1024, 2048), (4096, 1024)];

/// A request that went on the wire.
struct Sent {
    seq: u64,
    opcode: WcOpcode,
    byte_len: u32,
}

pub(super) struct Run<'a> {
    arena: &'a Arena,
    keys: KeyTable,
    regions: [Arc<MrInner>; 2],
    req: Requester,
    link: Link,
    now: Instant,
    next_wr: u64,
    /// Entries handed back and not yet completed, in posting order: (wr_id, opcode, bytes).
    handed: VecDeque<(u64, WcOpcode, u32)>,
    wire: Vec<Sent>,
    /// "Right" responses made so far (the next one answers `wire[answered]`).
    answered: usize,
    /// Local ranges of READs and atomics that went on the wire.
    writable: Vec<Range>,
    closes: usize,
    /// Every completion polled: (wr_id, status).
    pub(super) done: Vec<(u64, WcStatus)>,
}

impl<'a> Run<'a> {
    fn new(arena: &'a Arena) -> Self {
        let keys = KeyTable::default();
        let regions =
            LOCAL.map(|(off, len)| arena.register(&keys, off, len, AccessFlags::LOCAL_WRITE, 1));
        Self {
            arena,
            keys,
            regions,
            req: Requester::new(DEPTH, TIMEOUT, MAX_MSG),
            link: Link::default(),
            now: Instant::now(),
            next_wr: 0,
            handed: VecDeque::new(),
            wire: Vec::new(),
            answered: 0,
            writable: Vec::new(),
            closes: 0,
            done: Vec::new(),
        }
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Post {
                op,
                region,
                off,
                len,
                how,
            } => self.post(op, region as usize % 2, off as usize, len as usize, how),
            Step::Respond(r) => self.respond(&r),
            Step::Raw(b) => self.link.push(&b),
            Step::Feed(piece) => self.feed(piece as usize),
            Step::Receive { n, fail } => self.receive(n as usize, fail),
            Step::Advance(ms) => {
                self.now += Duration::from_millis(ms as u64);
                self.req.handle_timeout(self.now);
                let next = self.req.poll_timeout();
                assert!(next.is_none_or(|d| d > self.now), "a deadline passed");
            }
            Step::Lose(s) => self.lose(WcStatus::ALL[s as usize % WcStatus::ALL.len()]),
            Step::Deregister => self.keys.remove(&self.regions[1]),
            Step::Poll => self.poll(),
        }
        if self.req.take_close() {
            self.closes += 1;
        }
        assert!(self.closes <= 1, "told to close twice");
        assert_eq!(self.req.room(), DEPTH as usize - self.handed.len());
    }

    /// Posts as the driver does: a full queue refuses, a failed or broken one flushes, the
    /// local check runs, then the frame goes on the wire (or the entry is done locally).
    fn post(&mut self, op: u8, region: usize, off: usize, len: usize, how: u8) {
        let remote = RemoteAddr {
            addr: 0x1000,
            rkey: 7,
        };
        let (opcode, wr) = match op % 5 {
            0 => (WcOpcode::Send, WrOp::Send { imm: None }),
            1 => (WcOpcode::RdmaWrite, WrOp::Write { remote, imm: None }),
            2 => (WcOpcode::RdmaRead, WrOp::Read { remote }),
            3 => (
                WcOpcode::CompSwap,
                WrOp::CompareSwap {
                    remote,
                    compare: 1,
                    swap: 2,
                },
            ),
            _ => (WcOpcode::FetchAdd, WrOp::FetchAdd { remote, add: 3 }),
        };
        let wr_id = self.next_wr;
        let Some(mut e) = self.req.entry(wr_id, opcode, how & 4 == 0) else {
            return; // the queue is full
        };
        self.next_wr += 1;
        let mr = self.regions[region].clone();
        let region_len = LOCAL[region].1;
        let atomic = matches!(opcode, WcOpcode::CompSwap | WcOpcode::FetchAdd);
        let mut off = off % region_len;
        let mut len = len % (region_len - off + 1);
        if atomic {
            (off, len) = (off.min(region_len - 8), 8);
        }
        e.byte_len = len as u32;
        if !self.req.accepts_work() {
            self.req.flush(e);
        } else if self.keys.by_lkey(mr.lkey).is_none() {
            self.req.finish(e, WcStatus::LocProtErr);
        } else {
            if len > 0 {
                e.local.push(Resolved {
                    addr: mr.addr + off as u64,
                    len: len as u32,
                    mr,
                });
            }
            match how % 4 {
                2 => self.req.flush(e),
                3 => self.req.finish(e, WcStatus::Success),
                _ => {
                    let frame = self.req.frame(&e, &wr);
                    assert_eq!(frame.len, len as u32);
                    let back = Request::decode(&frame.encode(), MAX_MSG).expect("own frame");
                    assert_eq!(back, frame);
                    if matches!(opcode, WcOpcode::RdmaRead) || atomic {
                        self.writable
                            .push((self.regions[region].addr + off as u64, len as u64));
                    }
                    self.wire.push(Sent {
                        seq: frame.seq,
                        opcode,
                        byte_len: len as u32,
                    });
                    self.req.sent(e, self.now);
                }
            }
        }
        self.handed.push_back((wr_id, opcode, len as u32));
    }

    fn respond(&mut self, r: &Resp) {
        let target = if self.wire.is_empty() {
            None
        } else {
            Some(&self.wire[(self.answered + r.which as usize) % self.wire.len()])
        };
        let seq = target.map_or(r.which as u64, |s| s.seq);
        let value = r.value as u32;
        let resp = match r.kind % 6 {
            0 => {
                self.answered += 1;
                match target.map(|s| (s.opcode, s.byte_len)) {
                    Some((WcOpcode::RdmaRead, len)) => Response::ReadData { seq, len },
                    Some((WcOpcode::CompSwap | WcOpcode::FetchAdd, _)) => Response::Atomic {
                        seq,
                        old: value as u64 * 0x0001_0001_0001_0001,
                    },
                    _ => Response::Ack { seq },
                }
            }
            1 => Response::Ack { seq },
            2 => Response::ReadData { seq, len: value },
            3 => Response::Atomic {
                seq,
                old: !(value as u64),
            },
            4 => Response::Nak {
                seq,
                status: WcStatus::RemAccessErr,
            },
            _ => Response::Map {
                seq,
                mappable: value & 1 == 1,
            },
        };
        let mut b = resp.encode();
        if r.kind % 6 == 4 {
            b[6] = value as u8; // any status, valid or not
        }
        if let Some((i, v)) = r.corrupt {
            b[i as usize % b.len()] = v;
        }
        self.link.push(&b);
        if let (true, Ok(Response::ReadData { len, .. })) =
            (r.payload, Response::decode(&b, MAX_MSG))
        {
            self.link.push_payload(len as usize, 0xa5);
        }
    }

    /// Feeds the link in pieces of `piece` bytes (0: all at once); every byte is taken.
    fn feed(&mut self, piece: usize) {
        let piece = if piece == 0 { usize::MAX } else { piece };
        for chunk in self.link.pending().chunks(piece) {
            let n = self.req.handle_input(chunk);
            assert_eq!(n, chunk.len(), "the requester takes what it is given");
        }
        self.link.consume(self.link.pending().len());
    }

    /// The driver receives a READ payload in place: at most `n` bytes of the link.
    fn receive(&mut self, n: usize, fail: bool) {
        let (arena, link, allowed) = (self.arena, self.link.pending(), &self.writable);
        let r = self.req.receive_payload(|pieces| {
            if fail {
                return Err(());
            }
            Ok(arena.receive(pieces, allowed, link, n))
        });
        if let Some(Ok(got)) = r {
            self.link.consume(got);
        }
    }

    fn lose(&mut self, status: WcStatus) {
        self.req.lose_connection(status);
        assert!(self.req.is_broken() && self.req.in_flight() == 0);
        assert!(self.req.poll_timeout().is_none());
    }

    /// Completions come in posting order, each once, as posted.
    fn poll(&mut self) {
        while let Some(f) = self.req.poll_done() {
            let (wr_id, opcode, len) = self.handed.pop_front().expect("a completion too many");
            assert_eq!((f.wr_id, f.opcode, f.byte_len), (wr_id, opcode, len));
            self.done.push((f.wr_id, f.status));
        }
    }
}

/// Runs one program in `arena`, then the QP goes to ERR; the checks passed.
pub(super) fn execute<'a>(arena: &'a Arena, data: &[u8]) -> Run<'a> {
    let mut run = Run::new(arena);
    let mut input = Input::new(data);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        run.step(Step::parse(&mut input));
    }
    run.step(Step::Feed(0));
    // Everything handed back completes, nothing stays in flight.
    run.lose(WcStatus::WrFlushErr);
    run.step(Step::Poll);
    assert!(
        run.handed.is_empty(),
        "{} requests never completed",
        run.handed.len()
    );
    assert_eq!(run.closes, 1, "the driver is told to close exactly once");
    arena.check_untouched(&run.writable);
    run
}

/// Runs one program.
pub(super) fn run(data: &[u8]) {
    with_arena(|arena| drop(execute(arena, data)))
}
