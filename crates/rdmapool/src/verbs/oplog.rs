//! What was posted last on each QP, so that an error completion reports the operation that
//! was posted: verbs leaves `ibv_wc.opcode` undefined when the status is not success (rxe
//! reports SEND for all of them, a failed RECV included).

use crate::fabric::WcOpcode;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;

/// The last `capacity` work requests posted to one queue: (wr_id, opcode), newest last.
struct Ring {
    entries: Vec<(u64, WcOpcode)>,
    next: usize,
    capacity: usize,
}

impl Ring {
    fn new(capacity: u32) -> Self {
        let capacity = capacity.max(1) as usize;
        Self {
            entries: Vec::with_capacity(capacity),
            next: 0,
            capacity,
        }
    }

    fn record(&mut self, wr_id: u64, opcode: WcOpcode) {
        if self.entries.len() < self.capacity {
            self.entries.push((wr_id, opcode));
        } else {
            self.entries[self.next] = (wr_id, opcode);
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// The opcode of the newest request with `wr_id`. A queue holds at most `capacity`
    /// outstanding requests, so an outstanding one is always still here.
    fn find(&self, wr_id: u64) -> Option<WcOpcode> {
        let n = self.entries.len();
        (1..=n)
            .map(|back| self.entries[(self.next + n - back) % n])
            .find(|&(id, _)| id == wr_id)
            .map(|(_, op)| op)
    }
}

/// One QP's log: its send and receive queues.
pub(crate) struct OpLog {
    send: Mutex<Ring>,
    recv: Mutex<Ring>,
}

impl OpLog {
    pub(crate) fn new(send_capacity: u32, recv_capacity: u32) -> Self {
        Self {
            send: Mutex::new(Ring::new(send_capacity)),
            recv: Mutex::new(Ring::new(recv_capacity)),
        }
    }

    /// Records send requests (before they are posted: a completion may beat the return).
    pub(crate) fn record_sends(&self, wrs: impl Iterator<Item = (u64, WcOpcode)>) {
        let mut ring = self.send.lock();
        for (id, op) in wrs {
            ring.record(id, op);
        }
    }

    /// Records receive requests.
    pub(crate) fn record_recvs(&self, ids: impl Iterator<Item = u64>) {
        let mut ring = self.recv.lock();
        for id in ids {
            ring.record(id, WcOpcode::Recv);
        }
    }

    /// The posted operation of an error completion with `wr_id`: a send request if one
    /// with that id is in the log, else a receive. (If the application uses one id on both
    /// queues at once, the send wins.)
    fn find(&self, wr_id: u64) -> Option<WcOpcode> {
        self.send
            .lock()
            .find(wr_id)
            .or_else(|| self.recv.lock().find(wr_id))
    }
}

/// The logs of a context's QPs, by QP number (read only on error completions).
#[derive(Default)]
pub(crate) struct OpLogs(RwLock<HashMap<u32, Arc<OpLog>>>);

impl OpLogs {
    pub(crate) fn insert(&self, qpn: u32, log: Arc<OpLog>) {
        self.0.write().insert(qpn, log);
    }

    pub(crate) fn remove(&self, qpn: u32) {
        self.0.write().remove(&qpn);
    }

    /// The posted operation behind an error completion of QP `qpn`.
    pub(crate) fn opcode(&self, qpn: u32, wr_id: u64) -> Option<WcOpcode> {
        self.0.read().get(&qpn).and_then(|l| l.find(wr_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_request_with_an_id_wins_and_old_ones_roll_off() {
        let log = OpLog::new(3, 2);
        log.record_sends([(1, WcOpcode::RdmaWrite), (2, WcOpcode::RdmaRead)].into_iter());
        log.record_recvs([7].into_iter());
        assert_eq!(log.find(2), Some(WcOpcode::RdmaRead));
        assert_eq!(log.find(7), Some(WcOpcode::Recv));
        log.record_sends([(1, WcOpcode::FetchAdd), (3, WcOpcode::Send)].into_iter());
        assert_eq!(log.find(1), Some(WcOpcode::FetchAdd), "newest first");
        log.record_sends([(4, WcOpcode::Send)].into_iter());
        assert_eq!(log.find(2), None, "rolled off");
        assert_eq!(log.find(9), None);
    }
}
