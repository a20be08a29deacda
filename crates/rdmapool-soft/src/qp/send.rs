//! The requester half's posting: local checks, the intra-host path, memory-window binds, and
//! handing the rest to the wire (`wire.rs`: frames out, responses in, completions in order).

use super::{SendSide, SoftQp};
use crate::fabric::provider::BindSpec;
use crate::fabric::{AccessFlags, QpState, SendWr, WcOpcode, WcStatus, WindowError, WrOp};
use crate::io;
use crate::keys::{LocalList, MrInner, Window};
use crate::proto::local::{LocalPath, Route};
use crate::proto::wire::{ReqOp, Request, Response, RESP_LEN};
use crate::shm::{self, FastOp, RemoteMr};
use crate::{Error, Result};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// What the requests of one post share: the local region found last (not looked up again
/// for the next request), and the peer's region entered for the intra-host path.
#[derive(Default)]
struct ListMemo {
    region: Option<Arc<MrInner>>,
    entered: Option<shm::Entered>,
}

/// The clocks one post reads, each at most once and only when a request needs it: the
/// precise one when a request goes on the wire (its deadline), the coarse one when the
/// intra-host path may probe the peer.
#[derive(Default)]
struct PostClock {
    precise: Option<Instant>,
    coarse: Option<std::time::Duration>,
}

impl PostClock {
    fn precise(&mut self) -> Instant {
        *self.precise.get_or_insert_with(Instant::now)
    }

    fn coarse(&mut self) -> std::time::Duration {
        *self.coarse.get_or_insert_with(crate::clock::coarse_now)
    }
}

impl SoftQp {
    fn queue_full(&self) -> Error {
        Error::QueueFull {
            queue: "send",
            depth: self.cfg.max_send_wr,
        }
    }

    /// Send-queue entries free now: as on mlx5 and rxe, an entry frees when the completion
    /// that retires it is polled (its own, or for an unsignaled request a later signaled
    /// one's), not when the request finishes. So a list longer than the free entries fails
    /// at the first one that does not fit, and unsignaled requests with no signaled one
    /// after them hold their entries for good.
    fn send_room(&self, sq: &SendSide) -> usize {
        let unpolled = sq.retired.saturating_sub(self.sq_slots.polled()) as usize;
        sq.req.room().saturating_sub(unpolled)
    }

