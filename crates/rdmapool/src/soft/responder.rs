//! The target half of the emulated NIC: executes incoming requests against registered
//! memory, with the access checks an HCA makes, on its own threads (never the application's).

use super::io::{self, IoVecs, RxBuf};
use super::keys::MrInner;
use super::qp::{RecvEntry, SoftQp};
use super::wire::{self, HelloStatus, ReqOp, Request, Response, HELLO_LEN, REQ_LEN, RESP_LEN};
use super::{shm, CtxShared};
use crate::fabric::{AccessFlags, Completion, QpState, WcOpcode, WcStatus};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one incoming connection until it closes or misbehaves.
pub(crate) fn serve(ctx: Arc<CtxShared>, conn: OwnedFd, local: bool) {
    let fd = conn.as_raw_fd();
    let Some(qp) = handshake(&ctx, fd, local) else {
        return;
    };
    let (qpn, timeout) = (qp.qpn, qp.cfg.timeout);
    let weak = Arc::downgrade(&qp);
    drop(qp);
    let mut conn = Conn {
        fd,
        rx: RxBuf::new(),
        tx: Vec::with_capacity(TX_BATCH * RESP_LEN),
        timeout,
    };
    loop {
        if conn.rx.len() < REQ_LEN {
            // No whole request buffered: answer what was executed (one send for a list of
            // requests), then read what has arrived, or wait for it.
            if conn.flush().is_err() {
                return;
            }
            match conn.rx.fill_nowait(fd) {
                Ok(0) => {}
                Ok(_) => continue,
                Err(_) => return, // EOF or reset
            }
            if conn.rx.len() == 0 {
                // Spin briefly while traffic flows, then sleep.
                match io::wait_readable(
                    fd,
                    ctx.spin,
                    Some(Instant::now() + Duration::from_millis(200)),
                ) {
                    Ok(true) => continue,
                    Ok(false) => {
                        if ctx.is_closing() || weak.strong_count() == 0 {
                            return;
                        }
                        continue;
                    }
                    Err(_) => return,
                }
            }
        }
        if conn
            .rx
            .fill_to(fd, REQ_LEN, Instant::now() + timeout)
            .is_err()
        {
            return; // EOF or a peer that stalled mid-frame
        }
        let hdr: &[u8; REQ_LEN] = conn.rx.take(REQ_LEN).try_into().expect("a whole header");
        let req = match Request::decode(hdr, ctx.max_msg) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(qpn, "closing connection: {e}");
                return;
            }
        };
        let Some(qp) = upgrade(&weak) else { return };
        if let Err(e) = execute(&ctx, &qp, &mut conn, &req, local) {
            tracing::debug!(qpn, "connection ended: {e}");
            return;
        }
    }
}

/// Responses held back to go out together, at most.
const TX_BATCH: usize = 64;

/// One served connection: its read-ahead and the responses not yet sent.
struct Conn {
    fd: RawFd,
    rx: RxBuf,
    tx: Vec<u8>,
    timeout: Duration,
}

