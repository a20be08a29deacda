//! The handshake of a new connection, without blocking: the challenge goes out at once, the
//! hello is gathered as its bytes arrive, and the checks and the answer follow.

use super::super::context::CtxShared;
use super::super::io;
use super::super::peer::{own_uid, PeerInfo};
use super::super::proto::handshake::{
    encode_hello_ack, Challenge, Hello, HelloStatus, HELLO_LEN, TOKEN_LEN,
};
use super::super::proto::target::TargetQp;
use super::super::shm;
use crate::fabric::QpState;
use crate::AllowUsers;
use std::os::fd::RawFd;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a new connection may take to say hello.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection that was challenged and has not said all of its hello yet.
pub(super) struct Pending {
    challenge: Challenge,
    hello: [u8; HELLO_LEN],
    got: usize,
    /// When it is closed if its hello is still not in.
    pub(super) deadline: Instant,
}

/// Where a handshake stands.
pub(super) enum Step {
    /// More of the hello is due.
    Waiting,
    /// The connection is refused (or broke): close it.
    Refused,
    /// Accepted: the connection now serves this QP.
    Accepted(Arc<dyn TargetQp>),
}

/// Sends the challenge of a new connection. `None` if it could not be sent whole (a new
/// socket's buffer always takes it: the peer is gone).
pub(super) fn challenge(fd: RawFd, now: Instant) -> Option<Pending> {
    let challenge = Challenge::fresh().ok()?;
    send_whole(fd, &challenge.encode())?;
    Some(Pending {
        challenge,
        hello: [0; HELLO_LEN],
        got: 0,
        deadline: now + HELLO_TIMEOUT,
    })
}

/// Sends a small frame whole without waiting, or gives up.
fn send_whole(fd: RawFd, frame: &[u8]) -> Option<()> {
    let mut iov = io::IoVecs::new();
    iov.push(frame.as_ptr(), frame.len());
    // SAFETY: the one piece is the caller's buffer, borrowed for the call.
    let n = unsafe { io::send_nowait(fd, &mut iov) }.ok()?;
    (n == frame.len()).then_some(())
}

impl Pending {
    /// Reads what has arrived of the hello (never more: requests may follow it at once) and,
    /// once it is whole, checks it and answers.
    pub(super) fn advance(
        &mut self,
        ctx: &CtxShared,
        fd: RawFd,
        local: bool,
        peer: &PeerInfo,
        life: Option<RawFd>,
    ) -> Step {
        match io::recv_nowait(fd, &mut self.hello[self.got..]) {
            Ok(n) => self.got += n,
            Err(_) => return Step::Refused,
        }
        if self.got < HELLO_LEN {
            return Step::Waiting;
        }
        match self.answer(ctx, fd, local, peer, life) {
            Some(qp) => Step::Accepted(qp),
            None => Step::Refused,
        }
    }

    /// Checks the hello (credentials, QP, MAC, one connection per QP) and answers it. On
    /// the local path a successful answer also carries the QP's PD and, as descriptors, its
    /// shared state page and this process's life page (`life`, when it has one; both used
    /// by the zero-copy path).
    fn answer(
        &self,
        ctx: &CtxShared,
        fd: RawFd,
        local: bool,
        peer: &PeerInfo,
        life: Option<RawFd>,
    ) -> Option<Arc<dyn TargetQp>> {
        let hello = match Hello::decode(&self.hello) {
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
        let challenge = &self.challenge;
        let status = match &qp {
            _ if !user_allowed => HelloStatus::PeerNotAllowed,
            // Answered as a wrong MAC (verified against a token no QP has, so that it takes
            // as long): a peer that cannot authenticate learns nothing of which QP numbers
            // exist.
            None => {
                let _ = hello.verify(challenge, &[0u8; TOKEN_LEN], psk);
                HelloStatus::AuthFailed
            }
            Some(q) if !hello.verify(challenge, &q.token(), psk) => HelloStatus::AuthFailed,
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
        send_whole(fd, &encode_hello_ack(status))?;
        let qp = qp.filter(|_| status == HelloStatus::Ok)?;
        if local {
            let mut info = [0u8; 8];
            info[..4].copy_from_slice(&qp.pd().to_le_bytes());
            let with_life;
            let fds: &[RawFd] = match life {
                Some(l) => {
                    with_life = [qp.state_fd(), l];
                    &with_life
                }
                None => &[qp.state_fd()][..],
            };
            let sent = shm::send_with_fds_nowait(fd, &info, fds).ok()?;
            (sent == info.len()).then_some(())?;
        }
        Some(qp)
    }
}
