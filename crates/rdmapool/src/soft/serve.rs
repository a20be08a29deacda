//! The responder's driver: one thread per incoming connection feeds its bytes to a
//! [`Responder`] and sends back what it queues (the target half of the emulated NIC runs on
//! these threads, never the application's).

use super::context::CtxShared;
use super::io::{self, IoVecs, RxBuf};
use super::proto::responder::{self, Output, Responder};
use super::proto::target::TargetQp;
use super::proto::wire::{self, HelloStatus, Response, HELLO_LEN, RESP_LEN};
use super::shm;
use crate::fabric::QpState;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses held back to go out together, at most.
const TX_BATCH: usize = 64;
/// How often a stalled request (waiting for a receive or for the QP to be ready) is retried.
const STALL_RETRY: Duration = Duration::from_micros(50);
/// How long the thread sleeps at most before it checks whether its QP or context is gone.
const IDLE_CHECK: Duration = Duration::from_millis(200);

/// Accepts connections on the context's listeners, each served by a thread of its own,
/// until the listeners are shut down or the context is gone.
pub(crate) fn accept(tcp: TcpListener, unix: UnixListener, shared: Weak<CtxShared>) {
    let tcp_accept = |l: &TcpListener| {
        l.accept().map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        })
    };
    spawn_acceptor("rdmapool-soft-tcp", tcp, shared.clone(), false, tcp_accept);
    let unix_accept = |l: &UnixListener| l.accept().map(|(s, _)| s);
    spawn_acceptor("rdmapool-soft-local", unix, shared, true, unix_accept);
}

fn spawn_acceptor<L, S>(
    name: &str,
    listener: L,
    shared: Weak<CtxShared>,
    local: bool,
    accept: fn(&L) -> std::io::Result<S>,
) where
    L: Send + 'static,
    S: Into<OwnedFd> + Send + 'static,
{
    let _ = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            let conn = match accept(&listener) {
                Ok(c) => c,
                Err(_) => return, // listener shut down
            };
            let Some(ctx) = shared.upgrade() else { return };
            if ctx.is_closing() {
                return;
            }
            let fd: OwnedFd = conn.into();
            let _ = std::thread::Builder::new()
                .name("rdmapool-soft-resp".into())
                .spawn(move || serve(ctx, fd, local));
        });
}

/// Serves one incoming connection until it closes or misbehaves.
pub(crate) fn serve(ctx: Arc<CtxShared>, conn: OwnedFd, local: bool) {
    let fd = conn.as_raw_fd();
    let Some(qp) = handshake(&ctx, fd, local) else {
        return;
    };
    let qpn = qp.qpn();
    let weak = Arc::downgrade(&qp);
    drop(qp);
    let mut c = Conn {
        fd,
        local,
        ctx,
        rx: RxBuf::new(),
        tx: Vec::with_capacity(TX_BATCH * RESP_LEN),
    };
    match c.run(&weak) {
        Ok(()) => {}
        Err(reason) => tracing::debug!(qpn, "connection ended: {reason}"),
    }
    // What was executed is answered, even when the connection ends on a bad frame.
    let _ = c.flush(Instant::now() + Duration::from_millis(100));
}

/// One served connection: the responder, its read-ahead and the responses not yet sent.
struct Conn {
    fd: RawFd,
    local: bool,
    ctx: Arc<CtxShared>,
    rx: RxBuf,
    tx: Vec<u8>,
}

