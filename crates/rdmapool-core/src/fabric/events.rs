//! Asynchronous QP events: what happened to a QP that no work request reported.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Something that happened to a QP outside any work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpEvent {
    /// The peer's connection ended (it was destroyed, its process died, or the link broke).
    /// Like RDMA CM's `RDMA_CM_EVENT_DISCONNECTED`; `Qp::wait_event` moves the QP to ERR when
    /// it returns this, so posted receives flush.
    PeerDisconnected,
}

/// A QP's pending events, in order, with a way to wait for the next.
#[derive(Debug, Default)]
#[doc(hidden)]
pub struct EventQueue {
    queue: Mutex<VecDeque<QpEvent>>,
    ready: Condvar,
}

impl EventQueue {
    /// Adds an event and wakes a waiter.
    #[doc(hidden)]
    pub fn push(&self, e: QpEvent) {
        self.queue.lock().push_back(e);
        self.ready.notify_all();
    }

    /// The oldest pending event, waiting up to `timeout` for one.
    #[doc(hidden)]
    pub fn wait(&self, timeout: Duration) -> Option<QpEvent> {
        let until = Instant::now() + timeout;
        let mut q = self.queue.lock();
        loop {
            if let Some(e) = q.pop_front() {
                return Some(e);
            }
            if self.ready.wait_until(&mut q, until).timed_out() {
                return q.pop_front();
            }
        }
    }
}
