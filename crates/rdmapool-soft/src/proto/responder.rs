//! The responder half of a soft RC queue pair, as a state machine without I/O.
//!
//! It reads request frames out of the bytes a driver feeds it, makes the HCA's checks (one
//! check, `soft::access`), executes WRITE, SEND and atomics against registered memory,
//! and queues what goes back in order ([`Output`]). A request that must wait (the QP is not
//! ready yet, no receive is posted) stalls the stream until it can go on or its time is up;
//! the driver passes `now` and retries. It never reads a clock or touches a socket.

use super::stream::{receive_into, HeaderBuf, Sink};
use super::target::{RecvEntry, TargetQp};
use super::wire::{ReqOp, Request, Response, REQ_LEN, RESP_LEN};
use crate::access::RemoteAccess;
use crate::fabric::{AccessFlags, Completion, QpState, WcOpcode, WcStatus};
use crate::keys::{LocalList, MrInner, Resolved};
use crate::Error;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What goes back to the requester, in order.
pub enum Output {
    /// A fixed-size response.
    Reply(Response),
    /// READ data: the response header, then `len` bytes of `mr` at `addr` (see
    /// [`read_frame`]).
    Read(ReadOut),
    /// A map request (intra-host path): the driver answers it, with the region's memfd if it
    /// can be shared.
    Map { seq: u64, rkey: u32 },
}

/// A READ to answer.
pub struct ReadOut {
    seq: u64,
    mr: Option<Arc<MrInner>>,
    addr: u64,
    len: u32,
}

/// The largest READ whose data goes into the connection's send queue, copied, with the
/// answers around it (one send for many), rather than straight from its region by a send
/// of its own: a system call costs more than copying this much.
pub const COPY_READ_MAX: u32 = 8 << 10;

impl ReadOut {
    /// The bytes it reads.
    pub fn bytes(&self) -> u32 {
        self.len
    }
}

/// A request that waits (for the QP to reach RTR or RTS, or for a posted receive).
struct Stall {
    req: Request,
    give_up: Instant,
}

/// What happens once a payload is in.
// The receive entry is large (its SGE list is inline); it lives in the responder, not
// passed around, and boxing it would allocate per WRITE with immediate.
#[allow(clippy::large_enum_variant)]
enum After {
    /// Nothing: it was discarded, the answer is queued already.
    Nothing,
    /// A WRITE, with the receive its immediate consumes.
    Write {
        req: Request,
        recv: Option<RecvEntry>,
    },
    /// A SEND into this receive.
    Send { req: Request, wr_id: u64 },
}

struct Body {
    sink: Option<Sink>,
    left: usize,
    then: After,
}

/// The responder state machine of one connection.
pub struct Responder {
    max_msg: u32,
    hdr: HeaderBuf<REQ_LEN>,
    body: Option<Body>,
    stalled: Option<Stall>,
    out: VecDeque<Output>,
    /// READ and map answers queued and not yet taken: later requests wait for them (a READ
    /// returns the memory as it was when it executed, before any later WRITE or atomic).
    unanswered: usize,
    /// A malformed frame arrived: the driver closes the connection.
    failed: Option<Error>,
}

impl Responder {
    /// A responder that refuses lengths over `max_msg`.
    pub fn new(max_msg: u32) -> Self {
        Self {
            max_msg,
            hdr: HeaderBuf::new(),
            body: None,
            stalled: None,
            out: VecDeque::new(),
            unanswered: 0,
            failed: None,
        }
    }

    /// Whether part of a frame (a header or a payload) has arrived and the rest has not.
    pub fn is_mid_frame(&self) -> bool {
        !self.hdr.is_empty() || self.body.is_some()
    }

    /// Whether a request waits (the driver retries soon, feeding bytes or not).
    pub fn is_stalled(&self) -> bool {
        self.stalled.is_some()
    }

