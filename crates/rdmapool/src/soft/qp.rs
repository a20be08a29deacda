//! Soft RC queue pairs: state machine, posting, and the requester half of the emulated NIC.

use super::addr::{host_id, SoftAddress};
use super::cq::SoftCq;
use super::io::{self, IoVecs, RxBuf};
use super::keys::{MrInner, Window};
use super::memory::Mapping;
use super::shm::{self, FastOp, RemoteMr, RemoteQpState};
use super::wire::{self, HelloStatus, ReqOp, Request, Response, RESP_LEN};
use super::{CtxShared, MAX_SGE};
use crate::fabric::provider::BindSpec;
use crate::fabric::{
    AccessFlags, Completion, Endpoint, ProviderKind, QpConfig, QpState, RecvWr, SendWr, Transport,
    WcOpcode, WcStatus, WrOp,
};
use crate::{Error, Result};
use arrayvec::ArrayVec;
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A checked local SGE: the region it lies in, and the range.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) mr: Arc<MrInner>,
    pub(crate) addr: u64,
    pub(crate) len: u32,
}

pub(crate) type LocalList = ArrayVec<Resolved, MAX_SGE>;

/// A posted receive, waiting for an incoming SEND or WRITE with immediate.
pub(crate) struct RecvEntry {
    pub(crate) wr_id: u64,
    /// The checked buffers, or the local error the receive completes with when consumed.
    pub(crate) local: std::result::Result<LocalList, WcStatus>,
    pub(crate) capacity: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// On the wire; its response has not arrived.
    Sent,
    /// Finished with this status; completes in order.
    Done(WcStatus),
}

struct Pending {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    seq: u64,
    byte_len: u32,
    posted: Instant,
    outcome: Outcome,
    local: LocalList,
}

/// The send side. Invariant: `pending` is some `Sent` entries followed by `Done` ones.
struct SendQueue {
    conn: Option<OwnedFd>,
    /// Responses read ahead of the one being applied.
    rx: RxBuf,
    broken: Option<WcStatus>,
    pending: VecDeque<Pending>,
    in_flight: usize,
    next_seq: u64,
    /// A work request failed locally; later ones are flushed, never sent.
    failed: bool,
    /// Set when the peer is on this host: the zero-copy path's state.
    local: Option<LocalPeer>,
}

/// What the zero-copy path knows about a peer on this host.
struct LocalPeer {
    target_state: RemoteQpState,
    target_pd: u32,
    /// rkey -> the peer's mapped region, or None when it must go through the socket.
    maps: HashMap<u32, Option<Arc<RemoteMr>>>,
    last_liveness_check: Instant,
}

/// How often the zero-copy path checks that the peer process is still there.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(1);

