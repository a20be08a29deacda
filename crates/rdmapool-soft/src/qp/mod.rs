//! Soft RC queue pairs: the QP state machine, receives, and the drivers of its two halves'
//! protocol state machines (`proto::requester` here and in `send`, `proto::responder` in
//! `soft::serve` through [`TargetQp`]).

mod dial;
mod send;
mod wire;

use super::addr::SoftAddress;
use super::context::CtxShared;
use super::cq::{Bound, QueueSlots, Release, SoftCq};
use super::driver::Drive;
use super::io::RxBuf;
use super::keys::{KeyTable, LocalList, MrInner, Resolved};
use super::proto::handshake::TOKEN_LEN;
use super::proto::requester::Requester;
use super::proto::target::{RecvEntry, TargetQp};
use crate::fabric::events::EventQueue;
use crate::fabric::{
    AccessFlags, Completion, Endpoint, ProviderKind, QpConfig, QpEvent, QpState, RecvWr, WcOpcode,
    WcStatus,
};
use crate::os::mapping::Mapping;
use crate::{Error, Result};
use dial::LocalPeer;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The send side: the requester state machine and what its driver owns.
struct SendSide {
    req: Requester,
    conn: Option<OwnedFd>,
    /// Bytes read from the connection that the requester has not used yet.
    rx: RxBuf,
    /// Frames of the list being posted, to go out in one send at its end (`wire.rs`).
    tx: Vec<u8>,
    /// Set when the peer is on this host: the zero-copy path's state.
    local: Option<LocalPeer>,
    /// Entries the requester finished, counted from creation: each holds its slot until the
    /// completion that retires it is polled ([`SoftQp::send_room`]).
    retired: u64,
    /// Finished entries since the last completion pushed (unsignaled successes): the next
    /// completion retires them with its own.
    unreported: u64,
}

/// One soft RC queue pair.
pub(crate) struct SoftQp {
    pub(crate) qpn: u32,
    pub(crate) pd_id: u32,
    pub(crate) ctx: Arc<CtxShared>,
    send_cq: Arc<SoftCq>,
    recv_cq: Arc<SoftCq>,
    pub(crate) cfg: QpConfig,
    /// One shared page whose first word is the state, so that a peer on this host using the
    /// zero-copy path can see it and move it to ERR.
    state_page: Mapping,
    rq_flushed: AtomicBool,
    sq: Mutex<SendSide>,
    /// Whether the send side may have progress to make (requests on the wire, bytes read
    /// and not used): written with `sq` held, after every post (true) and every progress
    /// (exact), so a CQ poll skips the send side's lock, clock read and timeout check when
    /// there is nothing to do (the intra-host path finishes requests as they are posted).
    /// A stale `true` costs one useless progress; `false` is never stale while work waits.
    sq_busy: AtomicBool,
    /// The connection's descriptor once connected (-1 before), readable without `sq`.
    conn_fd: AtomicI32,
    rq: Mutex<VecDeque<RecvEntry>>,
    /// Send-queue entries freed by polled completions.
    sq_slots: Arc<QueueSlots>,
    /// Receive-queue entries freed by polled completions.
    rq_slots: Arc<QueueSlots>,
    /// Receive entries taken off `rq` (by a message or a flush), counted from creation: each
    /// holds its slot until its completion is polled.
    rq_taken: AtomicU64,
    peer: Mutex<Option<(u32, SoftAddress)>>,
    /// The secret an incoming connection must prove it knows (given out in the endpoint).
    token: [u8; TOKEN_LEN],
    /// Set once the peer's connection has been accepted: an RC QP has one peer.
    incoming: AtomicBool,
    /// Asynchronous events for the application (the peer went away).
    events: EventQueue,
}

