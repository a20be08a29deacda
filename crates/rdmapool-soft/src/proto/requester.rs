//! The requester half of a soft RC queue pair, as a state machine without I/O.
//!
//! It numbers work requests, builds their frames, matches responses to them in order,
//! moves READ data and atomic results into local memory, keeps the RC rules (the first
//! error completes with its status, everything after it is flushed) and the retry timeout.
//! It never reads a clock or touches a socket: the driver (`soft::qp`) passes `now`, feeds
//! the bytes that arrived, sends the frames it is given, and closes the connection when told.
//! Tests drive it against a [`super::responder::Responder`] in memory with a fake clock.

use super::stream::{receive_into, HeaderBuf, Sink};
use super::wire::{ReqOp, Request, Response, RESP_LEN};
use crate::fabric::{WcOpcode, WcStatus, WrOp};
use crate::keys::LocalList;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// On the wire; its response has not arrived.
    Sent,
    /// Finished with this status; completes in posting order.
    Done(WcStatus),
}

/// One send-queue entry.
pub struct Entry {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    seq: u64,
    /// Bytes the request moves (its SGEs' total).
    pub byte_len: u32,
    /// When it times out: set when it goes on the wire ([`Requester::sent`]); a request
    /// that never does needs no clock.
    deadline: Option<Instant>,
    outcome: Outcome,
    /// The checked local SGEs: the payload's source, or where READ data and atomic results
    /// land.
    pub local: LocalList,
}

/// A finished work request, leaving the queue in posting order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub signaled: bool,
    pub status: WcStatus,
    pub byte_len: u32,
}

/// A READ payload being received.
struct Body {
    /// Where it goes; `None` once it must be discarded (a local region was deregistered).
    sink: Option<Sink>,
    /// Bytes still to come.
    left: usize,
}

/// The requester state machine of one QP.
pub struct Requester {
    depth: usize,
    timeout: Duration,
    max_msg: u32,
    /// Posting order: completed entries not yet taken, then those on the wire, then (only
    /// after a local failure) flushed ones.
    pending: VecDeque<Entry>,
    /// Finished entries posted before everything in `pending`, kept as their completions
    /// only: an entry finished at once with nothing pending before it (the intra-host path,
    /// a local error) is not moved into `pending` (a few hundred bytes each).
    done_early: VecDeque<Finished>,
    /// Entries before this index are done (a hint; the oldest sent one is at or after it).
    head_done: usize,
    in_flight: usize,
    next_seq: u64,
    /// A work request failed locally: later ones are flushed, never sent.
    failed: bool,
    /// The connection is dead (with the status its oldest request got).
    broken: Option<WcStatus>,
    /// The driver must close the connection (set once, when it breaks).
    close: bool,
    hdr: HeaderBuf<RESP_LEN>,
    body: Option<Body>,
}

impl Requester {
    /// A send queue of `depth` entries whose requests time out after `timeout`.
    pub fn new(depth: u32, timeout: Duration, max_msg: u32) -> Self {
        Self {
            depth: depth as usize,
            timeout,
            max_msg,
            pending: VecDeque::with_capacity(depth as usize),
            done_early: VecDeque::with_capacity(depth as usize),
            head_done: 0,
            in_flight: 0,
            next_seq: 0,
            failed: false,
            broken: None,
            close: false,
            hdr: HeaderBuf::new(),
            body: None,
        }
    }

    /// Free entries.
    pub fn room(&self) -> usize {
        self.depth - self.pending.len() - self.done_early.len()
    }

    /// Requests on the wire.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether new work requests are executed (no earlier failure, a live connection).
    pub fn accepts_work(&self) -> bool {
        !self.failed && self.broken.is_none()
    }

    /// Whether the connection is dead.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Nothing on the wire and no response half read: a request may be executed out of band
    /// (the intra-host path) without breaking RC order.
    pub fn is_quiet(&self) -> bool {
        self.in_flight == 0 && self.hdr.is_empty() && self.body.is_none()
    }

