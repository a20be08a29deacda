//! What the responder works against: the QP it serves (its state, keys, receive queue,
//! receive completions), as a trait so the drivers and the test harness both provide it.

use crate::fabric::{Completion, QpState, WcStatus};
use crate::keys::{KeyTable, LocalList};
use crate::proto::handshake::TOKEN_LEN;
use std::time::Duration;

/// A posted receive, waiting for an incoming SEND or WRITE with immediate.
pub struct RecvEntry {
    pub wr_id: u64,
    /// The checked buffers, or the local error the receive completes with when consumed.
    pub local: Result<LocalList, WcStatus>,
    /// Bytes the buffers hold.
    pub capacity: u64,
}

/// What the responder needs of the QP it serves.
pub trait TargetQp: Send + Sync {
    /// Its number.
    fn qpn(&self) -> u32;
    /// Its protection domain.
    fn pd(&self) -> u32;
    /// Its state now.
    fn state(&self) -> QpState;
    /// How long a request waits for the QP to become ready (the peer's retries).
    fn timeout(&self) -> Duration;
    /// How long a SEND waits for a receive (the peer's RNR retries).
    fn rnr_timeout(&self) -> Duration;
    /// The key table of its context.
    fn keys(&self) -> &KeyTable;
    /// Takes the oldest posted receive.
    fn take_recv(&self) -> Option<RecvEntry>;
    /// Delivers a receive completion.
    fn complete_recv(&self, c: Completion);
    /// Moves the QP to ERR (a responder error does, as on rxe).
    fn enter_error(&self);
    /// The descriptor of its shared state page (the intra-host handshake passes it).
    fn state_fd(&self) -> std::os::fd::RawFd;
    /// The secret a connection to it must prove it knows (the hello's MAC key).
    fn token(&self) -> [u8; TOKEN_LEN];
    /// The QP it was bound to at RTR, once it is.
    fn peer_qpn(&self) -> Option<u32>;
    /// Takes its one incoming connection; `false` if it already has one.
    fn claim_incoming(&self) -> bool;
    /// Its peer's connection ended: an event the application can wait for.
    fn peer_lost(&self);
}
