//! The responder's driver: one thread per incoming connection feeds its bytes to a
//! [`Responder`] and sends back what it queues (the target half of the emulated NIC runs on
//! these threads, never the application's).

use super::context::{ConnSlot, CtxShared, PeerKey};
use super::io::{self, IoVecs, RxBuf};
use super::peer::{self, own_uid, PeerInfo};
use super::proto::handshake::{
    encode_hello_ack, Challenge, Hello, HelloStatus, HELLO_LEN, TOKEN_LEN,
};
use super::proto::responder::{self, Output, Responder};
use super::proto::target::TargetQp;
use super::proto::wire::{Response, RESP_LEN};
use super::shm;
use crate::fabric::{AccessFlags, AllowUsers, QpState};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Responses held back to go out together, at most.
const TX_BATCH: usize = 64;
/// How often a stalled request (waiting for a receive or for the QP to be ready) is retried.
const STALL_RETRY: Duration = Duration::from_micros(50);
/// How long the thread sleeps at most before it checks whether its QP or context is gone.
const IDLE_CHECK: Duration = Duration::from_millis(200);
/// The same, once the connection has been idle that long.
const IDLE_CHECK_LONG: Duration = Duration::from_secs(1);
/// How long after its last traffic a connection still spins before it sleeps.
const IDLE_SPIN_WINDOW: Duration = Duration::from_millis(1);

/// Accepts connections on the context's listeners, each served by a thread of its own,
/// until the listeners are shut down or the context is gone.
pub(crate) fn accept(tcp: TcpListener, unix: UnixListener, shared: Weak<CtxShared>) {
    let tcp_accept = |l: &TcpListener| {
        l.accept().map(|(s, from)| {
            let _ = s.set_nodelay(true);
            keepalive(s.as_raw_fd());
            let info = match s.local_addr() {
                Ok(local) => peer::of_tcp(local, from),
                Err(_) => PeerInfo {
                    ip: Some(from.ip()),
                    uid: None,
                    on_this_host: from.ip().is_loopback(),
                },
            };
            (s, info)
        })
    };
    spawn_acceptor("rdmapool-soft-tcp", tcp, shared.clone(), false, tcp_accept);
    let unix_accept = |l: &UnixListener| {
        l.accept().map(|(s, _)| {
            let info = peer::of_unix(s.as_raw_fd());
            (s, info)
        })
    };
    spawn_acceptor("rdmapool-soft-local", unix, shared, true, unix_accept);
}

/// TCP keepalive on an accepted connection: a peer whose host vanished without a FIN (power
/// loss, a partition) is noticed after about 10 s idle + 3 probes 2 s apart, and its QP
/// then learns that its peer is gone like any other. Keepalive probes only an idle
/// connection: one with responses still unacknowledged when the peer vanished would
/// otherwise wait out the kernel's retransmissions (`tcp_retries2`, about 15 minutes), so
/// `TCP_USER_TIMEOUT` gives up on unacknowledged data after the same 16 s.
fn keepalive(fd: RawFd) {
    let set = |level, opt, v: libc::c_int| {
        // SAFETY: setsockopt on a socket we own, with a c_int value of the declared size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set(
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        PEER_GONE_AFTER_MS,
    );
}

/// How long an accepted connection's peer may stay silent (idle under keepalive, or not
/// acknowledging data) before the connection is given up: 10 s + 3 x 2 s.
const PEER_GONE_AFTER_MS: libc::c_int = 16_000;

fn spawn_acceptor<L, S>(
    name: &str,
    listener: L,
    shared: Weak<CtxShared>,
    local: bool,
    accept: fn(&L) -> std::io::Result<(S, PeerInfo)>,
) where
    L: Send + 'static,
    S: Into<OwnedFd> + Send + 'static,
{
    let _ = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            let (conn, peer) = match accept(&listener) {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    // Out of descriptors: refuse for a moment rather than spin.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(_) => return, // listener shut down
            };
            let Some(ctx) = shared.upgrade() else { return };
            if ctx.is_closing() {
                return;
            }
            let Some(slot) = ctx.admit(PeerKey::of(&peer)) else {
                tracing::warn!(?peer, "refusing a connection: connection limit reached");
                continue; // dropping `conn` closes it
            };
            let fd: OwnedFd = conn.into();
            let spawned = std::thread::Builder::new()
                .name("rdmapool-soft-resp".into())
                .spawn(move || serve(ctx, fd, local, peer, slot));
            if let Err(e) = spawned {
                tracing::warn!("refusing a connection: cannot start its thread: {e}");
            }
        });
}

