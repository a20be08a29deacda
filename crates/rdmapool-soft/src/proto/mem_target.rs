//! An in-memory target QP for driving the responder without a NIC: its number, PD, state,
//! a real key table, a receive queue and the receive completions it delivered. The protocol
//! tests (`tests/harness.rs`) and the `soft_responder` fuzz target both serve it.

use super::target::{RecvEntry, TargetQp};
use crate::fabric::{Completion, QpState};
use crate::keys::KeyTable;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;

/// Its QP number.
pub const QPN: u32 = 2;
/// Its protection domain.
pub const PD: u32 = 1;
/// Its retry timeout.
pub const TIMEOUT: Duration = Duration::from_secs(4);
/// Its RNR timeout.
pub const RNR: Duration = Duration::from_secs(1);

/// The QP the responder serves: real keys, a receive queue, its completions, a state.
pub struct MemTarget {
    pub keys: KeyTable,
    pub state: Mutex<QpState>,
    pub rq: Mutex<VecDeque<RecvEntry>>,
    pub completions: Mutex<Vec<Completion>>,
}

impl TargetQp for MemTarget {
    fn qpn(&self) -> u32 {
        QPN
    }
    fn pd(&self) -> u32 {
        PD
    }
    fn state(&self) -> QpState {
        *self.state.lock()
    }
    fn timeout(&self) -> Duration {
        TIMEOUT
    }
    fn rnr_timeout(&self) -> Duration {
        RNR
    }
    fn keys(&self) -> &KeyTable {
        &self.keys
    }
    fn take_recv(&self) -> Option<RecvEntry> {
        self.rq.lock().pop_front()
    }
    fn complete_recv(&self, c: Completion) {
        self.completions.lock().push(c);
    }
    fn enter_error(&self) {
        *self.state.lock() = QpState::Error;
    }
    fn state_fd(&self) -> std::os::fd::RawFd {
        -1
    }
    fn token(&self) -> [u8; crate::proto::handshake::TOKEN_LEN] {
        [0; crate::proto::handshake::TOKEN_LEN]
    }
    fn peer_qpn(&self) -> Option<u32> {
        None
    }
    fn claim_incoming(&self) -> bool {
        true
    }
    fn peer_lost(&self) {
        self.enter_error();
    }
}

// Public only for the fuzz targets, which make each one with `new`.
#[allow(clippy::new_without_default)]
impl MemTarget {
    /// In RTS, with no keys and nothing to receive into.
    pub fn new() -> Self {
        Self {
            keys: KeyTable::default(),
            state: Mutex::new(QpState::Rts),
            rq: Mutex::new(VecDeque::new()),
            completions: Mutex::new(Vec::new()),
        }
    }
}
