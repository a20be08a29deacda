//! The target QP a `soft_responder` run serves: its number, PD, state, the real key table
//! of its context, a receive queue and the receive completions it delivered.

use crate::fabric::{Completion, QpState};
use crate::soft::keys::KeyTable;
use crate::soft::proto::target::{RecvEntry, TargetQp};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;

pub(super) const QPN: u32 = 2;
pub(super) const PD: u32 = 1;

/// The QP the responder serves: real keys, a receive queue, its completions, a state.
pub(super) struct Target {
    pub(super) keys: KeyTable,
    pub(super) state: Mutex<QpState>,
    pub(super) rq: Mutex<VecDeque<RecvEntry>>,
    pub(super) completions: Mutex<Vec<Completion>>,
}

impl TargetQp for Target {
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
        Duration::from_secs(4)
    }
    fn rnr_timeout(&self) -> Duration {
        Duration::from_secs(1)
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
    fn token(&self) -> [u8; crate::soft::proto::handshake::TOKEN_LEN] {
        [0; crate::soft::proto::handshake::TOKEN_LEN]
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

impl Target {
    pub(super) fn new() -> Self {
        Self {
            keys: KeyTable::default(),
            state: Mutex::new(QpState::Rts),
            rq: Mutex::new(VecDeque::new()),
            completions: Mutex::new(Vec::new()),
        }
    }
}