impl Conn {
    fn run(&mut self, weak: &Weak<dyn TargetQp>) -> Result<(), String> {
        let mut resp = Responder::new(self.ctx.max_msg);
        let mut last_progress = Instant::now();
        loop {
            let Some(qp) = weak.upgrade() else {
                return Ok(());
            };
            let now = Instant::now();
            let timeout = qp.timeout();
            let mut progressed = false;
            if self.rx.len() > 0 || resp.is_stalled() {
                let n = resp.handle_input(&*qp, self.rx.data(), now);
                self.rx.consume(n);
                progressed |= n > 0;
            }
            if let Some(e) = resp.take_failure() {
                tracing::warn!(qpn = qp.qpn(), "closing connection: {e}");
                self.answer(&mut resp, &*qp, now)?;
                return Ok(());
            }
            if self.rx.len() == 0 {
                let fd = self.fd;
                // SAFETY: the pieces are target memory that passed the access check (or
                // receive buffers checked for LOCAL_WRITE), kept registered by
                // `receive_payload` while it runs.
                match resp.receive_payload(&*qp, |p| unsafe { io::recv_into_nowait(fd, p) }) {
                    Some(Ok(n)) => progressed |= n > 0,
                    Some(Err(e)) => return Err(e.to_string()),
                    None => {}
                }
            }
            progressed |= self.answer(&mut resp, &*qp, now)?;
            if progressed {
                last_progress = now;
                continue;
            }
            if resp.is_stalled() {
                // Waiting for a receive or for the QP: answer what is done, retry shortly.
                self.flush(now + timeout).map_err(|e| e.to_string())?;
                drop(qp);
                let left = resp
                    .poll_timeout()
                    .map(|t| t.saturating_duration_since(now));
                std::thread::sleep(left.map_or(STALL_RETRY, |l| l.min(STALL_RETRY)));
                continue;
            }
            drop(qp);
            match self.rx.fill_nowait(self.fd) {
                Ok(0) => {}
                Ok(_) => continue,
                Err(e) => return Err(e.to_string()), // EOF or reset
            }
            // Nothing to do: answer what is done, then wait for more.
            self.flush(now + timeout).map_err(|e| e.to_string())?;
            if resp.is_mid_frame() && now.saturating_duration_since(last_progress) > timeout {
                return Err("peer stalled in the middle of a frame".into());
            }
            match io::wait_readable(self.fd, self.ctx.spin, Some(Instant::now() + IDLE_CHECK)) {
                Ok(true) => {}
                Ok(false) if self.ctx.is_closing() => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Sends back what the responder queued, in order. Returns whether there was anything.
    fn answer(
        &mut self,
        resp: &mut Responder,
        qp: &dyn TargetQp,
        now: Instant,
    ) -> Result<bool, String> {
        let deadline = now + qp.timeout();
        let mut any = false;
        while let Some(out) = resp.poll_output() {
            any = true;
            match out {
                Output::Reply(r) => {
                    self.tx.extend_from_slice(&r.encode());
                    if self.tx.len() >= TX_BATCH * RESP_LEN {
                        self.flush(deadline).map_err(|e| e.to_string())?;
                    }
                }
                Output::Read(read) => {
                    self.flush(deadline).map_err(|e| e.to_string())?; // responses leave in order
                    let fd = self.fd;
                    responder::read_frame(qp, &read, |hdr, data| {
                        let mut iov = IoVecs::new();
                        iov.push(hdr.as_ptr(), hdr.len());
                        if let Some((addr, len)) = data {
                            iov.push(addr as *const u8, len);
                        }
                        // SAFETY: the header is ours; the data range passed the access check
                        // of a region that `read_frame` keeps registered during this call.
                        unsafe { io::send_all(fd, &mut iov, deadline, false, || true) }
                    })
                    .map_err(|e| e.to_string())?;
                }
                Output::Map { seq, rkey } => {
                    // Hand out the memfd of an owned region (local path only); the peer checks
                    // every access against the region's control page itself.
                    let mr = self.ctx.keys.by_rkey(rkey);
                    let memfd = mr
                        .as_ref()
                        .and_then(|m| m.memory.as_ref())
                        .filter(|_| self.local)
                        .map(shm::raw);
                    let hdr = Response::Map {
                        seq,
                        mappable: memfd.is_some(),
                    }
                    .encode();
                    self.flush(deadline).map_err(|e| e.to_string())?;
                    match memfd {
                        Some(m) => shm::send_with_fds(self.fd, &hdr, &[m]),
                        None => io::send_buf(self.fd, &hdr, deadline),
                    }
                    .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(any)
    }

    /// Sends the queued responses.
    fn flush(&mut self, deadline: Instant) -> std::io::Result<()> {
        if self.tx.is_empty() {
            return Ok(());
        }
        let r = io::send_buf(self.fd, &self.tx, deadline);
        self.tx.clear();
        r
    }
}

/// Reads the hello and answers it. On the local path a successful answer also carries the
/// QP's PD and, as a descriptor, its shared state page (used by the zero-copy path).
fn handshake(ctx: &CtxShared, fd: RawFd, local: bool) -> Option<Arc<dyn TargetQp>> {
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
        info[..4].copy_from_slice(&qp.pd().to_le_bytes());
        shm::send_with_fds(fd, &info, &[qp.state_fd()]).ok()?;
    }
    Some(qp)
}
