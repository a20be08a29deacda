//! One connection after its handshake: bytes in, through the [`Responder`], and its answers
//! out, without ever blocking the loop that serves it. What cannot be sent now waits in the
//! connection (and no more requests are taken meanwhile); READ data leaves straight from
//! registered memory, even across several writes, but a small READ's is copied in with the
//! replies around it (one send for many).

use super::super::context::CtxShared;
use super::super::io::{self, IoVecs, RxBuf};
use super::super::proto::responder::{self, Output, ReadOut, Responder};
use super::super::proto::target::TargetQp;
use super::super::proto::wire::{Response, RESP_LEN};
use super::super::shm;
use crate::fabric::AccessFlags;
use std::os::fd::RawFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Responses held back to go out together, at most.
const TX_BATCH: usize = 64;
/// How often a stalled request (waiting for a receive or for the QP to be ready) is retried.
const STALL_RETRY: Duration = Duration::from_micros(50);

/// What a connection waits for before it is stepped again.
pub(super) struct Wait {
    /// The epoll events it watches (none, edge-triggered, while it only waits for its timer).
    pub(super) events: u32,
    /// When it is stepped again whatever happens.
    pub(super) until: Option<Instant>,
}

/// Why a connection ends.
pub(super) enum End {
    /// Its QP is gone, or the peer sent a malformed frame (answered up to it).
    Clean,
    /// The peer left (EOF, reset), stopped reading, or stopped mid-frame.
    Failed(String),
}

/// The kind of the next answer.
enum Next {
    Reply,
    Read,
    Map { seq: u64, rkey: u32 },
}

/// A READ answer partly sent.
struct ReadInFlight {
    read: ReadOut,
    /// Bytes of the frame (header and data) already sent.
    sent: usize,
}

/// A connection serving one QP.
pub(super) struct Serving {
    qp: Weak<dyn TargetQp>,
    pub(super) qpn: u32,
    /// Whether the peer may map regions (same user on this host, mappings allowed).
    mappable_peer: bool,
    resp: Responder,
    rx: RxBuf,
    /// Replies queued and not yet sent; `tx_sent` of them are out.
    tx: Vec<u8>,
    tx_sent: usize,
    read: Option<ReadInFlight>,
    pub(super) last_progress: Instant,
    /// Since when the answers have not fit in the socket.
    blocked_since: Option<Instant>,
}

impl Serving {
    pub(super) fn new(ctx: &CtxShared, qp: &Arc<dyn TargetQp>, mappable_peer: bool) -> Self {
        Self {
            qp: Arc::downgrade(qp),
            qpn: qp.qpn(),
            mappable_peer,
            resp: Responder::new(ctx.max_msg),
            rx: RxBuf::new(),
            tx: Vec::with_capacity(TX_BATCH * RESP_LEN),
            tx_sent: 0,
            read: None,
            last_progress: Instant::now(),
            blocked_since: None,
        }
    }

    /// The QP it serves, while it lives.
    pub(super) fn qp(&self) -> Option<Arc<dyn TargetQp>> {
        self.qp.upgrade()
    }