impl Conn {
    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Queues a fixed-size response; sends the queue when it is full.
    fn reply(&mut self, r: Response) -> std::io::Result<()> {
        self.tx.extend_from_slice(&r.encode());
        if self.tx.len() >= TX_BATCH * RESP_LEN {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends the queued responses (before anything that may wait, and when no request is
    /// buffered).
    fn flush(&mut self) -> std::io::Result<()> {
        if self.tx.is_empty() {
            return Ok(());
        }
        let r = io::send_buf(self.fd, &self.tx, self.deadline());
        self.tx.clear();
        r
    }

    fn skip_payload(&mut self, req: &Request) -> std::io::Result<()> {
        let deadline = self.deadline();
        self.rx
            .discard(self.fd, req.payload_len() as usize, deadline)
    }
}

fn upgrade(w: &Weak<SoftQp>) -> Option<Arc<SoftQp>> {
    w.upgrade()
}

/// Reads the hello and answers it. On the local path a successful answer also carries the
/// QP's PD and, as a descriptor, its shared state page (used by the zero-copy path).
fn handshake(ctx: &CtxShared, fd: RawFd, local: bool) -> Option<Arc<SoftQp>> {
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let mut b = [0u8; HELLO_LEN];
    io::recv_exact(fd, &mut b, deadline).ok()?;
    let hello = match wire::Hello::decode(&b) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("rejecting connection: {e}");
            return None;
        }
    };
    let qp = ctx.qps.read().get(&hello.dst_qpn).and_then(Weak::upgrade);
    let status = match &qp {
        None => HelloStatus::NoSuchQp,
        Some(q) if q.state() == QpState::Error => HelloStatus::QpInError,
        Some(_) => HelloStatus::Ok,
    };
    io::send_buf(fd, &wire::encode_hello_ack(status), deadline).ok()?;
    let qp = qp.filter(|_| status == HelloStatus::Ok)?;
    if local {
        let mut info = [0u8; 8];
        info[..4].copy_from_slice(&qp.pd_id.to_le_bytes());
        shm::send_with_fds(fd, &info, &[qp.state_fd()]).ok()?;
    }
    Some(qp)
}

/// Waits (like a peer's retries) for the target QP to reach RTR or RTS.
fn ready(qp: &SoftQp) -> bool {
    let until = Instant::now() + qp.cfg.timeout;
    loop {
        match qp.state() {
            QpState::Rtr | QpState::Rts => return true,
            QpState::Error => return false,
            _ if Instant::now() >= until => return false,
            _ => std::thread::sleep(Duration::from_micros(100)),
        }
    }
}

/// Takes the oldest posted receive; before waiting for one, sends the queued responses.
fn take_recv_flushing(qp: &SoftQp, conn: &mut Conn) -> std::io::Result<Option<RecvEntry>> {
    if let Some(e) = qp.rq.lock().pop_front() {
        return Ok(Some(e));
    }
    conn.flush()?;
    Ok(take_recv(qp))
}

/// Takes the oldest posted receive, waiting up to the RNR timeout for one.
fn take_recv(qp: &SoftQp) -> Option<RecvEntry> {
    let until = Instant::now() + qp.cfg.rnr_timeout;
    loop {
        if let Some(e) = qp.rq.lock().pop_front() {
            return Some(e);
        }
        if qp.state() == QpState::Error || Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn recv_completion(
    qp: &SoftQp,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    len: u32,
    imm: Option<u32>,
) {
    qp.recv_cq.push(Completion {
        wr_id,
        status,
        opcode,
        byte_len: if status == WcStatus::Success { len } else { 0 },
        imm,
        qp_num: qp.qpn,
    });
}

/// The remote region a request targets, if the access check passes.
fn check(ctx: &CtxShared, qp: &SoftQp, req: &Request, need: AccessFlags) -> Option<Arc<MrInner>> {
    ctx.keys.resolve(
        req.rkey,
        qp.pd_id,
        qp.qpn,
        need,
        req.remote_addr,
        req.len as u64,
    )
}

/// Executes one request and answers it. An `Err` means the connection is unusable.
fn execute(
    ctx: &CtxShared,
    qp: &SoftQp,
    conn: &mut Conn,
    req: &Request,
    local: bool,
) -> std::io::Result<()> {
    let fd = conn.fd;
    let deadline = conn.deadline();
    let nak = |status: WcStatus| Response::Nak {
        seq: req.seq,
        status,
    };
    if !matches!(qp.state(), QpState::Rtr | QpState::Rts) {
        conn.flush()?; // about to wait: send what is done
        if !ready(qp) {
            conn.skip_payload(req)?;
            return conn.reply(nak(WcStatus::RetryExcErr));
        }
    }
    match req.op {
        ReqOp::Map => {
            // Hand out the memfd of an owned region (local path only); the peer checks every
            // access against the region's control page itself.
            let mr = ctx.keys.by_rkey(req.rkey);
            let memfd = mr
                .as_ref()
                .and_then(|m| m.memory.as_ref())
                .filter(|_| local)
                .map(shm::raw);
            let hdr = Response::Map {
                seq: req.seq,
                mappable: memfd.is_some(),
            }
            .encode();
            conn.flush()?;
            match memfd {
                Some(m) => shm::send_with_fds(fd, &hdr, &[m]),
                None => io::send_buf(fd, &hdr, deadline),
            }
        }
        ReqOp::Write => {
            let mr = if req.len == 0 {
                None
            } else {
                match check(ctx, qp, req, AccessFlags::REMOTE_WRITE) {
                    Some(mr) => Some(mr),
                    None => {
                        conn.skip_payload(req)?;
                        qp.enter_error();
                        return conn.reply(nak(WcStatus::RemAccessErr));
                    }
                }
            };
            // WRITE with immediate needs a receive before anything is written.
            let recv = match req.imm {
                Some(_) => match take_recv_flushing(qp, conn)? {
                    Some(r) => Some(r),
                    None => {
                        conn.skip_payload(req)?;
                        return conn.reply(nak(WcStatus::RnrRetryExcErr));
                    }
                },
                None => None,
            };
            if let Some(mr) = mr {
                let Some(_held) = mr.hold() else {
                    conn.skip_payload(req)?;
                    qp.enter_error();
                    return conn.reply(nak(WcStatus::RemAccessErr));
                };
                let mut iov = IoVecs::new();
                iov.push(req.remote_addr as *const u8, req.len as usize);
                // SAFETY: the range passed the bounds check of a region that `_held` keeps
                // registered (so mapped and pinned), and it grants REMOTE_WRITE.
                unsafe { conn.rx.read_into(fd, &mut iov, deadline)? };
            }
            if let Some(r) = recv {
                recv_completion(
                    qp,
                    r.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    req.len,
                    req.imm,
                );
            }
            conn.reply(Response::Ack { seq: req.seq })
        }
        ReqOp::Read => {
            let held = if req.len == 0 {
                None
            } else {
                match check(ctx, qp, req, AccessFlags::REMOTE_READ) {
                    Some(mr) => Some(mr),
                    None => {
                        qp.enter_error();
                        return conn.reply(nak(WcStatus::RemAccessErr));
                    }
                }
            };
            let hdr = Response::ReadData {
                seq: req.seq,
                len: req.len,
            }
            .encode();
            let mut iov = IoVecs::new();
            iov.push(hdr.as_ptr(), hdr.len());
            let _held = match &held {
                Some(mr) => match mr.hold() {
                    Some(g) => Some(g),
                    None => {
                        qp.enter_error();
                        return conn.reply(nak(WcStatus::RemAccessErr));
                    }
                },
                None => None,
            };
            iov.push(req.remote_addr as *const u8, req.len as usize);
            conn.flush()?; // responses leave in order
                           // SAFETY: the header is ours; the data range passed the bounds check of a region
                           // that `_held` keeps registered and that grants REMOTE_READ.
            unsafe { io::send_all(fd, &mut iov, deadline, false, || true) }
        }
        ReqOp::CompareSwap | ReqOp::FetchAdd => {
            if !req.remote_addr.is_multiple_of(8) {
                qp.enter_error();
                return conn.reply(nak(WcStatus::RemInvReqErr));
            }
            let Some(mr) = check(ctx, qp, req, AccessFlags::REMOTE_ATOMIC) else {
                qp.enter_error();
                return conn.reply(nak(WcStatus::RemAccessErr));
            };
            let Some(_held) = mr.hold() else {
                qp.enter_error();
                return conn.reply(nak(WcStatus::RemAccessErr));
            };
            // SAFETY: 8-byte aligned, inside a registered, pinned region kept registered by
            // `_held`; every RDMA atomic on this word goes through an AtomicU64, so they are
            // atomic with respect to each other across threads and processes.
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
            conn.reply(Response::Atomic { seq: req.seq, old })
        }
        ReqOp::Send => {
            let Some(r) = take_recv_flushing(qp, conn)? else {
                conn.skip_payload(req)?;
                return conn.reply(nak(WcStatus::RnrRetryExcErr));
            };
            let opcode = WcOpcode::Recv;
            let local = match r.local {
                Ok(l) => l,
                Err(status) => {
                    conn.skip_payload(req)?;
                    recv_completion(qp, r.wr_id, status, opcode, 0, None);
                    qp.enter_error();
                    return conn.reply(nak(WcStatus::RemOpErr));
                }
            };
            if req.len as u64 > r.capacity {
                conn.skip_payload(req)?;
                // rxe's statuses: LOC_QP_OP_ERR for the receive, REM_OP_ERR for the sender.
                recv_completion(qp, r.wr_id, WcStatus::LocQpOpErr, opcode, 0, None);
                qp.enter_error();
                return conn.reply(nak(WcStatus::RemOpErr));
            }
            let held: Option<arrayvec::ArrayVec<_, { super::MAX_SGE }>> =
                local.iter().map(|l| l.mr.hold()).collect();
            if held.is_none() {
                conn.skip_payload(req)?;
                recv_completion(qp, r.wr_id, WcStatus::LocProtErr, opcode, 0, None);
                qp.enter_error();
                return conn.reply(nak(WcStatus::RemOpErr));
            }
            let mut iov = IoVecs::new();
            let mut left = req.len as usize;
            for l in &local {
                let n = left.min(l.len as usize);
                iov.push(l.addr as *const u8, n);
                left -= n;
            }
            // SAFETY: every piece lies in a receive buffer checked for LOCAL_WRITE when it
            // was posted and kept registered by `held`.
            unsafe { conn.rx.read_into(fd, &mut iov, deadline)? };
            drop(held);
            recv_completion(qp, r.wr_id, WcStatus::Success, opcode, req.len, req.imm);
            conn.reply(Response::Ack { seq: req.seq })
        }
    }
}