/// Serves one incoming connection until it closes or misbehaves. When it ends while its QP
/// lives, the QP learns that its peer is gone (ERR and an event).
pub(crate) fn serve(
    ctx: Arc<CtxShared>,
    conn: OwnedFd,
    local: bool,
    peer: PeerInfo,
    _slot: ConnSlot,
) {
    let fd = conn.as_raw_fd();
    let Some(qp) = handshake(&ctx, fd, local, &peer) else {
        return;
    };
    let qpn = qp.qpn();
    let weak = Arc::downgrade(&qp);
    drop(qp);
    let mut c = Conn {
        fd,
        mappable_peer: local && ctx.admission.local_mappings && peer.uid == Some(own_uid()),
        ctx,
        rx: RxBuf::new(),
        tx: Vec::with_capacity(TX_BATCH * RESP_LEN),
    };
    let ended = c.run(&weak);
    // What was executed is answered, even when the connection ends on a bad frame.
    let _ = c.flush(Instant::now() + Duration::from_millis(100));
    if let Err(reason) = ended {
        tracing::debug!(qpn, "connection ended: {reason}");
        reset_if_unsent(fd);
    }
    if !c.ctx.is_closing() {
        if let Some(qp) = weak.upgrade() {
            qp.peer_lost();
        }
    }
}

/// Makes the coming close a reset when bytes are still queued unsent (a peer that stopped
/// reading, its window shut). A FIN would wait behind those bytes, so such a peer would
/// never learn that the connection is over; and when the peer sent nothing we have not
/// read, the kernel has no other reason to reset it. Only for connections that ended in
/// error: a clean end leaves the close graceful. No-op on Unix sockets (the ioctl is TCP's).
fn reset_if_unsent(fd: RawFd) {
    let mut unsent: libc::c_int = 0;
    // SAFETY: SIOCOUTQNSD on a socket we own writes one c_int, the bytes not yet sent.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCOUTQNSD, &mut unsent) };
    if rc != 0 || unsent == 0 {
        return;
    }
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a linger struct of the declared size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// One served connection: the responder, its read-ahead and the responses not yet sent.
struct Conn {
    fd: RawFd,
    /// Whether the peer may map regions (same user on this host, mappings allowed).
    mappable_peer: bool,
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
            // Spin only right after traffic; an idle connection sleeps, longer as it stays idle.
            let idle = now.saturating_duration_since(last_progress);
            let spin = if idle < IDLE_SPIN_WINDOW {
                self.ctx.spin
            } else {
                Duration::ZERO
            };
            let check = if idle < IDLE_CHECK {
                IDLE_CHECK
            } else {
                IDLE_CHECK_LONG
            };
            match io::wait_readable(self.fd, spin, Some(Instant::now() + check)) {
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
                    // Hand out the memfd of an owned region that grants both remote read and
                    // write (a mapping gives both), to a same-user peer on the local path; the
                    // peer checks every access against the region's control page itself.
                    // Anything else goes through the socket, checked here.
                    let both = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
                    let mr = self.ctx.keys.by_rkey(rkey);
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

/// Challenges the peer, checks its hello (credentials, QP, MAC, one connection per QP) and
/// answers it. On the local path a successful answer also carries the QP's PD and, as a
/// descriptor, its shared state page (used by the zero-copy path).
fn handshake(
    ctx: &CtxShared,
    fd: RawFd,
    local: bool,
    peer: &PeerInfo,
) -> Option<Arc<dyn TargetQp>> {
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let challenge = Challenge::fresh().ok()?;
    io::send_buf(fd, &challenge.encode(), deadline).ok()?;
    let mut b = [0u8; HELLO_LEN];
    io::recv_exact(fd, &mut b, deadline).ok()?;
    let hello = match Hello::decode(&b) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(?peer, "rejecting connection: {e}");
            return None;
        }
    };
    let qp = ctx.qps.read().get(&hello.dst_qpn).and_then(Weak::upgrade);
    let psk = ctx.admission.psk.as_ref().map(|k| k.bytes());
    let user_allowed = !peer.on_this_host
        || match peer.uid {
            Some(uid) => ctx.admission.allow_users.allows(uid, own_uid()),
            None => ctx.admission.allow_users == AllowUsers::Any,
        };
    let status = match &qp {
        _ if !user_allowed => HelloStatus::PeerNotAllowed,
        // Answered as a wrong MAC (verified against a token no QP has, so that it takes as
        // long): a peer that cannot authenticate learns nothing of which QP numbers exist.
        None => {
            let _ = hello.verify(&challenge, &[0u8; TOKEN_LEN], psk);
            HelloStatus::AuthFailed
        }
        Some(q) if !hello.verify(&challenge, &q.token(), psk) => HelloStatus::AuthFailed,
        Some(q) if q.peer_qpn().is_some_and(|p| p != hello.src_qpn) => HelloStatus::AuthFailed,
        Some(q) if q.state() == QpState::Error => HelloStatus::QpInError,
        Some(q) if !q.claim_incoming() => HelloStatus::AlreadyConnected,
        Some(_) => HelloStatus::Ok,
    };
    if status != HelloStatus::Ok {
        tracing::warn!(
            ?peer,
            qpn = hello.dst_qpn,
            ?status,
            "refusing a data connection"
        );
    }
    io::send_buf(fd, &encode_hello_ack(status), deadline).ok()?;
    let qp = qp.filter(|_| status == HelloStatus::Ok)?;
    if local {
        let mut info = [0u8; 8];
        info[..4].copy_from_slice(&qp.pd().to_le_bytes());
        shm::send_with_fds(fd, &info, &[qp.state_fd()]).ok()?;
    }
    Some(qp)
}