    /// Does all that can be done now: answers first, then whatever has arrived, until the
    /// connection must wait (for bytes, for room in the socket, or for a stalled request).
    pub(super) fn step(&mut self, ctx: &CtxShared, fd: RawFd, now: Instant) -> Result<Wait, End> {
        loop {
            let Some(qp) = self.qp.upgrade() else {
                return Err(End::Clean);
            };
            let timeout = qp.timeout();
            // Requests already read are answered before anything is sent: their replies go
            // out in one send (a list of small READs: one send, not one per READ). Every
            // way out of this loop sends what is queued first (`wait`, `blocked`).
            let answering =
                self.rx.len() > 0 && self.read.is_none() && self.tx.len() < TX_BATCH * RESP_LEN;
            if !answering && !self.send_pending(&*qp, fd)? {
                return self.blocked(now, timeout);
            }
            self.blocked_since = None;
            let mut progressed = false;
            if self.rx.len() > 0 || self.resp.is_stalled() {
                let n = self.resp.handle_input(&*qp, self.rx.data(), now);
                self.rx.consume(n);
                progressed |= n > 0;
            }
            if let Some(e) = self.resp.take_failure() {
                tracing::warn!(qpn = self.qpn, "closing connection: {e}");
                // What was executed is answered, even when the connection ends on a bad frame.
                self.answer(ctx, &*qp, fd)?;
                let _ = self.send_pending(&*qp, fd);
                return Err(End::Clean);
            }
            if self.rx.len() == 0 {
                let recv = |p: &[(u64, usize)]| {
                    // SAFETY: the pieces are target memory that passed the access check (or
                    // receive buffers checked for LOCAL_WRITE), kept registered by
                    // `receive_payload` while it runs.
                    unsafe { io::recv_into_nowait(fd, p) }
                };
                match self.resp.receive_payload(&*qp, recv) {
                    Some(Ok(n)) => progressed |= n > 0,
                    Some(Err(e)) => return Err(End::Failed(e.to_string())),
                    None => {}
                }
            }
            progressed |= self.answer(ctx, &*qp, fd)?;
            if progressed {
                self.last_progress = now;
                continue;
            }
            if self.resp.is_stalled() {
                // Waiting for a receive or for the QP: answer what is done, retry shortly.
                let retry = now + STALL_RETRY;
                let until = self.resp.poll_timeout().map_or(retry, |t| t.min(retry));
                // No interest in the socket meanwhile; edge-triggered, so that an error or a
                // hang-up (which epoll reports whatever the interest) wakes the loop once, not
                // on every turn until the retry.
                return self.wait(&*qp, fd, now, libc::EPOLLET as u32, Some(until));
            }
            match self.rx.fill_nowait(fd) {
                Ok(0) => {}
                Ok(_) => continue,
                Err(e) => return Err(End::Failed(e.to_string())), // EOF or reset
            }
            let mut until = None;
            if self.resp.is_mid_frame() {
                if now.saturating_duration_since(self.last_progress) > timeout {
                    return Err(End::Failed("peer stalled in the middle of a frame".into()));
                }
                until = Some(self.last_progress + timeout);
            }
            return self.wait(&*qp, fd, now, libc::EPOLLIN as u32, until);
        }
    }

    /// One last try at sending what was answered, before the connection closes: the
    /// replies queued go out even when the QP is gone (a NAK that moved it to ERR, whose
    /// owner then destroyed it at once, must still reach the requester).
    pub(super) fn finish(&mut self, fd: RawFd) {
        if let Ok(true) = self.flush(fd) {
            if let Some(qp) = self.qp.upgrade() {
                let _ = self.continue_read(&*qp, fd);
            }
        }
    }

    /// Sends what is queued, then waits for `events` (or for room, if it did not all fit).
    fn wait(
        &mut self,
        qp: &dyn TargetQp,
        fd: RawFd,
        now: Instant,
        events: u32,
        until: Option<Instant>,
    ) -> Result<Wait, End> {
        if self.send_pending(qp, fd)? {
            self.blocked_since = None;
            return Ok(Wait { events, until });
        }
        self.blocked(now, qp.timeout())
    }

    /// The answers do not fit in the socket: wait for room, at most `timeout` in all.
    fn blocked(&mut self, now: Instant, timeout: Duration) -> Result<Wait, End> {
        let since = *self.blocked_since.get_or_insert(now);
        if now.saturating_duration_since(since) > timeout {
            return Err(End::Failed(
                "peer did not take its responses in time".into(),
            ));
        }
        Ok(Wait {
            events: libc::EPOLLOUT as u32,
            until: Some(since + timeout),
        })
    }

    /// Sends the queued replies, then the READ in flight. True when nothing is left.
    fn send_pending(&mut self, qp: &dyn TargetQp, fd: RawFd) -> Result<bool, End> {
        Ok(self.flush(fd)? && self.continue_read(qp, fd)?)
    }

    /// Sends the queued replies without waiting. True when all are out.
    fn flush(&mut self, fd: RawFd) -> Result<bool, End> {
        while self.tx_sent < self.tx.len() {
            let mut iov = IoVecs::new();
            let rest = &self.tx[self.tx_sent..];
            iov.push(rest.as_ptr(), rest.len());
            // SAFETY: the piece is our own send queue, borrowed for the call.
            match unsafe { io::send_nowait(fd, &mut iov) } {
                Ok(0) => return Ok(false),
                Ok(n) => self.tx_sent += n,
                Err(e) => return Err(End::Failed(e.to_string())),
            }
        }
        self.tx.clear();
        self.tx_sent = 0;
        Ok(true)
    }

