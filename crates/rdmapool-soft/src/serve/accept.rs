//! Taking a new connection off a listener: socket options, who the peer is, admission.

use super::super::context::{ConnSlot, CtxShared, PeerKey};
use super::super::peer::{self, PeerInfo};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

/// A connection the NIC admitted, not yet challenged.
pub(super) struct Accepted {
    pub(super) fd: OwnedFd,
    /// Whether it came in on the local (Unix) socket.
    pub(super) local: bool,
    pub(super) peer: PeerInfo,
    /// Its share of the NIC's connection limits, given back when it drops.
    pub(super) slot: ConnSlot,
}

/// What one accept gave.
pub(super) enum AcceptOutcome {
    /// A connection to serve.
    Admitted(Accepted),
    /// A connection was taken and closed at once (a limit was reached), or the accept was
    /// aborted by the peer: try again.
    Refused,
    /// Nothing is waiting.
    Empty,
    /// Out of descriptors: stop accepting for a moment rather than spin.
    OutOfDescriptors,
    /// The listener was shut down (the context is closing) or failed.
    Closed,
}

/// Takes one waiting connection off the TCP listener.
pub(super) fn tcp(l: &TcpListener, ctx: &Arc<CtxShared>) -> AcceptOutcome {
    match l.accept() {
        Ok((s, from)) => {
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
            admit(ctx, s.into(), false, info)
        }
        Err(e) => outcome_of(e),
    }
}

/// Takes one waiting connection off the local (Unix) listener.
pub(super) fn unix(l: &UnixListener, ctx: &Arc<CtxShared>) -> AcceptOutcome {
    match l.accept() {
        Ok((s, _)) => {
            let info = peer::of_unix(s.as_raw_fd());
            admit(ctx, s.into(), true, info)
        }
        Err(e) => outcome_of(e),
    }
}

fn outcome_of(e: std::io::Error) -> AcceptOutcome {
    match e.kind() {
        std::io::ErrorKind::WouldBlock => AcceptOutcome::Empty,
        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted => {
            AcceptOutcome::Refused
        }
        _ if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            AcceptOutcome::OutOfDescriptors
        }
        _ => AcceptOutcome::Closed,
    }
}

fn admit(ctx: &Arc<CtxShared>, fd: OwnedFd, local: bool, peer: PeerInfo) -> AcceptOutcome {
    let Some(slot) = ctx.admit(PeerKey::of(&peer)) else {
        tracing::warn!(?peer, "refusing a connection: connection limit reached");
        return AcceptOutcome::Refused; // dropping `fd` closes it
    };
    if set_nonblocking(fd.as_raw_fd()).is_err() {
        return AcceptOutcome::Refused;
    }
    AcceptOutcome::Admitted(Accepted {
        fd,
        local,
        peer,
        slot,
    })
}

/// Every socket the serving loop owns is non-blocking: one stuck peer must never stall it.
fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, reading then setting its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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

/// Makes the coming close a reset when bytes are still queued unsent (a peer that stopped
/// reading, its window shut). A FIN would wait behind those bytes, so such a peer would
/// never learn that the connection is over; and when the peer sent nothing we have not
/// read, the kernel has no other reason to reset it. Only for connections that ended in
/// error: a clean end leaves the close graceful. No-op on Unix sockets (the ioctl is TCP's).
pub(super) fn reset_if_unsent(fd: RawFd) {
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