    /// When the stalled request gives up, if one is stalled.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.stalled.as_ref().map(|s| s.give_up)
    }

    /// Why the connection must close, once (a malformed frame).
    pub fn take_failure(&mut self) -> Option<Error> {
        self.failed.take()
    }

    /// The next thing to send back, left queued: a driver that cannot send a READ or map
    /// answer now leaves it here, and later requests keep waiting behind it.
    pub fn peek_output(&self) -> Option<&Output> {
        self.out.front()
    }

    /// The next thing to send back.
    pub fn poll_output(&mut self) -> Option<Output> {
        let o = self.out.pop_front()?;
        if !matches!(o, Output::Reply(_)) {
            self.unanswered -= 1;
        }
        Some(o)
    }

    /// Feeds bytes that arrived (possibly none, to retry a stalled request at `now`); returns
    /// how many were used. Bytes are left over while a request is stalled, while a READ or
    /// map answer waits to be taken ([`Self::poll_output`]), when a payload is due that the
    /// driver may receive in place ([`Self::receive_payload`]), or after a malformed frame.
    pub fn handle_input(&mut self, qp: &dyn TargetQp, input: &[u8], now: Instant) -> usize {
        let mut used = 0;
        loop {
            if self.failed.is_some() || self.unanswered > 0 {
                return used;
            }
            if let Some(s) = self.stalled.take() {
                self.execute(qp, s.req, now, Some(s.give_up));
                if self.stalled.is_some() {
                    return used;
                }
                continue;
            }
            if used == input.len() {
                return used;
            }
            if let Some(body) = &mut self.body {
                let rest = &input[used..];
                let rest = &rest[..rest.len().min(body.left)];
                let n = match &mut body.sink {
                    Some(sink) => match sink.copy_in(rest) {
                        Some(n) => n,
                        None => {
                            body.sink = None;
                            continue;
                        }
                    },
                    None => rest.len(),
                };
                used += n;
                self.payload_progress(qp, n);
                continue;
            }
            used += self.hdr.fill(&input[used..]);
            if let Some(hdr) = self.hdr.take() {
                match Request::decode(&hdr, self.max_msg) {
                    Ok(req) => self.execute(qp, req, now, None),
                    Err(e) => self.failed = Some(e),
                }
            }
        }
    }

    /// While a payload is due: gives its destination pieces to `recv` (which receives into
    /// them and returns the bytes it got). `None` when no payload is due or it is being
    /// discarded (the driver then feeds the bytes through [`Self::handle_input`]).
    pub fn receive_payload<E>(
        &mut self,
        qp: &dyn TargetQp,
        recv: impl FnOnce(&[(u64, usize)]) -> Result<usize, E>,
    ) -> Option<Result<usize, E>> {
        let r = receive_into(&mut self.body.as_mut()?.sink, recv)?;
        if let Ok(n) = r {
            self.payload_progress(qp, n);
        }
        Some(r)
    }

    fn reply(&mut self, r: Response) {
        self.out.push_back(Output::Reply(r));
    }

    /// Refuses a request: NAK with `status`, its payload (if any) discarded.
    fn refuse(&mut self, req: &Request, status: WcStatus) {
        self.reply(Response::Nak {
            seq: req.seq,
            status,
        });
        self.discard(req.payload_len() as usize);
    }

    fn discard(&mut self, len: usize) {
        if len > 0 {
            self.body = Some(Body {
                sink: None,
                left: len,
                then: After::Nothing,
            });
        }
    }

    /// Checks a remote access; on failure the request is refused and the QP goes to ERR.
    fn check(
        &mut self,
        qp: &dyn TargetQp,
        req: &Request,
        need: AccessFlags,
    ) -> Option<Arc<MrInner>> {
        let access = RemoteAccess {
            pd: qp.pd(),
            need,
            addr: req.remote_addr,
            len: req.len as u64,
            atomic: matches!(req.op, ReqOp::CompareSwap | ReqOp::FetchAdd),
        };
        match qp.keys().resolve(req.rkey, qp.qpn(), &access) {
            Ok(mr) => Some(mr),
            Err(status) => {
                qp.enter_error();
                self.refuse(req, status);
                None
            }
        }
    }

    /// Waits until `give_up` (set on the first try) for the request to be able to go on,
    /// or refuses it with `status`.
    fn wait(
        &mut self,
        req: Request,
        limit: Duration,
        now: Instant,
        give_up: Option<Instant>,
        status: WcStatus,
    ) {
        let give_up = give_up.unwrap_or(now + limit);
        if now >= give_up {
            self.refuse(&req, status);
        } else {
            self.stalled = Some(Stall { req, give_up });
        }
    }

    fn execute(&mut self, qp: &dyn TargetQp, req: Request, now: Instant, give_up: Option<Instant>) {
        match qp.state() {
            QpState::Rtr | QpState::Rts => {}
            QpState::Error => return self.refuse(&req, WcStatus::RetryExcErr),
            _ => {
                let t = qp.timeout();
                return self.wait(req, t, now, give_up, WcStatus::RetryExcErr);
            }
        }
        match req.op {
            ReqOp::Map => {
                // A key that names no region of this QP's PD ends the QP, as every other bad
                // key does: one guess per QP, never an oracle.
                if qp.keys().pd_of(req.rkey) != Some(qp.pd()) {
                    qp.enter_error();
                    return self.refuse(&req, WcStatus::RemAccessErr);
                }
                self.unanswered += 1;
                self.out.push_back(Output::Map {
                    seq: req.seq,
                    rkey: req.rkey,
                })
            }
            ReqOp::Read => {
                let mr = if req.len == 0 {
                    None
                } else {
                    match self.check(qp, &req, AccessFlags::REMOTE_READ) {
                        Some(mr) => Some(mr),
                        None => return,
                    }
                };
                self.unanswered += 1;
                self.out.push_back(Output::Read(ReadOut {
                    seq: req.seq,
                    mr,
                    addr: req.remote_addr,
                    len: req.len,
                }));
            }
            ReqOp::CompareSwap | ReqOp::FetchAdd => {
                let Some(mr) = self.check(qp, &req, AccessFlags::REMOTE_ATOMIC) else {
                    return;
                };
                let Some(_held) = mr.hold() else {
                    qp.enter_error();
                    return self.refuse(&req, WcStatus::RemAccessErr);
                };
                // SAFETY: 8-byte aligned (checked), inside a registered, pinned region kept
                // registered by `_held`; every RDMA atomic on this word goes through an
                // AtomicU64, so they are atomic with respect to each other across threads and
                // processes.
                let word = unsafe { &*(req.remote_addr as *const AtomicU64) };
                let old = if req.op == ReqOp::CompareSwap {
                    match word.compare_exchange(
                        req.compare_add,
                        req.swap,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(v) | Err(v) => v,
                    }
                } else {
                    word.fetch_add(req.compare_add, Ordering::AcqRel)
                };
                self.reply(Response::Atomic { seq: req.seq, old });
            }
            ReqOp::Write => {
                let mr = if req.len == 0 {
                    None
                } else {
                    match self.check(qp, &req, AccessFlags::REMOTE_WRITE) {
                        Some(mr) => Some(mr),
                        None => return,
                    }
                };
                // WRITE with immediate needs a receive before anything is written.
                let recv = match req.imm {
                    None => None,
                    Some(_) => match qp.take_recv() {
                        Some(r) => Some(r),
                        None => {
                            let t = qp.rnr_timeout();
                            let s = WcStatus::RnrRetryExcErr;
                            return self.wait(req, t, now, give_up, s);
                        }
                    },
                };
                let sink = mr.map(|mr| {
                    let mut list = LocalList::new();
                    list.push(Resolved {
                        mr,
                        addr: req.remote_addr,
                        len: req.len,
                    });
                    Sink::new(list, req.len as usize)
                });
                self.body = Some(Body {
                    sink,
                    left: req.len as usize,
                    then: After::Write { req, recv },
                });
                self.payload_progress(qp, 0);
            }
            ReqOp::Send => {
                let Some(r) = qp.take_recv() else {
                    let t = qp.rnr_timeout();
                    let s = WcStatus::RnrRetryExcErr;
                    return self.wait(req, t, now, give_up, s);
                };
                let fail = |this: &mut Self, status: WcStatus| {
                    recv_done(qp, r.wr_id, status, WcOpcode::Recv, 0, None);
                    qp.enter_error();
                    this.refuse(&req, WcStatus::RemOpErr);
                };
                let local = match r.local {
                    Ok(l) => l,
                    Err(status) => return fail(self, status),
                };
                if req.len as u64 > r.capacity {
                    // rxe's statuses: LOC_QP_OP_ERR for the receive, REM_OP_ERR for the sender.
                    return fail(self, WcStatus::LocQpOpErr);
                }
                self.body = Some(Body {
                    sink: Some(Sink::new(local, req.len as usize)),
                    left: req.len as usize,
                    then: After::Send {
                        req,
                        wr_id: r.wr_id,
                    },
                });
                self.payload_progress(qp, 0);
            }
        }
    }

    /// Counts `n` payload bytes in; when the payload is complete, finishes its request.
    fn payload_progress(&mut self, qp: &dyn TargetQp, n: usize) {
        let Some(body) = &mut self.body else { return };
        body.left -= n;
        if body.left > 0 {
            return;
        }
        let Some(body) = self.body.take() else { return };
        let intact =
            body.sink.is_some() || matches!(&body.then, After::Write { req, .. } if req.len == 0);
        match body.then {
            After::Nothing => {}
            After::Write { req, recv } => {
                if !intact {
                    // The region was deregistered under the payload.
                    if let Some(r) = recv {
                        recv_done(qp, r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0, None);
                    }
                    qp.enter_error();
                    return self.reply(Response::Nak {
                        seq: req.seq,
                        status: WcStatus::RemAccessErr,
                    });
                }
                if let Some(r) = recv {
                    let op = WcOpcode::RecvRdmaWithImm;
                    recv_done(qp, r.wr_id, WcStatus::Success, op, req.len, req.imm);
                }
                self.reply(Response::Ack { seq: req.seq });
            }
            After::Send { req, wr_id } => {
                if !intact {
                    recv_done(qp, wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, None);
                    qp.enter_error();
                    return self.reply(Response::Nak {
                        seq: req.seq,
                        status: WcStatus::RemOpErr,
                    });
                }
                recv_done(
                    qp,
                    wr_id,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    req.len,
                    req.imm,
                );
                self.reply(Response::Ack { seq: req.seq });
            }
        }
    }
}