/// One soft RC queue pair.
pub(crate) struct SoftQp {
    pub(crate) qpn: u32,
    pub(crate) pd_id: u32,
    pub(crate) ctx: Arc<CtxShared>,
    send_cq: Arc<SoftCq>,
    pub(crate) recv_cq: Arc<SoftCq>,
    pub(crate) cfg: QpConfig,
    /// One shared page whose first word is the state, so that a peer on this host using the
    /// zero-copy path can see it and move it to ERR.
    state_page: Mapping,
    rq_flushed: AtomicBool,
    sq: Mutex<SendQueue>,
    /// The connection's descriptor once connected (-1 before), readable without `sq`.
    conn_fd: AtomicI32,
    pub(crate) rq: Mutex<VecDeque<RecvEntry>>,
    peer: Mutex<Option<(u32, SoftAddress)>>,
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
        let qp = Arc::new(Self {
            qpn,
            pd_id,
            ctx: ctx.clone(),
            send_cq: send_cq.clone(),
            recv_cq,
            state_page,
            rq_flushed: AtomicBool::new(false),
            conn_fd: AtomicI32::new(-1),
            sq: Mutex::new(SendQueue {
                conn: None,
                rx: RxBuf::new(),
                broken: None,
                pending: VecDeque::with_capacity(cfg.max_send_wr as usize),
                in_flight: 0,
                next_seq: 0,
                failed: false,
                local: None,
            }),
            rq: Mutex::new(VecDeque::with_capacity(cfg.max_recv_wr as usize)),
            peer: Mutex::new(None),
            cfg,
        });
        send_cq.attach_sender(Arc::downgrade(&qp));
        if !Arc::ptr_eq(&send_cq, &qp.recv_cq) {
            qp.recv_cq.attach_sender(Arc::downgrade(&qp));
        }
        ctx.qps.write().insert(qpn, Arc::downgrade(&qp));
        Ok(qp)
    }

    fn state_word(&self) -> &std::sync::atomic::AtomicU64 {
        self.state_page.word(0)
    }

    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.state_word().load(Ordering::Acquire) as u8)
    }

    /// The state page's descriptor, shared with local peers.
    pub(crate) fn state_fd(&self) -> RawFd {
        self.state_page.fd().as_raw_fd()
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        Endpoint {
            provider: ProviderKind::Soft,
            qpn: self.qpn,
            address: self.ctx.address.encode(),
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
    pub(crate) fn to_rts(&self) -> Result<()> {
        if self.state() != QpState::Rtr {
            return Err(self.bad_state("RTS needs RTR"));
        }
        let (peer_qpn, addr) = self.peer.lock().clone().expect("RTR has a peer");
        let (fd, local) = self.dial(peer_qpn, &addr)?;
        let mut sq = self.sq.lock();
        self.send_cq.watch_socket(fd.as_raw_fd());
        self.conn_fd.store(fd.as_raw_fd(), Ordering::Release);
        sq.conn = Some(fd);
        sq.local = local;
        drop(sq);
        self.transition(QpState::Rtr, QpState::Rts, "RTS needs RTR")
    }

    fn dial(&self, peer_qpn: u32, addr: &SoftAddress) -> Result<(OwnedFd, Option<LocalPeer>)> {
        let same_host = addr.host_id == host_id() && !addr.local.is_empty();
        let conn_err = |peer: String, reason: String| Error::Connection { peer, reason };
        let local = match self.cfg.transport {
            Transport::Tcp => false,
            Transport::Local if !same_host => {
                return Err(conn_err(
                    addr.tcp.to_string(),
                    "transport local was asked for but the peer is on another host".into(),
                ))
            }
            Transport::Local => true,
            Transport::Auto => same_host,
        };
        let mut on_local_socket = false;
        let fd: OwnedFd = match local.then(|| UnixStream::connect(&addr.local)) {
            Some(Ok(s)) => {
                on_local_socket = true;
                s.into()
            }
            Some(Err(e)) if self.cfg.transport == Transport::Local => {
                return Err(conn_err(addr.local.clone(), e.to_string()))
            }
            _ => {
                let s = TcpStream::connect_timeout(&addr.tcp, self.cfg.timeout)
                    .map_err(|e| conn_err(addr.tcp.to_string(), e.to_string()))?;
                s.set_nodelay(true)
                    .map_err(|e| conn_err(addr.tcp.to_string(), e.to_string()))?;
                s.into()
            }
        };
        let deadline = Instant::now() + self.cfg.timeout;
        let hello = wire::Hello {
            src_qpn: self.qpn,
            dst_qpn: peer_qpn,
        };
        let peer = || addr.tcp.to_string();
        io::send_buf(fd.as_raw_fd(), &hello.encode(), deadline)
            .map_err(|e| conn_err(peer(), format!("sending hello: {e}")))?;
        let mut ack = [0u8; wire::HELLO_ACK_LEN];
        io::recv_exact(fd.as_raw_fd(), &mut ack, deadline)
            .map_err(|e| conn_err(peer(), format!("waiting for hello acknowledgement: {e}")))?;
        match wire::decode_hello_ack(&ack)? {
            HelloStatus::Ok if on_local_socket => {
                let mut info = [0u8; 8];
                let fds = shm::recv_with_fds(fd.as_raw_fd(), &mut info, deadline).map_err(|e| {
                    conn_err(peer(), format!("waiting for the local handshake: {e}"))
                })?;
                let state_fd = fds.into_iter().next().ok_or_else(|| {
                    conn_err(peer(), "local handshake carried no state page".into())
                })?;
                let local = LocalPeer {
                    target_state: RemoteQpState::new(state_fd)?,
                    target_pd: u32::from_le_bytes(info[..4].try_into().unwrap()),
                    maps: HashMap::default(),
                    last_liveness_check: Instant::now(),
                };
                Ok((fd, Some(local)))
            }
            HelloStatus::Ok => Ok((fd, None)),
            HelloStatus::NoSuchQp => Err(conn_err(peer(), format!("peer has no QP {peer_qpn}"))),
            HelloStatus::QpInError => Err(conn_err(
                peer(),
                format!("peer QP {peer_qpn} is in the error state"),
            )),
        }
    }

    /// Moves the QP to ERR: posted receives are flushed, sends flush as they are reached.
    pub(crate) fn enter_error(&self) {
        self.state_word()
            .store(QpState::Error as u64, Ordering::Release);
        self.flush_receives_once();
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
                self.recv_cq.push(Completion {
                    wr_id: e.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    qp_num: self.qpn,
                });
            }
        }
    }

    /// Checks local SGEs the way an HCA does when it processes the work request.
    fn resolve(
        &self,
        sges: &[crate::fabric::Sge],
        need: AccessFlags,
    ) -> std::result::Result<(LocalList, u64), WcStatus> {
        let mut list = LocalList::new();
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
            let mr = self.ctx.keys.by_lkey(s.lkey).ok_or(bad_key)?;
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
        Ok((list, total))
    }

    /// Posts send work requests in order. Errors in the request itself (wrong state, too
    /// many SGEs, full queue) are returned; everything the HCA would detect while executing
    /// it becomes an error completion.
    pub(crate) fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let mut sq = self.sq.lock();
        // Finished requests leave the queue here, before the list, never in the middle of
        // it: a list longer than the free entries fails at the first one that does not fit,
        // on every transport, as on a NIC whose queue cannot drain during one post.
        if sq.pending.len() + wrs.len() > self.cfg.max_send_wr as usize {
            self.progress_rx(&mut sq);
            self.drain_done(&mut sq);
        }
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.post_one(&mut sq, wr, i + 1 < wrs.len()) {
                result = Err(e);
                break;
            }
        }
        self.drain_done(&mut sq);
        result
    }

    /// Takes a send-queue entry (or `QueueFull`): its sequence number and its pending record,
    /// flushed until the caller decides its outcome.
    fn take_entry(
        &self,
        sq: &mut SendQueue,
        wr_id: u64,
        opcode: WcOpcode,
        signaled: bool,
    ) -> Result<Pending> {
        if sq.pending.len() >= self.cfg.max_send_wr as usize {
            return Err(Error::QueueFull {
                queue: "send",
                depth: self.cfg.max_send_wr,
            });
        }
        let seq = sq.next_seq;
        sq.next_seq += 1;
        Ok(Pending {
            wr_id,
            opcode,
            signaled,
            seq,
            byte_len: 0,
            posted: Instant::now(),
            outcome: Outcome::Done(WcStatus::WrFlushErr),
            local: LocalList::new(),
        })
    }

    /// Posts a bind of `mw` (see `Qp::post_bind_mw`): checked and done here, completed in
    /// order with the requests before it. Returns the window's key once bound.
    pub(crate) fn post_bind(&self, mw: &super::SoftMw, b: &BindSpec) -> Result<u32> {
        let mut sq = self.sq.lock();
        let state = self.state();
        if !matches!(state, QpState::Rts | QpState::Error) {
            return Err(self.bad_state("posting sends needs RTS"));
        }
        if sq.pending.len() >= self.cfg.max_send_wr as usize {
            self.progress_rx(&mut sq);
            self.drain_done(&mut sq);
        }
        let mut p = self.take_entry(&mut sq, b.wr_id, WcOpcode::BindMw, b.signaled)?;
        let mut rkey = mw.rkey();
        if !(state == QpState::Error || sq.failed || sq.broken.is_some()) {
            // What rxe checks: the region is ours and allows binding, the range is inside it,
            // write/atomic rights need a locally writable region, the window is ours and free.
            let keys = &self.ctx.keys;
            let bound = keys.by_lkey(b.lkey).filter(|mr| {
                let writes = b
                    .access
                    .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
                mr.pd_id == self.pd_id
                    && mw.pd_id == self.pd_id
                    && mr.access.contains(AccessFlags::MW_BIND)
                    && (!writes || mr.access.contains(AccessFlags::LOCAL_WRITE))
                    && mr.contains(b.addr, b.len)
                    && !keys.is_window(mw.rkey())
            });
            p.outcome = Outcome::Done(match bound {
                Some(mr) => {
                    rkey = keys.bind_window(Window {
                        mr,
                        addr: b.addr,
                        len: b.len,
                        access: b.access,
                        qpn: self.qpn,
                    })?;
                    mw.set_rkey(rkey);
                    WcStatus::Success
                }
                None => {
                    sq.failed = true;
                    WcStatus::MwBindErr
                }
            });
        }
        sq.pending.push_back(p);
        self.drain_done(&mut sq);
        Ok(rkey)
    }

    fn post_one(&self, sq: &mut SendQueue, wr: &SendWr<'_>, more: bool) -> Result<()> {
        let state = self.state();
        if !matches!(state, QpState::Rts | QpState::Error) {
            return Err(self.bad_state("posting sends needs RTS"));
        }
        if wr.sg_list.len() > self.cfg.max_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "{} SGEs, the QP allows {}",
                wr.sg_list.len(),
                self.cfg.max_sge
            )));
        }
        let mut p = self.take_entry(sq, wr.wr_id, wr.op.completion_opcode(), wr.signaled)?;
        if state == QpState::Error || sq.failed || sq.broken.is_some() {
            sq.pending.push_back(p);
            return Ok(());
        }
        if let WrOp::LocalInvalidate { rkey } = wr.op {
            // A local operation: done here, completed in order with the rest.
            let ok = self.ctx.keys.invalidate_window(rkey, self.pd_id);
            p.outcome = Outcome::Done(if ok {
                WcStatus::Success
            } else {
                WcStatus::LocQpOpErr // as rxe: no window of ours under that key
            });
            sq.failed |= !ok;
            sq.pending.push_back(p);
            return Ok(());
        }
        let (need, atomic): (AccessFlags, bool) = match wr.op {
            WrOp::Send { .. } | WrOp::Write { .. } | WrOp::LocalInvalidate { .. } => {
                (AccessFlags::empty(), false)
            }
            WrOp::Read { .. } => (AccessFlags::LOCAL_WRITE, false),
            WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => (AccessFlags::LOCAL_WRITE, true),
        };
        let local_error = match self.resolve(wr.sg_list, need) {
            // Atomic shapes are validated before posting (SendWr::validate); a zero-length
            // SGE could still leave the list empty here.
            Ok((_, total)) if atomic && total != 8 => Some(WcStatus::LocLenErr),
            Ok((local, total)) => {
                p.local = local;
                p.byte_len = total as u32;
                None
            }
            Err(status) => Some(status),
        };
        if let Some(status) = local_error {
            p.outcome = Outcome::Done(status);
            sq.failed = true;
            sq.pending.push_back(p);
            return Ok(());
        }
        if let Some(status) = self.try_zero_copy(sq, &wr.op, &p) {
            p.outcome = Outcome::Done(status);
            if status != WcStatus::Success {
                sq.failed = true;
            }
            sq.pending.push_back(p);
            return Ok(());
        }
        let (op, remote, compare_add, swap, imm) = match wr.op {
            WrOp::Send { imm } => (ReqOp::Send, None, 0, 0, imm),
            WrOp::Write { remote, imm } => (ReqOp::Write, Some(remote), 0, 0, imm),
            WrOp::Read { remote } => (ReqOp::Read, Some(remote), 0, 0, None),
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            } => (ReqOp::CompareSwap, Some(remote), compare, swap, None),
            WrOp::FetchAdd { remote, add } => (ReqOp::FetchAdd, Some(remote), add, 0, None),
            WrOp::LocalInvalidate { .. } => unreachable!("local invalidations complete above"),
        };
        let req = Request {
            op,
            seq: p.seq,
            remote_addr: remote.map_or(0, |r| r.addr),
            rkey: remote.map_or(0, |r| r.rkey),
            len: p.byte_len,
            compare_add,
            swap,
            imm,
        };
        self.transmit(sq, &req, p, more);
        Ok(())
    }

    /// The intra-host zero-copy path: executes a one-sided operation directly on the peer's
    /// mapped region. Returns None when the operation must go through the socket instead
    /// (not a local peer, socket requests still in flight — RC order —, a region the peer
    /// cannot share, or an operation that needs the peer's receive queue).
    fn try_zero_copy(&self, sq: &mut SendQueue, op: &WrOp, p: &Pending) -> Option<WcStatus> {
        // (Read-ahead bytes are only there while responses are outstanding; the Map
        // exchange below reads the socket directly.)
        if sq.in_flight != 0 || sq.rx.len() != 0 || p.byte_len == 0 {
            return None;
        }
        let (remote, fop) = match *op {
            WrOp::Write { remote, imm: None } => (remote, FastOp::Write),
            WrOp::Read { remote } => (remote, FastOp::Read),
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            } => (remote, FastOp::CompareSwap { compare, swap }),
            WrOp::FetchAdd { remote, add } => (remote, FastOp::FetchAdd { add }),
            _ => return None,
        };
        let fd = sq.conn.as_ref()?.as_raw_fd();
        let lp = sq.local.as_mut()?;
        if lp.last_liveness_check.elapsed() > LIVENESS_INTERVAL {
            lp.last_liveness_check = Instant::now();
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
                self.break_connection(sq, fd, WcStatus::RetryExcErr);
                return Some(WcStatus::RetryExcErr);
            }
        }
        let rm = match lp.maps.get(&remote.rkey) {
            Some(Some(rm)) if rm.is_valid() => rm.clone(),
            Some(None) => return None,
            _ => match self.map_remote(fd, remote.rkey) {
                Ok(m) => {
                    lp.maps
                        .retain(|_, v| v.as_ref().is_none_or(|r| r.is_valid()));
                    lp.maps.insert(remote.rkey, m.clone());
                    m?
                }
                Err(status) => {
                    self.break_connection(sq, fd, status);
                    return Some(status);
                }
            },
        };
        let lp = sq.local.as_ref()?;
        // Like the wire path, give a peer that is still connecting until the timeout.
        let until = Instant::now() + self.cfg.timeout;
        loop {
            match lp.target_state.get() {
                QpState::Rtr | QpState::Rts => break,
                QpState::Error => return Some(WcStatus::RetryExcErr),
                _ if Instant::now() >= until => return Some(WcStatus::RetryExcErr),
                _ => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        let status = shm::execute(
            &rm,
            lp.target_pd,
            remote.rkey,
            remote.addr,
            p.byte_len as u64,
            &fop,
            &p.local,
        );
        if matches!(status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr) {
            lp.target_state.set_error(); // the responder's QP goes to ERR, as on the wire
        }
        Some(status)
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

    /// Puts one request on the wire (header plus gathered payload) and queues it.
    fn transmit(&self, sq: &mut SendQueue, req: &Request, mut p: Pending, more: bool) {
        let hdr = req.encode();
        let fd = sq
            .conn
            .as_ref()
            .map(|c| c.as_raw_fd())
            .expect("RTS has a connection");
        let mut iov = IoVecs::new();
        iov.push(hdr.as_ptr(), hdr.len());
        let payload = req.payload_len() > 0;
        let local = std::mem::take(&mut p.local);
        let sent = {
            let guards: Option<ArrayVec<_, MAX_SGE>> = if payload {
                local.iter().map(|r| r.mr.hold()).collect()
            } else {
                Some(ArrayVec::new())
            };
            match guards {
                // Deregistered between the check and now.
                None => None,
                Some(_held) => {
                    if payload {
                        for r in &local {
                            iov.push(r.addr as *const u8, r.len as usize);
                        }
                    }
                    let deadline = Instant::now() + self.cfg.timeout;
                    // SAFETY: the header is on our stack and each payload piece lies inside
                    // a region whose registration `_held` keeps for the whole send.
                    Some(unsafe {
                        io::send_all(fd, &mut iov, deadline, more, || {
                            self.progress_rx(sq);
                            sq.broken.is_none()
                        })
                    })
                }
            }
        };
        p.local = local;
        let Some(sent) = sent else {
            p.outcome = Outcome::Done(WcStatus::LocProtErr);
            sq.failed = true;
            sq.pending.push_back(p);
            return;
        };
        p.outcome = Outcome::Sent;
        sq.pending.push_back(p);
        sq.in_flight += 1;
        if sq.in_flight == 1 && self.send_cq.is_armed() {
            // The CQ was armed while nothing awaited a response, so its channel does not
            // watch this connection yet: without this, the response would wake nobody.
            self.send_cq.rearm_socket(fd);
        }
        if let Err(e) = sent {
            tracing::debug!(qpn = self.qpn, "send failed: {e}");
            self.break_connection(sq, fd, WcStatus::RetryExcErr);
        }
    }

    /// Marks the connection dead: the oldest outstanding request gets `status`, the rest
    /// are flushed.
    fn break_connection(&self, sq: &mut SendQueue, fd: RawFd, status: WcStatus) {
        // A shut-down socket is readable forever: take it out of the completion channel.
        self.send_cq.unwatch_socket(fd);
        // SAFETY: shutdown on a descriptor we own; it stays open (closed on drop) so the
        // number cannot be reused under us.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        sq.broken.get_or_insert(status);
        let mut first = true;
        for e in sq.pending.iter_mut() {
            if e.outcome == Outcome::Sent {
                e.outcome = Outcome::Done(if first { status } else { WcStatus::WrFlushErr });
                first = false;
            }
        }
        sq.in_flight = 0;
    }

    /// Called when `cq` (our send CQ) is armed: if requests await responses, their arrival
    /// makes the CQ's channel readable (see `SoftCq::channel`).
    pub(crate) fn arm_response_wakeup(&self, cq: &SoftCq) {
        match self.sq.try_lock() {
            Some(sq) => {
                if let (Some(c), true, None) = (&sq.conn, sq.in_flight > 0, sq.broken) {
                    cq.rearm_socket(c.as_raw_fd());
                }
            }
            // Someone is posting or progressing; waking once too many is harmless.
            None => {
                let fd = self.conn_fd.load(Ordering::Acquire);
                if fd >= 0 {
                    cq.rearm_socket(fd);
                }
            }
        }
    }

    /// Caller-driven progress (from polling the send CQ): reads responses, enforces the
    /// timeout, completes finished requests in order.
    pub(crate) fn progress(&self) {
        self.flush_receives_once();
        if let Some(mut sq) = self.sq.try_lock() {
            self.progress_rx(&mut sq);
            self.drain_done(&mut sq);
        }
    }

    fn progress_rx(&self, sq: &mut SendQueue) {
        let Some(fd) = sq.conn.as_ref().map(|c| c.as_raw_fd()) else {
            return;
        };
        if self.state() == QpState::Error && sq.in_flight > 0 {
            self.break_connection(sq, fd, WcStatus::WrFlushErr);
            return;
        }
        while sq.in_flight > 0 {
            // Completed requests leave the head first, so the head is the oldest one sent.
            self.drain_done(sq);
            if sq.rx.len() < RESP_LEN {
                // One read takes every response that has arrived.
                match sq.rx.fill_nowait(fd) {
                    Ok(_) if sq.rx.len() == 0 => break,
                    Ok(_) => {}
                    Err(_) => {
                        self.break_connection(sq, fd, WcStatus::RetryExcErr);
                        return;
                    }
                }
                let deadline = Instant::now() + self.cfg.timeout;
                if sq.rx.fill_to(fd, RESP_LEN, deadline).is_err() {
                    self.break_connection(sq, fd, WcStatus::RetryExcErr);
                    return;
                }
            }
            let hdr: &[u8; RESP_LEN] = sq.rx.take(RESP_LEN).try_into().expect("a whole header");
            let status = match Response::decode(hdr, self.ctx.max_msg) {
                Ok(resp) => self.complete_front(sq, fd, resp),
                Err(_) => Err(WcStatus::BadRespErr),
            };
            if let Err(status) = status {
                self.break_connection(sq, fd, status);
                return;
            }
        }
        if let Some(front) = sq.pending.front() {
            if front.outcome == Outcome::Sent && front.posted.elapsed() > self.cfg.timeout {
                self.break_connection(sq, fd, WcStatus::RetryExcErr);
            }
        }
    }

    /// Applies one response to the oldest outstanding request. Err means the connection
    /// is unusable (with the status to report).
    fn complete_front(
        &self,
        sq: &mut SendQueue,
        fd: RawFd,
        resp: Response,
    ) -> std::result::Result<(), WcStatus> {
        let timeout = self.cfg.timeout;
        let SendQueue { pending, rx, .. } = sq;
        let e = pending.front_mut().ok_or(WcStatus::BadRespErr)?;
        if e.outcome != Outcome::Sent || e.seq != resp.seq() {
            return Err(WcStatus::BadRespErr);
        }
        let status = match (resp, e.opcode) {
            (Response::Ack { .. }, WcOpcode::Send | WcOpcode::RdmaWrite) => WcStatus::Success,
            (Response::Nak { status, .. }, _) => status,
            (Response::ReadData { len, .. }, WcOpcode::RdmaRead) if len == e.byte_len => {
                let guards: Option<ArrayVec<_, MAX_SGE>> =
                    e.local.iter().map(|r| r.mr.hold()).collect();
                let deadline = Instant::now() + timeout;
                match guards {
                    Some(_held) => {
                        let mut iov = IoVecs::new();
                        for r in &e.local {
                            iov.push(r.addr as *const u8, r.len as usize);
                        }
                        // SAFETY: each piece lies in a registered region with LOCAL_WRITE
                        // (checked at post time) that `_held` keeps registered.
                        unsafe { rx.read_into(fd, &mut iov, deadline) }
                            .map_err(|_| WcStatus::RetryExcErr)?;
                        WcStatus::Success
                    }
                    None => {
                        rx.discard(fd, len as usize, deadline)
                            .map_err(|_| WcStatus::RetryExcErr)?;
                        WcStatus::LocProtErr
                    }
                }
            }
            (Response::Atomic { old, .. }, WcOpcode::CompSwap | WcOpcode::FetchAdd) => {
                let r = &e.local[0];
                match r.mr.hold() {
                    Some(_held) => {
                        // SAFETY: an 8-byte range inside a registered region with LOCAL_WRITE,
                        // kept registered by `_held`; unaligned write allowed.
                        unsafe { std::ptr::write_unaligned(r.addr as *mut u64, old) };
                        WcStatus::Success
                    }
                    None => WcStatus::LocProtErr,
                }
            }
            _ => return Err(WcStatus::BadRespErr),
        };
        e.outcome = Outcome::Done(status);
        sq.in_flight -= 1;
        Ok(())
    }

    /// Completes finished requests from the head of the queue, in posting order.
    fn drain_done(&self, sq: &mut SendQueue) {
        while let Some(Outcome::Done(status)) = sq.pending.front().map(|e| e.outcome) {
            let e = sq.pending.pop_front().expect("front exists");
            let status = if self.state() == QpState::Error {
                WcStatus::WrFlushErr
            } else {
                status
            };
            if status != WcStatus::Success {
                self.enter_error();
            }
            if status != WcStatus::Success || e.signaled {
                self.send_cq.push(Completion {
                    wr_id: e.wr_id,
                    status,
                    opcode: e.opcode,
                    byte_len: if status == WcStatus::Success {
                        e.byte_len
                    } else {
                        0
                    },
                    imm: None,
                    qp_num: self.qpn,
                });
            }
        }
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
            if wr.sg_list.len() > self.cfg.max_sge as usize {
                return Err(Error::InvalidArgument(format!(
                    "{} SGEs, the QP allows {}",
                    wr.sg_list.len(),
                    self.cfg.max_sge
                )));
            }
            if state == QpState::Error {
                self.recv_cq.push(Completion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    qp_num: self.qpn,
                });
                continue;
            }
            let mut rq = self.rq.lock();
            if rq.len() >= self.cfg.max_recv_wr as usize {
                return Err(Error::QueueFull {
                    queue: "receive",
                    depth: self.cfg.max_recv_wr,
                });
            }
            let (local, capacity) = match self.resolve(wr.sg_list, AccessFlags::LOCAL_WRITE) {
                Ok((l, c)) => (Ok(l), c),
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

impl Drop for SoftQp {
    fn drop(&mut self) {
        // Local peers see this page: a destroyed QP answers nothing, like one in ERR.
        self.state_word()
            .store(QpState::Error as u64, Ordering::Release);
        self.ctx.qps.write().remove(&self.qpn);
        if let Some(c) = &self.sq.get_mut().conn {
            self.send_cq.unwatch_socket(c.as_raw_fd());
        }
    }
}