impl SoftQp {
    pub(crate) fn new(
        ctx: Arc<CtxShared>,
        pd_id: u32,
        send_cq: Arc<SoftCq>,
        recv_cq: Arc<SoftCq>,
        cfg: QpConfig,
    ) -> Result<Arc<Self>> {
        let qpn = ctx.next_qpn();
        let state_page = Mapping::new(1)?;
        let mut token = [0u8; TOKEN_LEN];
        getrandom::fill(&mut token).map_err(|e| Error::Sys {
            call: "getrandom",
            source: std::io::Error::other(e.to_string()),
        })?;
        let qp = Arc::new(Self {
            qpn,
            pd_id,
            ctx: ctx.clone(),
            send_cq: send_cq.clone(),
            recv_cq,
            state_page,
            rq_flushed: AtomicBool::new(false),
            conn_fd: AtomicI32::new(-1),
            sq_busy: AtomicBool::new(false),
            sq: Mutex::new(SendSide {
                req: Requester::new(cfg.max_send_wr, cfg.timeout, ctx.max_msg),
                conn: None,
                rx: RxBuf::new(),
                tx: Vec::new(),
                local: None,
                retired: 0,
                unreported: 0,
            }),
            rq: Mutex::new(VecDeque::with_capacity(cfg.max_recv_wr as usize)),
            sq_slots: Arc::default(),
            rq_slots: Arc::default(),
            rq_taken: AtomicU64::new(0),
            peer: Mutex::new(None),
            token,
            incoming: AtomicBool::new(false),
            events: EventQueue::default(),
            cfg,
        });
        let bound: Weak<dyn Bound> = Arc::downgrade(&qp) as Weak<dyn Bound>;
        send_cq.bind(bound.clone());
        if !Arc::ptr_eq(&send_cq, &qp.recv_cq) {
            qp.recv_cq.bind(bound);
        }
        let target: Weak<dyn TargetQp> = Arc::downgrade(&qp) as Weak<dyn TargetQp>;
        ctx.qps.write().insert(qpn, target);
        Ok(qp)
    }

