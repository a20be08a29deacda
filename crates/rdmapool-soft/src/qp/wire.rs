//! The requester half on the wire: requests' frames out (header plus gathered payload; a
//! list's small ones together, in one send), responses in (applied as they arrive, never
//! waited for), and completions retired in posting order.

use super::{SendSide, SoftQp};
use crate::cq::Release;
use crate::fabric::{Completion, QpState, WcStatus};
use crate::io::{self, IoVecs};
use crate::proto::requester::Entry;
use crate::proto::wire::Request;
use crate::MAX_SGE;
use arrayvec::ArrayVec;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

/// A request whose payload is at most this is copied, header and payload, into the send
/// side's pending bytes, and goes out with the rest of its list in one send (a send of its
/// own per request cost a system call each); a larger one goes from its region.
const COPY_SEND_MAX: u32 = 8 << 10;

/// Pending bytes go out once there are this many, before the list's end.
const PENDING_MAX: usize = 64 << 10;

impl SoftQp {
    /// Puts one request on the wire (header plus gathered payload) and hands it back to the
    /// requester: a small one into the pending bytes, sent at the end of its list
    /// (`more` false); a large one from its region, after what is pending. While the socket
    /// is full, responses are applied (never waited for), so neither side can wait on the
    /// other forever.
    pub(super) fn transmit(
        &self,
        sq: &mut SendSide,
        req: &Request,
        e: Entry,
        more: bool,
        now: Instant,
    ) {
        if req.payload_len() <= COPY_SEND_MAX {
            let before = sq.tx.len();
            sq.tx.extend_from_slice(&req.encode());
            if req.payload_len() > 0 && !Self::copy_payload(&mut sq.tx, &e) {
                // Deregistered between the check and now.
                sq.tx.truncate(before);
                return sq.req.finish(e, WcStatus::LocProtErr);
            }
            self.on_the_wire(sq, e, now);
            if !more || sq.tx.len() >= PENDING_MAX {
                self.send_pending(sq, more, now);
            }
            return;
        }
        if !self.send_pending(sq, true, now) {
            return sq.req.finish(e, WcStatus::WrFlushErr);
        }
        let hdr = req.encode();
        let fd = sq
            .conn
            .as_ref()
            .map(|c| c.as_raw_fd())
            .expect("RTS has a connection");
        let mut iov = IoVecs::new();
        iov.push(hdr.as_ptr(), hdr.len());
        let sent = {
            let held: Option<ArrayVec<_, MAX_SGE>> = e.local.iter().map(|r| r.mr.hold()).collect();
            match held {
                // Deregistered between the check and now.
                None => None,
                Some(_held) => {
                    for r in &e.local {
                        iov.push(r.addr as *const u8, r.len as usize);
                    }
                    let deadline = now + self.cfg.timeout;
                    // SAFETY: the header is on our stack and each payload piece lies inside
                    // a region whose registration `_held` keeps for the whole send.
                    Some(unsafe {
                        io::send_all(fd, &mut iov, deadline, more, || {
                            self.receive(sq, fd);
                            !sq.req.is_broken()
                        })
                    })
                }
            }
        };
        let Some(sent) = sent else {
            return sq.req.finish(e, WcStatus::LocProtErr);
        };
        self.on_the_wire(sq, e, now);
        if let Err(err) = sent {
            tracing::debug!(qpn = self.qpn, "send failed: {err}");
            self.lose_connection(sq, WcStatus::RetryExcErr);
        }
    }

    /// Appends `e`'s payload to `tx`, copied from its regions while they stay registered;
    /// false when one was deregistered (the caller takes back what it appended).
    fn copy_payload(tx: &mut Vec<u8>, e: &Entry) -> bool {
        let held: Option<ArrayVec<_, MAX_SGE>> = e.local.iter().map(|r| r.mr.hold()).collect();
        if held.is_none() {
            return false;
        }
        for r in &e.local {
            let (len, at) = (r.len as usize, tx.len());
            tx.reserve(len);
            // SAFETY: the piece lies inside a region whose registration `held` keeps for the
            // copy; its memory is read through a raw pointer, never a reference, into the
            // spare room `reserve` made, which `set_len` counts.
            unsafe {
                std::ptr::copy_nonoverlapping(r.addr as *const u8, tx.as_mut_ptr().add(at), len);
                tx.set_len(at + len);
            }
        }
        true
    }

    /// Hands an entry whose frame is on its way back to the requester, and has the NIC's
    /// thread watch for its response and its timeout.
    fn on_the_wire(&self, sq: &mut SendSide, e: Entry, now: Instant) {
        if sq.req.sent(e, now) {
            if self.send_cq.is_armed() {
                if let Some(fd) = sq.conn.as_ref().map(|c| c.as_raw_fd()) {
                    // The CQ was armed while nothing awaited a response, so the NIC's thread
                    // does not watch this connection yet: without this, the response would
                    // wake nobody.
                    self.ctx.driver.arm(fd);
                }
            }
            if let Some(d) = sq.req.poll_timeout() {
                self.ctx.driver.deadline(d);
            }
        }
    }