    /// Takes an entry, or `None` when the queue is full. It stays flushed unless the caller
    /// executes it ([`Self::finish`] or [`Self::sent`]); either way it must be handed back.
    #[inline]
    pub fn entry(&mut self, wr_id: u64, opcode: WcOpcode, signaled: bool) -> Option<Entry> {
        if self.room() == 0 {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        Some(Entry {
            wr_id,
            opcode,
            signaled,
            seq,
            byte_len: 0,
            deadline: None,
            outcome: Outcome::Done(WcStatus::WrFlushErr),
            local: LocalList::new(),
        })
    }

    /// Records a work request executed at posting without an [`Entry`] (the intra-host
    /// path, a local error found before it was queued): it completes with `status` in
    /// order, as [`Self::finish`] would complete its entry. The caller checked that the
    /// queue has room. Cheaper than `entry` + `finish`: nothing of the request's local list
    /// is copied when nothing is pending before it.
    #[inline]
    pub fn finish_now(
        &mut self,
        wr_id: u64,
        opcode: WcOpcode,
        signaled: bool,
        byte_len: u32,
        status: WcStatus,
    ) {
        debug_assert!(self.room() > 0, "finish_now on a full send queue");
        if status != WcStatus::Success {
            self.failed = true;
        }
        if self.pending.is_empty() {
            self.next_seq += 1;
            self.done_early.push_back(Finished {
                wr_id,
                opcode,
                signaled,
                status,
                byte_len,
            });
            return;
        }
        if let Some(mut e) = self.entry(wr_id, opcode, signaled) {
            e.byte_len = byte_len;
            e.outcome = Outcome::Done(status);
            self.pending.push_back(e);
        }
    }

    /// Hands back an entry that was not executed: it completes with a flush error.
    #[inline]
    pub fn flush(&mut self, e: Entry) {
        self.push_done(e, WcStatus::WrFlushErr);
    }

    /// Hands back an entry executed without the wire (a local operation, a local error, or
    /// the intra-host path): it completes with `status` in order. An error stops the queue.
    #[inline]
    pub fn finish(&mut self, e: Entry, status: WcStatus) {
        if status != WcStatus::Success {
            self.failed = true;
        }
        self.push_done(e, status);
    }

    #[inline]
    fn push_done(&mut self, mut e: Entry, status: WcStatus) {
        if self.pending.is_empty() {
            // Everything posted before it has completed: only its completion is kept.
            self.done_early.push_back(Finished {
                wr_id: e.wr_id,
                opcode: e.opcode,
                signaled: e.signaled,
                status,
                byte_len: e.byte_len,
            });
            return;
        }
        e.outcome = Outcome::Done(status);
        self.pending.push_back(e);
    }

    /// The frame that carries `e` (its payload, if any, is `e.local`'s ranges).
    pub fn frame(&self, e: &Entry, op: &WrOp) -> Request {
        let (op, remote, compare_add, swap, imm) = match *op {
            WrOp::Send { imm } => (ReqOp::Send, None, 0, 0, imm),
            WrOp::Write { remote, imm } => (ReqOp::Write, Some(remote), 0, 0, imm),
            WrOp::Read { remote } => (ReqOp::Read, Some(remote), 0, 0, None),
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            } => (ReqOp::CompareSwap, Some(remote), compare, swap, None),
            WrOp::FetchAdd { remote, add } => (ReqOp::FetchAdd, Some(remote), add, 0, None),
            // Never framed: completed locally by the driver.
            WrOp::LocalInvalidate { .. } => (ReqOp::Map, None, 0, 0, None),
        };
        Request {
            op,
            seq: e.seq,
            remote_addr: remote.map_or(0, |r| r.addr),
            rkey: remote.map_or(0, |r| r.rkey),
            len: e.byte_len,
            compare_add,
            swap,
            imm,
        }
    }

    /// Hands back an entry whose frame went on the wire at `now`. Returns true when it is the
    /// only request in flight (the driver then starts watching for responses and timeouts).
    pub fn sent(&mut self, mut e: Entry, now: Instant) -> bool {
        e.outcome = Outcome::Sent;
        e.deadline = Some(now + self.timeout);
        self.pending.push_back(e);
        self.in_flight += 1;
        self.in_flight == 1
    }

    /// The index of the oldest request on the wire.
    fn oldest_sent(&mut self) -> Option<usize> {
        if self.in_flight == 0 {
            return None;
        }
        while self.pending.get(self.head_done)?.outcome != Outcome::Sent {
            self.head_done += 1;
        }
        Some(self.head_done)
    }