    fn state_word(&self) -> &std::sync::atomic::AtomicU64 {
        self.state_page.word(0)
    }

    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.state_word().load(Ordering::Acquire) as u8)
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        Endpoint {
            provider: ProviderKind::Soft,
            qpn: self.qpn,
            address: SoftAddress {
                token: self.token,
                ..self.ctx.address.clone()
            }
            .encode(),
        }
    }

    fn bad_state(&self, needed: &'static str) -> Error {
        Error::InvalidQpState {
            qpn: self.qpn,
            state: self.state(),
            needed,
        }
    }

    fn transition(&self, from: QpState, to: QpState, needed: &'static str) -> Result<()> {
        self.state_word()
            .compare_exchange(from as u64, to as u64, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| self.bad_state(needed))
    }

    /// RESET -> INIT.
    pub(crate) fn to_init(&self) -> Result<()> {
        self.transition(QpState::Reset, QpState::Init, "INIT needs RESET")
    }

    /// INIT -> RTR: bind to the peer.
    pub(crate) fn to_rtr(&self, remote: &Endpoint) -> Result<()> {
        if remote.provider != ProviderKind::Soft {
            return Err(Error::Mismatch(format!(
                "soft QP {} cannot connect to a {} endpoint",
                self.qpn, remote.provider
            )));
        }
        let addr = SoftAddress::decode(&remote.address)?;
        if self.state() != QpState::Init {
            return Err(self.bad_state("RTR needs INIT"));
        }
        *self.peer.lock() = Some((remote.qpn, addr));
        self.transition(QpState::Init, QpState::Rtr, "RTR needs INIT")
    }

    /// RTR -> RTS: open the connection that carries this QP's requests.
    pub(crate) fn to_rts(self: &Arc<Self>) -> Result<()> {
        if self.state() != QpState::Rtr {
            return Err(self.bad_state("RTS needs RTR"));
        }
        let (peer_qpn, addr) = self.peer.lock().clone().expect("RTR has a peer");
        let psk = self.ctx.admission.psk.as_ref().map(|k| k.bytes());
        let (fd, local) = dial::dial(
            &self.cfg,
            self.ctx.transport,
            psk,
            self.qpn,
            peer_qpn,
            &addr,
        )?;
        let mut sq = self.sq.lock();
        let drive: Weak<dyn Drive> = Arc::downgrade(self) as Weak<dyn Drive>;
        self.ctx.driver.watch(fd.as_raw_fd(), drive);
        self.conn_fd.store(fd.as_raw_fd(), Ordering::Release);
        sq.conn = Some(fd);
        sq.local = local;
        drop(sq);
        self.transition(QpState::Rtr, QpState::Rts, "RTS needs RTR")
    }

    /// Records whether the send side has progress to make (see `sq_busy`); `sq` is held.
    #[inline]
    fn publish_busy(&self, sq: &SendSide) {
        let busy = !sq.req.is_idle() || sq.rx.len() > 0;
        self.sq_busy.store(busy, Ordering::Release);
    }

    /// Moves the QP to ERR: posted receives are flushed, sends flush as they are reached.
    pub(crate) fn enter_error(&self) {
        self.state_word()
            .store(QpState::Error as u64, Ordering::Release);
        self.flush_receives_once();
    }

    /// The next asynchronous event, waiting up to `timeout`.
    pub(crate) fn wait_event(&self, timeout: Duration) -> Option<QpEvent> {
        self.events.wait(timeout)
    }

    /// Destruction: ERR for everyone who looks, and, as with verbs, no completions for the
    /// receives that were still posted.
    pub(crate) fn mark_destroyed(&self) {
        self.rq_flushed.store(true, Ordering::Release);
        self.state_word()
            .store(QpState::Error as u64, Ordering::Release);
    }

    /// Once the QP is in ERR (set here or by a local peer through the state page), posted
    /// receives complete with flush errors, exactly once.
    fn flush_receives_once(&self) {
        if self.state() == QpState::Error && !self.rq_flushed.swap(true, Ordering::AcqRel) {
            let mut rq = self.rq.lock();
            while let Some(e) = rq.pop_front() {
                self.rq_taken.fetch_add(1, Ordering::AcqRel);
                self.complete_recv_entry(flushed_recv(e.wr_id, self.qpn));
            }
        }
    }

    /// Checks local SGEs the way an HCA does when it processes the work request, into
    /// `list` (filled in place: a list is a few hundred bytes); returns their total length.
    fn resolve(
        &self,
        sges: &[crate::fabric::Sge],
        need: AccessFlags,
        list: &mut LocalList,
    ) -> std::result::Result<u64, WcStatus> {
        self.resolve_with(sges, need, list, None)
    }

    /// [`Self::resolve`], remembering in `memo` the region found last: the requests of one
    /// list mostly name the same one, which is then not looked up again (the key table's
    /// lock and hash per SGE). Its validity is still checked when its memory is touched.
    pub(super) fn resolve_with(
        &self,
        sges: &[crate::fabric::Sge],
        need: AccessFlags,
        list: &mut LocalList,
        mut memo: Option<&mut Option<Arc<MrInner>>>,
    ) -> std::result::Result<u64, WcStatus> {
        list.clear();
        let mut total = 0u64;
        for s in sges {
            if s.length == 0 {
                continue; // contributes nothing; rxe does not even look at its key
            }
            // rxe reports a key it cannot use (unknown, or another PD's) as a local QP
            // operation error where it gathers data (SEND, WRITE) and as a protection error
            // where data lands (READ, the old value of an atomic); a range or right the key
            // does not cover is a protection error.
            let bad_key = if need.contains(AccessFlags::LOCAL_WRITE) {
                WcStatus::LocProtErr
            } else {
                WcStatus::LocQpOpErr
            };
            let mr = match memo.as_deref_mut() {
                Some(Some(last)) if last.lkey == s.lkey => last.clone(),
                Some(slot) => {
                    let mr = self.ctx.keys.by_lkey(s.lkey).ok_or(bad_key)?;
                    *slot = Some(mr.clone());
                    mr
                }
                None => self.ctx.keys.by_lkey(s.lkey).ok_or(bad_key)?,
            };
            if mr.pd_id != self.pd_id {
                return Err(bad_key);
            }
            if !mr.allows(self.pd_id, need, s.addr, s.length as u64) {
                return Err(WcStatus::LocProtErr);
            }
            total += s.length as u64;
            list.push(Resolved {
                mr,
                addr: s.addr,
                len: s.length,
            });
        }
        if total > self.ctx.max_msg as u64 {
            return Err(WcStatus::LocLenErr);
        }
        Ok(total)
    }

    /// Receive entries free now: the queue's depth less those posted and those whose
    /// completion has not been polled yet (as on mlx5, an entry frees when its completion is
    /// polled). The caller holds `rq`'s lock.
    fn recv_room(&self, posted: usize) -> usize {
        let taken = self.rq_taken.load(Ordering::Acquire);
        let unpolled = taken.saturating_sub(self.rq_slots.polled());
        (self.cfg.max_recv_wr as usize).saturating_sub(posted + unpolled as usize)
    }

    /// Pushes a receive completion that frees its entry once polled.
    fn complete_recv_entry(&self, c: Completion) {
        let release = Release {
            slots: self.rq_slots.clone(),
            entries: 1,
        };
        self.recv_cq.push(c, Some(release));
    }

    /// Posts receives. Buffers are checked now; a bad one completes with a local error when
    /// a message arrives for it.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.flush_receives_once();
        for wr in wrs {
            let state = self.state();
            if state == QpState::Reset {
                return Err(self.bad_state("posting receives needs INIT, RTR or RTS"));
            }
            let mut rq = self.rq.lock();
            if self.recv_room(rq.len()) == 0 {
                return Err(Error::QueueFull {
                    queue: "receive",
                    depth: self.cfg.max_recv_wr,
                });
            }
            if state == QpState::Error {
                self.rq_taken.fetch_add(1, Ordering::AcqRel);
                drop(rq);
                self.complete_recv_entry(flushed_recv(wr.wr_id, self.qpn));
                continue;
            }
            let mut list = LocalList::new();
            let (local, capacity) =
                match self.resolve(wr.sg_list, AccessFlags::LOCAL_WRITE, &mut list) {
                    Ok(c) => (Ok(list), c),
                    Err(s) => (Err(s), 0),
                };
            rq.push_back(RecvEntry {
                wr_id: wr.wr_id,
                local,
                capacity,
            });
        }
        Ok(())
    }
}

