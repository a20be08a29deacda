//! The work requests each QP has outstanding, kept by the verbs provider for two things
//! verbs leaves to the application:
//! * the exact queue depth: a QP holds exactly the `max_send_wr`/`max_recv_wr` it was
//!   created with (rxe silently rounds a queue of 4 up to 7 and reports 4), so posting past
//!   it is [`crate::Error::QueueFull`] on every provider;
//! * the opcode of an error completion, which `ibv_wc.opcode` leaves undefined (rxe says
//!   SEND for all of them, a failed RECV included): the posted operation is reported.
//!
//! A request is outstanding from its post until a completion retires it: its own, or (for an
//! unsignaled send) that of a later signaled send, since RC completes a queue in order.

use crate::fabric::WcOpcode;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

#[derive(Clone, Copy)]
struct Entry {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
}

/// One queue's outstanding requests, oldest first.
pub(crate) struct Outstanding {
    entries: VecDeque<Entry>,
    capacity: usize,
}

impl Outstanding {
    fn new(capacity: u32) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity as usize),
            capacity: capacity as usize,
        }
    }

    /// Free entries.
    pub(crate) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.entries.len())
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn push(&mut self, wr_id: u64, opcode: WcOpcode, signaled: bool) {
        self.entries.push_back(Entry {
            wr_id,
            opcode,
            signaled,
        });
    }

    /// Forgets requests recorded but not posted (the device refused them).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.entries.truncate(len);
    }

    /// Retires everything up to and including the request a completion with `wr_id`
    /// reports: the oldest signaled one with that id for a success, the oldest with that id
    /// for an error (errors complete unsignaled requests too). Returns its opcode, or None
    /// (retiring nothing) if no such request is outstanding.
    fn retire(&mut self, wr_id: u64, success: bool) -> Option<WcOpcode> {
        let at = self
            .entries
            .iter()
            .position(|e| e.wr_id == wr_id && (e.signaled || !success))?;
        let opcode = self.entries[at].opcode;
        self.entries.drain(..=at);
        Some(opcode)
    }
}

/// One QP's send and receive queues.
pub(crate) struct WorkLog {
    send: Mutex<Outstanding>,
    recv: Mutex<Outstanding>,
}

impl WorkLog {
    pub(crate) fn new(send_capacity: u32, recv_capacity: u32) -> Self {
        Self {
            send: Mutex::new(Outstanding::new(send_capacity)),
            recv: Mutex::new(Outstanding::new(recv_capacity)),
        }
    }

    /// The send queue, locked: a post records and posts under it, so entries are in post
    /// order and the unposted tail can be dropped if the device refuses part of a list.
    pub(crate) fn send(&self) -> MutexGuard<'_, Outstanding> {
        self.send.lock()
    }

    /// The receive queue, locked (as [`WorkLog::send`]).
    pub(crate) fn recv(&self) -> MutexGuard<'_, Outstanding> {
        self.recv.lock()
    }

    /// Accounts for one completion. `success_opcode` is the completion's opcode when it
    /// succeeded (None for an error). Returns the posted operation's opcode for an error.
    pub(crate) fn complete(
        &self,
        wr_id: u64,
        success_opcode: Option<WcOpcode>,
    ) -> Option<WcOpcode> {
        match success_opcode {
            Some(WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) => {
                self.recv.lock().retire(wr_id, true);
                None
            }
            Some(_) => {
                self.send.lock().retire(wr_id, true);
                None
            }
            None => {
                let sent = self.send.lock().retire(wr_id, false);
                sent.or_else(|| self.recv.lock().retire(wr_id, false))
            }
        }
    }
}

/// The logs of a context's QPs, by QP number.
#[derive(Default)]
pub(crate) struct WorkLogs(RwLock<HashMap<u32, Arc<WorkLog>>>);

impl WorkLogs {
    pub(crate) fn insert(&self, qpn: u32, log: Arc<WorkLog>) {
        self.0.write().insert(qpn, log);
    }

    pub(crate) fn remove(&self, qpn: u32) {
        self.0.write().remove(&qpn);
    }

    pub(crate) fn get(&self, qpn: u32) -> Option<Arc<WorkLog>> {
        self.0.read().get(&qpn).cloned()
    }

    /// Live QPs (each has its log from creation to destruction).
    pub(crate) fn len(&self) -> usize {
        self.0.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_retire_in_order_and_errors_name_the_posted_operation() {
        let log = WorkLog::new(4, 2);
        {
            let mut sq = log.send();
            sq.push(1, WcOpcode::RdmaWrite, false);
            sq.push(1, WcOpcode::RdmaWrite, false);
            sq.push(1, WcOpcode::RdmaRead, true); // a batch: one id, the last signaled
            sq.push(2, WcOpcode::FetchAdd, true);
            assert_eq!(sq.room(), 0);
        }
        log.recv().push(7, WcOpcode::Recv, true);
        // The batch's one completion retires all three of its requests.
        assert_eq!(log.complete(1, Some(WcOpcode::RdmaRead)), None);
        assert_eq!(log.send().len(), 1);
        // An error names the posted operation; an unknown id retires nothing.
        assert_eq!(log.complete(9, None), None);
        assert_eq!(log.complete(2, None), Some(WcOpcode::FetchAdd));
        assert_eq!(log.complete(7, None), Some(WcOpcode::Recv));
        assert_eq!((log.send().len(), log.recv().len()), (0, 0));
        // A success for an id that is outstanding only unsignaled retires nothing.
        log.send().push(3, WcOpcode::Send, false);
        assert_eq!(log.complete(3, Some(WcOpcode::Send)), None);
        assert_eq!(log.send().len(), 1);
        log.send().truncate(0);
        assert_eq!(log.send().room(), 4);
    }
}