    /// Sends what is left of the READ in flight, straight from its region while the region
    /// stays registered. True when it is all out (or there is none).
    fn continue_read(&mut self, qp: &dyn TargetQp, fd: RawFd) -> Result<bool, End> {
        let Some(r) = &mut self.read else {
            return Ok(true);
        };
        let sent = r.sent;
        let outcome = responder::read_frame(qp, &r.read, |hdr, data| {
            if sent > 0 && data.is_none() {
                // Deregistered while its data was going out: the frame cannot be finished.
                return Err("region deregistered during a READ".to_string());
            }
            let mut iov = IoVecs::new();
            iov.push(hdr.as_ptr(), hdr.len());
            if let Some((addr, len)) = data {
                iov.push(addr as *const u8, len);
            }
            iov.advance(sent);
            let mut more = 0;
            while !iov.is_done() {
                // SAFETY: the header is ours; the data range passed the access check of a
                // region that `read_frame` keeps registered during this call.
                match unsafe { io::send_nowait(fd, &mut iov) } {
                    Ok(0) => return Ok((more, false)),
                    Ok(n) => {
                        iov.advance(n);
                        more += n;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok((more, true))
        });
        match outcome {
            Ok((more, done)) => {
                r.sent += more;
                if done {
                    self.read = None;
                }
                Ok(done)
            }
            Err(reason) => Err(End::Failed(reason)),
        }
    }

    /// Moves what the responder queued toward the socket, in order: replies into the send
    /// queue (sent in batches), READ data and map answers once everything before them is out.
    /// A READ or map answer that cannot go yet stays in the responder, and the requests
    /// behind it wait. Returns whether anything was taken.
    fn answer(&mut self, ctx: &CtxShared, qp: &dyn TargetQp, fd: RawFd) -> Result<bool, End> {
        let mut any = false;
        while self.read.is_none() {
            let next = match self.resp.peek_output() {
                None => break,
                Some(Output::Reply(_)) => Next::Reply,
                // A small READ's data is copied into the send queue with the replies.
                Some(Output::Read(r)) if r.bytes() <= responder::COPY_READ_MAX => Next::Reply,
                Some(Output::Read(_)) => Next::Read,
                Some(&Output::Map { seq, rkey }) => Next::Map { seq, rkey },
            };
            // READ data and map answers leave straight from the socket: only in order.
            if !matches!(next, Next::Reply) && !self.flush(fd)? {
                break;
            }
            if let Next::Map { seq, rkey } = next {
                if !self.answer_map(ctx, fd, seq, rkey)? {
                    break;
                }
            }
            match self.resp.poll_output() {
                Some(Output::Reply(r)) => {
                    self.tx.extend_from_slice(&r.encode());
                    if self.tx.len() >= TX_BATCH * RESP_LEN && !self.flush(fd)? {
                        any = true;
                        break;
                    }
                }
                Some(Output::Read(read)) if read.bytes() <= responder::COPY_READ_MAX => {
                    responder::read_frame_into(qp, &read, &mut self.tx);
                    if self.tx.len() >= TX_BATCH * RESP_LEN && !self.flush(fd)? {
                        any = true;
                        break;
                    }
                }
                Some(Output::Read(read)) => {
                    self.read = Some(ReadInFlight { read, sent: 0 });
                    self.continue_read(qp, fd)?;
                }
                Some(Output::Map { .. }) | None => {}
            }
            any = true;
        }
        Ok(any)
    }

    /// Answers a map request (the send queue is empty): the memfd of an owned region that
    /// grants both remote read and write (a mapping gives both), to a same-user peer on the
    /// local path; the peer checks every access against the region's control page itself.
    /// Anything else goes through the socket, checked here. False when the socket is full.
    fn answer_map(&mut self, ctx: &CtxShared, fd: RawFd, seq: u64, rkey: u32) -> Result<bool, End> {
        let both = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let mr = ctx.keys.by_rkey(rkey);
        let memfd = mr
            .as_ref()
            .filter(|m| m.access.contains(both) && self.mappable_peer)
            .and_then(|m| m.memory.as_ref())
            .map(shm::raw);
        let hdr = Response::Map {
            seq,
            mappable: memfd.is_some(),
        }
        .encode();
        let sent = match memfd {
            Some(m) => {
                shm::send_with_fds_nowait(fd, &hdr, &[m]).map_err(|e| End::Failed(e.to_string()))?
            }
            None => {
                self.tx.extend_from_slice(&hdr);
                hdr.len()
            }
        };
        if sent == 0 {
            return Ok(false);
        }
        // The descriptor went with the first bytes; the rest follows as plain bytes.
        self.tx.extend_from_slice(&hdr[sent..]);
        Ok(true)
    }
}