/// The flush-error completion of the receive `wr_id`.
fn flushed_recv(wr_id: u64, qpn: u32) -> Completion {
    Completion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
        qp_num: qpn,
    }
}

impl TargetQp for SoftQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn pd(&self) -> u32 {
        self.pd_id
    }
    fn state(&self) -> QpState {
        SoftQp::state(self)
    }
    fn timeout(&self) -> Duration {
        self.cfg.timeout
    }
    fn rnr_timeout(&self) -> Duration {
        self.cfg.rnr_timeout
    }
    fn keys(&self) -> &KeyTable {
        &self.ctx.keys
    }
    fn take_recv(&self) -> Option<RecvEntry> {
        let mut rq = self.rq.lock();
        let e = rq.pop_front()?;
        // Under the lock, so a post never sees the entry neither queued nor taken.
        self.rq_taken.fetch_add(1, Ordering::AcqRel);
        Some(e)
    }
    fn complete_recv(&self, c: Completion) {
        self.complete_recv_entry(c);
    }
    fn enter_error(&self) {
        SoftQp::enter_error(self);
    }
    fn state_fd(&self) -> RawFd {
        self.state_page.fd().as_raw_fd()
    }
    fn token(&self) -> [u8; TOKEN_LEN] {
        self.token
    }
    fn peer_qpn(&self) -> Option<u32> {
        self.peer.lock().as_ref().map(|(qpn, _)| *qpn)
    }
    fn claim_incoming(&self) -> bool {
        !self.incoming.swap(true, Ordering::AcqRel)
    }
    fn peer_lost(&self) {
        // Once per QP: an RC QP has one peer, and one incoming connection from it. The QP
        // moves to ERR when the application takes the event (`Qp::wait_event`).
        self.events.push(QpEvent::PeerDisconnected);
    }
}

impl Bound for SoftQp {
    fn progress_nowait(&self) {
        self.flush_receives_once();
        if !self.sq_busy.load(Ordering::Acquire) {
            return;
        }
        if let Some(mut sq) = self.sq.try_lock() {
            self.progress(&mut sq, Instant::now());
            self.publish_busy(&sq);
        }
    }

    fn armed(&self) {
        match self.sq.try_lock() {
            Some(sq) => {
                if let (Some(c), true) = (&sq.conn, sq.req.in_flight() > 0) {
                    self.ctx.driver.arm(c.as_raw_fd());
                }
            }
            // Someone is posting or progressing; waking once too many is harmless.
            None => {
                let fd = self.conn_fd.load(Ordering::Acquire);
                if fd >= 0 {
                    self.ctx.driver.arm(fd);
                }
            }
        }
    }
}

impl Drive for SoftQp {
    fn drive(&self, now: Instant) -> std::result::Result<Option<Instant>, ()> {
        self.flush_receives_once();
        let mut sq = self.sq.try_lock().ok_or(())?;
        self.progress(&mut sq, now);
        self.publish_busy(&sq);
        if sq.req.in_flight() > 0 && self.send_cq.is_armed() {
            if let Some(c) = &sq.conn {
                self.ctx.driver.arm(c.as_raw_fd()); // the one-shot was used up
            }
        }
        Ok(sq.req.poll_timeout())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        // Local peers see this page: a destroyed QP answers nothing, like one in ERR.
        self.state_word()
            .store(QpState::Error as u64, Ordering::Release);
        self.ctx.qps.write().remove(&self.qpn);
        // Its incoming connection closes now, and its peer learns so.
        self.ctx.serving.qp_gone(self.qpn);
        if let Some(c) = &self.sq.get_mut().conn {
            self.ctx.driver.unwatch(c.as_raw_fd());
        }
    }
}