    /// Sends the pending bytes (small requests' frames) in one send. False when the
    /// connection failed (the requester then completes what was on it).
    pub(super) fn send_pending(&self, sq: &mut SendSide, more: bool, now: Instant) -> bool {
        if sq.tx.is_empty() {
            return true;
        }
        let mut tx = std::mem::take(&mut sq.tx);
        let sent = match sq.conn.as_ref().map(|c| c.as_raw_fd()) {
            Some(fd) if !sq.req.is_broken() => {
                let mut iov = IoVecs::new();
                iov.push(tx.as_ptr(), tx.len());
                // SAFETY: the piece is `tx`, owned here and not touched until the send ends.
                unsafe {
                    io::send_all(fd, &mut iov, now + self.cfg.timeout, more, || {
                        self.receive(sq, fd);
                        !sq.req.is_broken()
                    })
                }
            }
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "no connection",
            )),
        };
        tx.clear();
        sq.tx = tx;
        if let Err(err) = sent {
            tracing::debug!(qpn = self.qpn, "send failed: {err}");
            self.lose_connection(sq, WcStatus::RetryExcErr);
            return false;
        }
        true
    }

    /// The connection is dead: the requester completes what was on it, and it is closed.
    pub(super) fn lose_connection(&self, sq: &mut SendSide, status: WcStatus) {
        sq.req.lose_connection(status);
        self.close_if_told(sq);
    }

    /// Closes the connection once the requester says it is dead.
    fn close_if_told(&self, sq: &mut SendSide) {
        if sq.req.take_close() {
            if let Some(c) = &sq.conn {
                // A shut-down socket is readable forever: the NIC's thread stops watching.
                self.ctx.driver.unwatch(c.as_raw_fd());
                // SAFETY: shutdown on a descriptor we own; it stays open (closed on drop) so
                // the number cannot be reused under us.
                unsafe { libc::shutdown(c.as_raw_fd(), libc::SHUT_RDWR) };
            }
        }
    }

    /// Applies every response that has arrived, without waiting: bytes already read first,
    /// READ payloads straight into local memory, then one read of whatever is there.
    fn receive(&self, sq: &mut SendSide, fd: RawFd) {
        let SendSide { req, rx, .. } = sq;
        loop {
            if rx.len() > 0 {
                let n = req.handle_input(rx.data());
                rx.consume(n);
                if n > 0 {
                    continue;
                }
            }
            if req.in_flight() == 0 || req.is_broken() {
                break;
            }
            if rx.len() == 0 {
                // SAFETY: the pieces are the READ's local ranges, writable (checked for
                // LOCAL_WRITE when posted) and kept registered by `receive_payload`.
                match req.receive_payload(|p| unsafe { io::recv_into_nowait(fd, p) }) {
                    Some(Ok(0)) => break,
                    Some(Ok(_)) => continue,
                    Some(Err(_)) => {
                        req.lose_connection(WcStatus::RetryExcErr);
                        break;
                    }
                    None => {}
                }
            }
            match rx.fill_nowait(fd) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => {
                    req.lose_connection(WcStatus::RetryExcErr);
                    break;
                }
            }
        }
    }

    /// Progress without waiting: responses that arrived, timeouts at `now`, completions.
    pub(super) fn progress(&self, sq: &mut SendSide, now: Instant) {
        if let Some(fd) = sq.conn.as_ref().map(|c| c.as_raw_fd()) {
            if self.state() == QpState::Error && sq.req.in_flight() > 0 {
                sq.req.lose_connection(WcStatus::WrFlushErr);
            } else {
                self.receive(sq, fd);
                sq.req.handle_timeout(now);
            }
            self.close_if_told(sq);
        }
        self.drain_done(sq);
    }

    /// Completes finished requests from the head of the queue, in posting order.
    pub(super) fn drain_done(&self, sq: &mut SendSide) {
        drain(sq, self);
    }
}

fn drain(sq: &mut SendSide, qp: &SoftQp) {
    while let Some(f) = sq.req.poll_done() {
        sq.retired += 1;
        sq.unreported += 1;
        let status = if qp.state() == QpState::Error {
            WcStatus::WrFlushErr
        } else {
            f.status
        };
        if status != WcStatus::Success {
            qp.enter_error();
        }
        if status != WcStatus::Success || f.signaled {
            let c = Completion {
                wr_id: f.wr_id,
                status,
                opcode: f.opcode,
                byte_len: if status == WcStatus::Success {
                    f.byte_len
                } else {
                    0
                },
                imm: None,
                qp_num: qp.qpn,
            };
            let release = Release {
                slots: qp.sq_slots.clone(),
                entries: std::mem::take(&mut sq.unreported),
            };
            qp.send_cq.push(c, Some(release));
        }
    }
}
