//! The intra-host path's decisions, without I/O: whether a one-sided operation may be executed
//! directly on the peer's mapped memory or must go through the socket, and when the peer
//! process is probed for liveness. The driver (`qp/send.rs`) owns the socket, the mappings
//! and the clock; it asks these questions with `now` and does what they answer.
//!
//! Rules:
//! - **RC order.** An operation goes direct only when nothing of this QP is on the wire (the
//!   requester is quiet and no response is half read): a direct operation must not overtake
//!   one still travelling through the socket.
//! - **Never wait in a post.** A target QP that is not yet ready to receive (RESET, INIT) is
//!   not waited for: the operation goes through the socket, where the responder stalls it
//!   until the target is ready or its time is up (the wire path's rule), and later operations
//!   follow it there (RC order) until the socket is quiet again. A target in ERR fails the
//!   operation at once with `RetryExcErr`, as the responder answers on the wire.
//! - **Liveness.** A peer process that died leaves its mappings readable, so the socket is
//!   probed, at most once per [`LIVENESS_INTERVAL`], before a direct operation. The times
//!   are the driver's coarse monotonic clock (read per operation: a few ns, not the ~25 of
//!   `Instant::now`), so with its tick of 1–4 ms the probe comes at most once per tick.

use crate::fabric::{QpState, WcStatus};
use std::time::Duration;

/// How often the direct path checks that the peer process is still there.
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(1);

/// Where an operation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Executed on the peer's mapped memory.
    Direct,
    /// Sent through the socket.
    Socket,
    /// Completed at once with this status, nothing sent.
    Fail(WcStatus),
}

/// A QP's intra-host path to one peer: when its liveness is next probed.
#[derive(Debug, Clone)]
pub struct LocalPath {
    /// The last probe plus [`LIVENESS_INTERVAL`] (compared, not subtracted, per operation),
    /// on a monotonic clock.
    next_probe: Duration,
}

impl LocalPath {
    /// A path opened at `now`, a monotonic time (the connection was just made: no probe is
    /// due yet).
    pub fn new(now: Duration) -> Self {
        Self {
            next_probe: now + LIVENESS_INTERVAL,
        }
    }

    /// Whether the socket should be probed now; if so, the probe counts as done at `now`.
    #[inline]
    pub fn probe_due(&mut self, now: Duration) -> bool {
        if now > self.next_probe {
            self.next_probe = now + LIVENESS_INTERVAL;
            true
        } else {
            false
        }
    }

    /// Whether an operation may go direct before anything else is looked at: `quiet` is
    /// nothing of this QP on the wire, `direct_op` an operation the path can carry (a WRITE
    /// without immediate, READ or atomic of at least one byte).
    pub fn may_go_direct(quiet: bool, direct_op: bool) -> bool {
        quiet && direct_op
    }

    /// The route for an operation that may go direct, by the target QP's state.
    pub fn route(target: QpState) -> Route {
        match target {
            QpState::Rtr | QpState::Rts => Route::Direct,
            QpState::Error => Route::Fail(WcStatus::RetryExcErr),
            // Not ready yet: the responder waits for it on the wire, not the post here.
            _ => Route::Socket,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_probed_at_most_once_per_interval_of_simulated_time() {
        let t0 = Duration::from_secs(1_000);
        let mut p = LocalPath::new(t0);
        assert!(!p.probe_due(t0));
        assert!(!p.probe_due(t0 + LIVENESS_INTERVAL));
        let t1 = t0 + LIVENESS_INTERVAL + Duration::from_nanos(1);
        assert!(p.probe_due(t1));
        assert!(!p.probe_due(t1), "probed once per interval");
        assert!(!p.probe_due(t1 + LIVENESS_INTERVAL / 2));
        assert!(p.probe_due(t1 + LIVENESS_INTERVAL * 2));
        // A clock that goes backwards (another thread's `now`) never makes a probe due.
        assert!(!p.probe_due(t0));
    }

    #[test]
    fn rc_order_keeps_an_operation_behind_the_socket_while_it_is_busy() {
        assert!(LocalPath::may_go_direct(true, true));
        assert!(
            !LocalPath::may_go_direct(false, true),
            "something on the wire"
        );
        assert!(
            !LocalPath::may_go_direct(true, false),
            "not a direct operation"
        );
    }

    #[test]
    fn a_target_not_ready_is_not_waited_for_and_one_in_error_fails_at_once() {
        assert_eq!(LocalPath::route(QpState::Rts), Route::Direct);
        assert_eq!(LocalPath::route(QpState::Rtr), Route::Direct);
        assert_eq!(LocalPath::route(QpState::Reset), Route::Socket);
        assert_eq!(LocalPath::route(QpState::Init), Route::Socket);
        assert_eq!(
            LocalPath::route(QpState::Error),
            Route::Fail(WcStatus::RetryExcErr)
        );
    }
}
