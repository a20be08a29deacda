//! `soft_responder`: a [`Responder`] against a target QP with real keys over real memory,
//! fed what a hostile or broken peer may send, while the application and the driver do what
//! they may do meanwhile ([`Step`]). It must never panic, and:
//!
//! - it takes no more bytes than it is given;
//! - READ data comes only from ranges a key grants remote read on, payloads land only in
//!   ranges a key grants remote write on or in posted receive buffers, and no other byte of
//!   memory changes (the arena's pattern);
//! - each receive completes at most once, never with more bytes than it holds.

use super::arena::{inside, with_arena, Arena, Range};
use super::input::{Input, Link};
use super::responder_steps::{Addr, Frame, Key, Step};
use crate::fabric::{AccessFlags, QpState, WcOpcode, WcStatus};
use crate::soft::keys::{LocalList, MrInner, Resolved, Window};
use crate::soft::proto::mem_target::{MemTarget as Target, PD, QPN};
use crate::soft::proto::responder::{read_frame, Output, Responder};
use crate::soft::proto::target::RecvEntry;
use crate::soft::proto::wire::{ReqOp, Request, Response};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OTHER_QPN: u32 = 3;
/// The largest message the responder takes.
const MAX_MSG: u32 = 4096;
/// Steps run before the final drain.
const MAX_STEPS: usize = 256;

/// The regions, as (offset, length) in the arena.
const RW: (usize, usize) = (1024, 2048);
const RO: (usize, usize) = (4096, 1024);
const OTHER_PD: (usize, usize) = (6144, 1024);
const RECV: (usize, usize) = (8192, 2048);
const GONE: (usize, usize) = (11264, 512);
const WINDOW: (usize, usize) = (RW.0 + 256, 512);

/// One run: the target, its regions, the responder and the link.
pub(super) struct Run<'a> {
    arena: &'a Arena,
    pub(super) target: Target,
    rw: Arc<MrInner>,
    recv: Arc<MrInner>,
    /// rkeys and base addresses of `Key::ReadWrite..=Key::OtherQpWindow`.
    keys: [(u32, u64); 7],
    resp: Responder,
    link: Link,
    now: Instant,
    seq: u64,
    /// Capacity of each posted receive, by wr_id.
    posted: HashMap<u64, u64>,
    /// The driver closed the connection (a malformed frame).
    closed: bool,
    /// Every response sent back, in order.
    pub(super) replies: Vec<Response>,
}

fn range(arena: &Arena, (off, len): (usize, usize)) -> Range {
    (arena.at(off), len as u64)
}

impl<'a> Run<'a> {
    fn new(arena: &'a Arena) -> Self {
        let target = Target::new();
        let k = &target.keys;
        let all = AccessFlags::all_remote();
        let rw = arena.register(k, RW.0, RW.1, all, PD);
        let ro = arena.register(k, RO.0, RO.1, AccessFlags::REMOTE_READ, PD);
        let other = arena.register(k, OTHER_PD.0, OTHER_PD.1, all, PD + 1);
        let recv = arena.register(k, RECV.0, RECV.1, AccessFlags::LOCAL_WRITE, PD);
        let gone = arena.register(k, GONE.0, GONE.1, all, PD);
        k.remove(&gone);
        let window = |qpn| {
            let w = Window {
                mr: rw.clone(),
                addr: arena.at(WINDOW.0),
                len: WINDOW.1 as u64,
                access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
                qpn,
            };
            k.bind_window(w).expect("fuzz: window")
        };
        let (win, other_win) = (window(QPN), window(OTHER_QPN));
        let keys = [
            (rw.rkey, rw.addr),
            (ro.rkey, ro.addr),
            (other.rkey, other.addr),
            (recv.rkey, recv.addr),
            (gone.rkey, gone.addr),
            (win, arena.at(WINDOW.0)),
            (other_win, arena.at(WINDOW.0)),
        ];
        Self {
            arena,
            target,
            rw,
            recv,
            keys,
            resp: Responder::new(MAX_MSG),
            link: Link::default(),
            now: Instant::now(),
            seq: 0,
            posted: HashMap::new(),
            closed: false,
            replies: Vec::new(),
        }
    }