    /// When the oldest request on the wire times out, if any is.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.in_flight == 0 {
            return None;
        }
        self.pending
            .iter()
            .skip(self.head_done)
            .find(|e| e.outcome == Outcome::Sent)
            .and_then(|e| e.deadline)
    }

    /// Retries exhausted: if the oldest request's deadline has passed at `now`, the
    /// connection breaks (that request completes with `RetryExcErr`, later ones flush).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|d| now >= d) {
            self.lose_connection(WcStatus::RetryExcErr);
        }
    }

    /// The connection is dead (EOF, reset, a send that failed, the QP moved to ERR): the
    /// oldest request on the wire gets `status`, the others are flushed.
    pub fn lose_connection(&mut self, status: WcStatus) {
        if self.broken.is_none() {
            self.close = true;
        }
        self.broken.get_or_insert(status);
        let mut first = true;
        for e in self.pending.iter_mut() {
            if e.outcome == Outcome::Sent {
                e.outcome = Outcome::Done(if first { status } else { WcStatus::WrFlushErr });
                first = false;
            }
        }
        self.in_flight = 0;
        self.body = None;
    }

    /// Whether the driver must close the connection now (true once, when it broke).
    pub fn take_close(&mut self) -> bool {
        std::mem::take(&mut self.close)
    }

    /// Nothing to progress: no request posted and not yet completed, none on the wire, no
    /// response half read, no close to act on.
    pub fn is_idle(&self) -> bool {
        self.is_quiet() && self.pending.is_empty() && self.done_early.is_empty() && !self.close
    }

    /// Feeds bytes that arrived on the connection; returns how many were used (all of them
    /// unless a READ payload is due, which the driver may receive in place with
    /// [`Self::receive_payload`], or the connection broke).
    pub fn handle_input(&mut self, input: &[u8]) -> usize {
        let mut used = 0;
        while used < input.len() && self.broken.is_none() {
            if let Some(body) = &mut self.body {
                let rest = &input[used..];
                let n = match &mut body.sink {
                    Some(sink) => match sink.copy_in(&rest[..rest.len().min(body.left)]) {
                        Some(n) => n,
                        None => {
                            body.sink = None; // deregistered: discard the rest
                            continue;
                        }
                    },
                    None => rest.len().min(body.left),
                };
                used += n;
                self.payload_progress(n);
                continue;
            }
            used += self.hdr.fill(&input[used..]);
            if let Some(hdr) = self.hdr.take() {
                self.on_response(&hdr);
            }
        }
        if self.broken.is_some() {
            return input.len();
        }
        used
    }

    /// While a READ payload is due: gives its destination pieces to `recv` (which receives
    /// into them and returns the bytes it got). `None` when no payload is due or it must be
    /// discarded (then the driver feeds the bytes through [`Self::handle_input`]).
    pub fn receive_payload<E>(
        &mut self,
        recv: impl FnOnce(&[(u64, usize)]) -> Result<usize, E>,
    ) -> Option<Result<usize, E>> {
        let r = receive_into(&mut self.body.as_mut()?.sink, recv)?;
        if let Ok(n) = r {
            self.payload_progress(n);
        }
        Some(r)
    }

    fn payload_progress(&mut self, n: usize) {
        let Some(body) = &mut self.body else { return };
        body.left -= n;
        if body.left == 0 {
            let status = if body.sink.is_some() {
                WcStatus::Success
            } else {
                WcStatus::LocProtErr
            };
            self.body = None;
            self.complete_oldest(status);
        }
    }

    fn complete_oldest(&mut self, status: WcStatus) {
        if let Some(i) = self.oldest_sent() {
            self.pending[i].outcome = Outcome::Done(status);
            self.in_flight -= 1;
        }
    }

    /// Applies one response header to the oldest request on the wire.
    fn on_response(&mut self, hdr: &[u8; RESP_LEN]) {
        let Ok(resp) = Response::decode(hdr, self.max_msg) else {
            return self.lose_connection(WcStatus::BadRespErr);
        };
        let Some(i) = self.oldest_sent() else {
            return self.lose_connection(WcStatus::BadRespErr);
        };
        let e = &mut self.pending[i];
        if e.seq != resp.seq() {
            return self.lose_connection(WcStatus::BadRespErr);
        }
        let status = match (resp, e.opcode) {
            (Response::Ack { .. }, WcOpcode::Send | WcOpcode::RdmaWrite) => WcStatus::Success,
            (Response::Nak { status, .. }, _) => status,
            (Response::ReadData { len, .. }, WcOpcode::RdmaRead) if len == e.byte_len => {
                if len > 0 {
                    let local = std::mem::take(&mut e.local);
                    self.body = Some(Body {
                        sink: Some(Sink::new(local, len as usize)),
                        left: len as usize,
                    });
                    return;
                }
                WcStatus::Success
            }
            (Response::Atomic { old, .. }, WcOpcode::CompSwap | WcOpcode::FetchAdd) => {
                let mut sink = Sink::new(std::mem::take(&mut e.local), 8);
                match sink.copy_in(&old.to_ne_bytes()) {
                    Some(8) => WcStatus::Success,
                    _ => WcStatus::LocProtErr,
                }
            }
            _ => return self.lose_connection(WcStatus::BadRespErr),
        };
        self.complete_oldest(status);
    }

    /// The next finished work request in posting order, if the oldest one is finished.
    pub fn poll_done(&mut self) -> Option<Finished> {
        if let Some(done) = self.done_early.pop_front() {
            return Some(done);
        }
        let e = self.pending.front()?;
        let Outcome::Done(status) = e.outcome else {
            return None;
        };
        let done = Finished {
            wr_id: e.wr_id,
            opcode: e.opcode,
            signaled: e.signaled,
            status,
            byte_len: e.byte_len,
        };
        // Dropped where it lies: an entry is a few hundred bytes, not worth moving out.
        drop(self.pending.drain(..1));
        self.head_done = self.head_done.saturating_sub(1);
        Some(done)
    }
}