    /// Posts send work requests in order. Errors in the request itself (wrong state, too
    /// many SGEs, full queue) are returned; everything the HCA would detect while executing
    /// it becomes an error completion.
    pub(crate) fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let mut sq = self.sq.lock();
        let mut clock = PostClock::default();
        let mut result = Ok(());
        let mut memo = ListMemo::default();
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.post_one(&mut sq, wr, i + 1 < wrs.len(), &mut clock, &mut memo) {
                result = Err(e);
                break;
            }
        }
        // A list refused part way: what it put on the wire goes.
        if !sq.tx.is_empty() {
            self.send_pending(&mut sq, false, clock.precise());
        }
        self.drain_done(&mut sq);
        self.publish_busy(&sq);
        result
    }

    /// Posts a bind of `mw` (see `Qp::post_bind_mw`): checked and done here, completed in
    /// order with the requests before it. Returns the window's key once bound.
    pub(crate) fn post_bind(&self, mw: &crate::SoftMw, b: &BindSpec) -> Result<u32> {
        let mut sq = self.sq.lock();
        // Whatever this post leaves behind is progressed (a stale `true` costs one look).
        self.sq_busy.store(true, Ordering::Release);
        let state = self.state();
        if !matches!(state, QpState::Rts | QpState::Error) {
            return Err(self.bad_state("posting sends needs RTS"));
        }
        // What the library knows before posting, refused on every provider: a region that
        // is gone or of another PD, a window of another PD or already bound (a window is
        // also checked at the fabric layer; this keeps the provider exact on its own).
        let keys = &self.ctx.keys;
        let mr = keys
            .by_lkey(b.lkey)
            .ok_or(WindowError::RegionGone { lkey: b.lkey })?;
        if mr.pd_id != self.pd_id {
            return Err(WindowError::RegionOfAnotherPd { lkey: b.lkey }.into());
        }
        if mw.pd_id != self.pd_id {
            return Err(WindowError::WindowOfAnotherPd.into());
        }
        if keys.is_window(mw.rkey()) {
            return Err(WindowError::AlreadyBound { rkey: mw.rkey() }.into());
        }
        if self.send_room(&sq) == 0 {
            return Err(self.queue_full());
        }
        let e = sq
            .req
            .entry(b.wr_id, WcOpcode::BindMw, b.signaled)
            .ok_or_else(|| self.queue_full())?;
        let mut rkey = mw.rkey();
        if state == QpState::Error || !sq.req.accepts_work() {
            sq.req.flush(e);
        } else {
            // What rxe checks as it executes the bind: the region allows binding, the range
            // is inside it, write/atomic rights need a locally writable region.
            let writes = b
                .access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
            let allowed = mr.access.contains(AccessFlags::MW_BIND)
                && (!writes || mr.access.contains(AccessFlags::LOCAL_WRITE))
                && mr.contains(b.addr, b.len);
            let status = if allowed {
                rkey = keys.bind_window(Window {
                    mr,
                    addr: b.addr,
                    len: b.len,
                    access: b.access,
                    qpn: self.qpn,
                })?;
                mw.set_rkey(rkey);
                WcStatus::Success
            } else {
                WcStatus::MwBindErr
            };
            sq.req.finish(e, status);
        }
        self.drain_done(&mut sq);
        Ok(rkey)
    }

    fn post_one(
        &self,
        sq: &mut SendSide,
        wr: &SendWr<'_>,
        more: bool,
        clock: &mut PostClock,
        memo: &mut ListMemo,
    ) -> Result<()> {
        let state = self.state();
        if !matches!(state, QpState::Rts | QpState::Error) {
            return Err(self.bad_state("posting sends needs RTS"));
        }
        let opcode = wr.op.completion_opcode();
        if self.send_room(sq) == 0 {
            return Err(self.queue_full());
        }
        if state == QpState::Error || !sq.req.accepts_work() {
            let e = sq
                .req
                .entry(wr.wr_id, opcode, wr.signaled)
                .ok_or_else(|| self.queue_full())?;
            sq.req.flush(e);
            return Ok(());
        }
        if let WrOp::LocalInvalidate { rkey } = wr.op {
            // A local operation: done here, completed in order with the rest.
            // The fabric layer lets through only keys of windows bound through this QP (and
            // refuses the rest before posting, on every provider). One that names no window
            // any more was revoked with its region: invalidating it changes nothing.
            self.ctx.keys.invalidate_window(rkey, self.pd_id);
            sq.req
                .finish_now(wr.wr_id, opcode, wr.signaled, 0, WcStatus::Success);
            return Ok(());
        }
        let (need, atomic) = match wr.op {
            WrOp::Send { .. } | WrOp::Write { .. } | WrOp::LocalInvalidate { .. } => {
                (AccessFlags::empty(), false)
            }
            WrOp::Read { .. } => (AccessFlags::LOCAL_WRITE, false),
            WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => (AccessFlags::LOCAL_WRITE, true),
        };
        // Checked into a list on this frame: a request that finishes here (a local error,
        // the intra-host path) never becomes an entry, whose move costs more than the
        // operation itself.
        let mut local = LocalList::new();
        // A single request remembers nothing (the memo would cost it a reference count).
        let region = (more || memo.region.is_some()).then_some(&mut memo.region);
        let byte_len = match self.resolve_with(wr.sg_list, need, &mut local, region) {
            // Atomic shapes are validated before posting (SendWr::validate); a zero-length
            // SGE could still leave the list empty here.
            Ok(total) if atomic && total != 8 => {
                sq.req
                    .finish_now(wr.wr_id, opcode, wr.signaled, 0, WcStatus::LocLenErr);
                return Ok(());
            }
            Ok(total) => total as u32,
            Err(status) => {
                sq.req.finish_now(wr.wr_id, opcode, wr.signaled, 0, status);
                return Ok(());
            }
        };
        let entered = (more || memo.entered.is_some()).then_some(&mut memo.entered);
        if let Some(status) = self.try_zero_copy(sq, &wr.op, byte_len, &local, clock, entered) {
            sq.req
                .finish_now(wr.wr_id, opcode, wr.signaled, byte_len, status);
            return Ok(());
        }
        let mut e = sq
            .req
            .entry(wr.wr_id, opcode, wr.signaled)
            .ok_or_else(|| self.queue_full())?;
        e.byte_len = byte_len;
        e.local = local;
        let frame = sq.req.frame(&e, &wr.op);
        self.transmit(sq, &frame, e, more, clock.precise());
        Ok(())
    }

    /// The intra-host zero-copy path: executes a one-sided operation directly on the peer's
    /// mapped region. Returns None when the operation must go through the socket instead
    /// (not a local peer, socket requests still in flight — RC order —, a target QP not
    /// ready yet, a region the peer cannot share, or an operation that needs the peer's
    /// receive queue). What to do is decided by `proto::local` ([`LocalPath`]); this does the
    /// I/O it asks for, and never waits for the target.
    fn try_zero_copy(
        &self,
        sq: &mut SendSide,
        op: &WrOp,
        byte_len: u32,
        local: &LocalList,
        clock: &mut PostClock,
        entered: Option<&mut Option<shm::Entered>>,
    ) -> Option<WcStatus> {
        let direct = match *op {
            WrOp::Write { remote, imm: None } => Some((remote, FastOp::Write)),
            WrOp::Read { remote } => Some((remote, FastOp::Read)),
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            } => Some((remote, FastOp::CompareSwap { compare, swap })),
            WrOp::FetchAdd { remote, add } => Some((remote, FastOp::FetchAdd { add })),
            _ => None,
        };
        let quiet = sq.req.is_quiet() && sq.rx.len() == 0;
        if !LocalPath::may_go_direct(quiet, direct.is_some() && byte_len != 0) {
            return None;
        }
        let (remote, fop) = direct?;
        let fd = sq.conn.as_ref()?.as_raw_fd();
        let lp = sq.local.as_mut()?;
        // The peer died: its memory is still mapped here, but nothing may land in it or be
        // read from it as if it served (a NIC's WRITE to a dead target never completes).
        if lp.life.as_ref().is_some_and(|l| l.is_dead()) {
            self.lose_connection(sq, WcStatus::RetryExcErr);
            return Some(WcStatus::RetryExcErr);
        }
        if lp.path.probe_due(clock.coarse()) {
            let mut probe = [0u8; 1];
            // SAFETY: a one-byte local buffer; MSG_PEEK leaves any data queued.
            let n = unsafe {
                libc::recv(
                    fd,
                    probe.as_mut_ptr().cast(),
                    1,
                    libc::MSG_DONTWAIT | libc::MSG_PEEK,
                )
            };
            let gone = n == 0
                || (n < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock);
            if gone {
                self.lose_connection(sq, WcStatus::RetryExcErr);
                return Some(WcStatus::RetryExcErr);
            }
        }
        // The target's state before mapping: a target not ready yet would stall the MAP too.
        match LocalPath::route(lp.target_state.get()) {
            Route::Direct => {}
            Route::Socket => return None,
            Route::Fail(status) => return Some(status),
        }
        if let Some(Some(rm)) = lp.maps.get(&remote.rkey) {
            if rm.is_valid() {
                // Borrowed, not cloned: the map keeps it while the send lock is held. In a
                // list, the region is entered once for all its requests.
                let via = entered.map(|e| {
                    if !e.as_ref().is_some_and(|e| e.is(rm)) {
                        *e = Some(shm::Entered::new(rm.clone()));
                    }
                    &*e
                });
                let via = via.and_then(Option::as_ref);
                return Some(Self::execute_direct(
                    lp, rm, via, remote, byte_len, &fop, local,
                ));
            }
        } else if lp.maps.contains_key(&remote.rkey) {
            return None; // known to go through the socket
        }
        match self.map_remote(fd, remote.rkey) {
            Ok(m) => {
                lp.maps
                    .retain(|_, v| v.as_ref().is_none_or(|r| r.is_valid()));
                lp.maps.insert(remote.rkey, m.clone());
                let rm = m?;
                Some(Self::execute_direct(
                    lp, &rm, None, remote, byte_len, &fop, local,
                ))
            }
            Err(status) => {
                self.lose_connection(sq, status);
                Some(status)
            }
        }
    }

    /// Executes one operation on the peer's mapped region `rm` (through `via` when the
    /// post entered it); a remote error moves the peer's QP to ERR, as on the wire.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn execute_direct(
        lp: &crate::qp::dial::LocalPeer,
        rm: &RemoteMr,
        via: Option<&shm::Entered>,
        remote: crate::fabric::RemoteAddr,
        byte_len: u32,
        fop: &FastOp,
        local: &LocalList,
    ) -> WcStatus {
        let (pd, len) = (lp.target_pd, byte_len as u64);
        let status = match via {
            Some(e) => e.execute(pd, remote.rkey, remote.addr, len, fop, local),
            None => shm::execute(rm, pd, remote.rkey, remote.addr, len, fop, local),
        };
        if matches!(status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr) {
            lp.target_state.set_error(); // the responder's QP goes to ERR, as on the wire
        }
        status
    }

    /// Asks the local peer for the region behind `rkey` (only with nothing else in flight).
    fn map_remote(
        &self,
        fd: RawFd,
        rkey: u32,
    ) -> std::result::Result<Option<Arc<RemoteMr>>, WcStatus> {
        let req = Request {
            op: ReqOp::Map,
            seq: u64::MAX,
            remote_addr: 0,
            rkey,
            len: 0,
            compare_add: 0,
            swap: 0,
            imm: None,
        };
        let deadline = Instant::now() + self.cfg.timeout;
        io::send_buf(fd, &req.encode(), deadline).map_err(|_| WcStatus::RetryExcErr)?;
        let mut hdr = [0u8; RESP_LEN];
        let fds = shm::recv_with_fds(fd, &mut hdr, deadline).map_err(|_| WcStatus::RetryExcErr)?;
        match Response::decode(&hdr, self.ctx.max_msg).map_err(|_| WcStatus::BadRespErr)? {
            Response::Map { mappable: true, .. } => {
                let memfd = fds.into_iter().next().ok_or(WcStatus::BadRespErr)?;
                Ok(Some(Arc::new(
                    RemoteMr::new(memfd).map_err(|_| WcStatus::BadRespErr)?,
                )))
            }
            Response::Map {
                mappable: false, ..
            } => Ok(None),
            Response::Nak { status, .. } => Err(status),
            _ => Err(WcStatus::BadRespErr),
        }
    }
}