    /// Ranges a READ may be answered from.
    fn readable(&self) -> [Range; 2] {
        [range(self.arena, RW), range(self.arena, RO)]
    }

    /// Ranges a payload may land in.
    fn writable(&self) -> [Range; 2] {
        [range(self.arena, RW), range(self.arena, RECV)]
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Raw(b) => self.link.push(&b),
            Step::Frame(f) => self.frame(&f),
            Step::PostRecv {
                off,
                len,
                sges,
                bad,
            } => self.post_recv(off, len, sges, bad),
            Step::State(s) => *self.target.state.lock() = QpState::from_u8(s % 5),
            Step::Advance(ms) => self.now += Duration::from_millis(ms as u64),
            Step::Feed(piece) => self.feed(piece as usize),
            Step::Answer => self.answer(),
            Step::Receive { n, fail } => self.receive(n as usize, fail),
            Step::Deregister(what) => match what % 3 {
                0 => self.target.keys.remove(&self.rw),
                1 => self.target.keys.remove(&self.recv),
                _ => {
                    self.target.keys.invalidate_window(self.keys[5].0, PD);
                }
            },
        }
    }

    fn frame(&mut self, f: &Frame) {
        let (rkey, base) = match f.key {
            Key::ReadWrite => self.keys[0],
            Key::ReadOnly => self.keys[1],
            Key::OtherPd => self.keys[2],
            Key::Receives => self.keys[3],
            Key::Gone => self.keys[4],
            Key::Window => self.keys[5],
            Key::OtherQpWindow => self.keys[6],
            Key::Raw(rkey) => (rkey, self.keys[0].1),
        };
        let remote_addr = match f.addr {
            Addr::Offset(off) => base.wrapping_add_signed(off as i64),
            Addr::Absolute(a) => a,
        };
        self.seq += 1;
        let req = Request {
            op: ReqOp::Send,
            seq: self.seq,
            remote_addr,
            rkey,
            len: f.len as u32,
            compare_add: f.atomic.0,
            swap: f.atomic.1,
            imm: f.imm,
        };
        let mut b = req.encode();
        b[5] = f.op;
        if let Some((i, v)) = f.corrupt {
            b[i as usize % b.len()] = v;
        }
        self.link.push(&b);
        if f.payload && matches!(b[5], 1 | 2) {
            // Beyond MAX_MSG the frame is refused and the connection closed: no payload.
            self.link
                .push_payload((f.len as usize).min(MAX_MSG as usize), 0x5a);
        }
    }

    fn post_recv(&mut self, off: u16, len: u16, sges: u8, bad: bool) {
        let wr_id = self.posted.len() as u64;
        let off = off as usize % RECV.1;
        let len = len as usize % (RECV.1 - off + 1);
        let local = if bad {
            Err(WcStatus::LocProtErr)
        } else {
            // As the driver resolves a receive's SGEs: checked, inside the region.
            let mut list = LocalList::new();
            let n = (sges as usize % 3) + 1;
            let piece = len.div_ceil(n);
            let mut at = 0;
            while at < len {
                let l = piece.min(len - at);
                list.push(Resolved {
                    mr: self.recv.clone(),
                    addr: self.recv.addr + (off + at) as u64,
                    len: l as u32,
                });
                at += l;
            }
            Ok(list)
        };
        let capacity = if bad { 0 } else { len as u64 };
        self.posted.insert(wr_id, capacity);
        self.target.rq.lock().push_back(RecvEntry {
            wr_id,
            local,
            capacity,
        });
    }

    /// Feeds the link to the responder in pieces of `piece` bytes (0: all), answering as it
    /// goes, until it takes nothing more.
    fn feed(&mut self, piece: usize) {
        while !self.closed {
            let pending = self.link.pending();
            let take = match piece {
                0 => pending.len(),
                p => p.min(pending.len()),
            };
            let n = self
                .resp
                .handle_input(&self.target, &pending[..take], self.now);
            assert!(n <= take, "took {n} of {take} bytes");
            self.link.consume(n);
            if self.resp.take_failure().is_some() {
                self.closed = true; // the driver closes the connection
                return;
            }
            let answered = self.answer_all();
            if n == 0 && !answered {
                return;
            }
        }
    }

    fn answer(&mut self) {
        self.answer_all();
    }

    /// Sends everything queued (READ data copied out as the driver would send it).
    fn answer_all(&mut self) -> bool {
        let mut any = false;
        while let Some(out) = self.resp.poll_output() {
            any = true;
            match out {
                // What goes back must be a frame the requester's decoder takes.
                Output::Reply(r) => {
                    assert_eq!(Response::decode(&r.encode(), MAX_MSG).ok(), Some(r));
                    self.replies.push(r);
                }
                Output::Read(r) => {
                    let readable = self.readable();
                    let arena = self.arena;
                    let reply = read_frame(&self.target, &r, |hdr, data| {
                        let h = Response::decode(hdr, MAX_MSG).ok();
                        match (h, data) {
                            (Some(Response::ReadData { len, .. }), Some((_, l))) => {
                                assert_eq!(len as usize, l)
                            }
                            (Some(Response::Nak { .. }), None) => {}
                            (h, d) => panic!("READ answered with {h:?} and data {d:?}"),
                        }
                        if let Some((addr, len)) = data.filter(|&(_, l)| l > 0) {
                            assert!(
                                inside(&readable, addr, len as u64),
                                "READ data from {addr:#x}+{len}, not readable"
                            );
                            arena.read(addr, len);
                        }
                        h.expect("checked above")
                    });
                    self.replies.push(reply);
                }
                // Answered by the driver (with a memfd when the region can be shared).
                Output::Map { .. } => {}
            }
        }
        any
    }

    /// The driver receives a payload in place: at most `n` bytes of the link, or the
    /// receive fails.
    fn receive(&mut self, n: usize, fail: bool) {
        let writable = self.writable();
        let (arena, link) = (self.arena, self.link.pending());
        let r = self.resp.receive_payload(&self.target, |pieces| {
            if fail {
                return Err(());
            }
            Ok(arena.receive(pieces, &writable, link, n))
        });
        if let Some(Ok(got)) = r {
            self.link.consume(got);
        }
    }

    /// The final checks: memory, and receive completions.
    fn check(&self) {
        self.arena.check_untouched(&self.writable());
        let mut seen = HashMap::new();
        for c in self.target.completions.lock().iter() {
            assert_eq!(c.qp_num, QPN);
            let capacity = *self
                .posted
                .get(&c.wr_id)
                .expect("completion of a posted receive");
            assert!(
                seen.insert(c.wr_id, ()).is_none(),
                "receive {} twice",
                c.wr_id
            );
            assert!(matches!(
                c.opcode,
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
            ));
            if c.status == WcStatus::Success && c.opcode == WcOpcode::Recv {
                assert!(c.byte_len as u64 <= capacity, "{c:?} over {capacity} bytes");
            } else if c.status != WcStatus::Success {
                assert_eq!(c.byte_len, 0);
            }
        }
    }
}

/// Runs one program (and the driver's final drain) in `arena`; the checks passed.
pub(super) fn execute<'a>(arena: &'a Arena, data: &[u8]) -> Run<'a> {
    let mut run = Run::new(arena);
    let mut input = Input::new(data);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        run.step(Step::parse(&mut input));
    }
    // The driver goes on serving what arrived (time enough for every wait to end).
    run.feed(0);
    run.now += Duration::from_secs(10);
    run.feed(0);
    run.check();
    run
}

/// Runs one program.
pub(super) fn run(data: &[u8]) {
    with_arena(|arena| drop(execute(arena, data)))
}