fn recv_done(
    qp: &dyn TargetQp,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    len: u32,
    imm: Option<u32>,
) {
    qp.complete_recv(Completion {
        wr_id,
        status,
        opcode,
        byte_len: if status == WcStatus::Success { len } else { 0 },
        imm,
        qp_num: qp.qpn(),
    });
}

/// [`read_frame`], the frame appended to `out`: the header, then the data copied from the
/// region while it stays registered (for READs up to [`COPY_READ_MAX`]).
pub fn read_frame_into(qp: &dyn TargetQp, read: &ReadOut, out: &mut Vec<u8>) {
    read_frame(qp, read, |hdr, data| {
        out.extend_from_slice(hdr);
        if let Some((addr, len)) = data {
            out.reserve(len);
            let at = out.len();
            // SAFETY: the range passed the access check of a region that `read_frame` keeps
            // registered during this call. Its memory, which the peers' WRITEs and atomics
            // may change meanwhile (as RDMA allows: a READ racing a WRITE may see either), is
            // read through a raw pointer, never a reference, into the spare room `reserve`
            // made, which `set_len` then counts.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr().add(at), len);
                out.set_len(at + len);
            }
        }
    })
}

/// Builds the answer to a READ while its region stays registered: `send` gets the header and
/// the data range (address, length), or, if the region was deregistered since the check, a
/// NAK and no data (and the QP goes to ERR).
pub fn read_frame<R>(
    qp: &dyn TargetQp,
    read: &ReadOut,
    send: impl FnOnce(&[u8; RESP_LEN], Option<(u64, usize)>) -> R,
) -> R {
    let held = read.mr.as_ref().map(|mr| mr.hold());
    if let Some(None) = held {
        qp.enter_error();
        let nak = Response::Nak {
            seq: read.seq,
            status: WcStatus::RemAccessErr,
        };
        return send(&nak.encode(), None);
    }
    let hdr = Response::ReadData {
        seq: read.seq,
        len: read.len,
    }
    .encode();
    send(&hdr, Some((read.addr, read.len as usize)))
}
