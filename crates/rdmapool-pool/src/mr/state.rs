//! The registration state machine: Idle → Posted → Completed | Failed, and Cancelled from
//! Idle or Posted. Every transition is one compare-and-swap, so exactly one of a racing
//! "complete" and "cancel" wins, and the loser knows it lost (a completion that loses to a
//! cancel deregisters what it registered). Checked exhaustively with loom
//! (`RUSTFLAGS="--cfg loom" cargo test -p rdmapool-pool --release --lib mr::state`).

use crate::loom::sync::atomic::{AtomicU8, Ordering};

/// Where a registration request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RegState {
    /// Created, not yet handed to a worker.
    Idle = 0,
    /// Queued or being registered by a worker.
    Posted = 1,
    /// Registered; the region is (or was) handed to the caller.
    Completed = 2,
    /// Registration failed; the error is handed to the caller.
    Failed = 3,
    /// Cancelled before completion; nothing is (or stays) registered.
    Cancelled = 4,
}

impl RegState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Idle,
            1 => Self::Posted,
            2 => Self::Completed,
            3 => Self::Failed,
            _ => Self::Cancelled,
        }
    }

    /// Whether no further transition can happen.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

/// An atomic [`RegState`] whose transitions are compare-and-swaps.
#[derive(Debug)]
pub(crate) struct StateCell(AtomicU8);

impl StateCell {
    pub(crate) fn new() -> Self {
        Self(AtomicU8::new(RegState::Idle as u8))
    }

    pub(crate) fn get(&self) -> RegState {
        RegState::from_u8(self.0.load(Ordering::Acquire))
    }

    fn cas(&self, from: RegState, to: RegState) -> bool {
        self.0
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Idle → Posted.
    pub(crate) fn post(&self) -> bool {
        self.cas(RegState::Idle, RegState::Posted)
    }

    /// Posted → Completed; false if a cancel got there first.
    pub(crate) fn complete(&self) -> bool {
        self.cas(RegState::Posted, RegState::Completed)
    }

    /// Posted → Failed; false if a cancel got there first.
    pub(crate) fn fail(&self) -> bool {
        self.cas(RegState::Posted, RegState::Failed)
    }

    /// Idle or Posted → Cancelled; false once the request has completed or failed.
    pub(crate) fn cancel(&self) -> bool {
        self.cas(RegState::Idle, RegState::Cancelled)
            || self.cas(RegState::Posted, RegState::Cancelled)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    /// A worker completing (or failing) races a caller cancelling: exactly one wins, and a
    /// completion that lost is undone (counted as deregistered) — never leaked.
    #[test]
    fn complete_and_cancel_race_has_exactly_one_winner() {
        for fail in [false, true] {
            loom::model(move || {
                let s = Arc::new(StateCell::new());
                assert!(s.post());
                let registered = Arc::new(AtomicUsize::new(0));
                let worker = {
                    let (s, registered) = (s.clone(), registered.clone());
                    loom::thread::spawn(move || {
                        if fail {
                            return s.fail(); // nothing was registered
                        }
                        registered.fetch_add(1, Ordering::SeqCst);
                        let won = s.complete();
                        if !won {
                            registered.fetch_sub(1, Ordering::SeqCst); // deregister
                        }
                        won
                    })
                };
                let cancelled = s.cancel();
                let worker_won = worker.join().unwrap();
                assert!(cancelled != worker_won, "exactly one side wins");
                let end = s.get();
                assert!(end.is_final());
                let expect = if cancelled {
                    RegState::Cancelled
                } else if fail {
                    RegState::Failed
                } else {
                    RegState::Completed
                };
                assert_eq!(end, expect);
                let live = registered.load(Ordering::SeqCst);
                assert_eq!(
                    live,
                    usize::from(end == RegState::Completed),
                    "nothing leaks"
                );
            });
        }
    }

    /// Two cancels and a completion: one cancel at most succeeds, and only if the
    /// completion did not.
    #[test]
    fn double_cancel_is_harmless() {
        loom::model(|| {
            let s = Arc::new(StateCell::new());
            assert!(s.post());
            let a = {
                let s = s.clone();
                loom::thread::spawn(move || s.cancel())
            };
            let b = {
                let s = s.clone();
                loom::thread::spawn(move || s.complete())
            };
            let c = s.cancel();
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            assert_eq!(usize::from(a) + usize::from(b) + usize::from(c), 1);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_machine() {
        let s = StateCell::new();
        assert!(!s.complete(), "cannot complete before posting");
        assert!(s.post());
        assert!(!s.post(), "posted once");
        assert!(s.complete());
        assert!(!s.cancel(), "cancel after completion is refused");
        assert_eq!(s.get(), RegState::Completed);
        let s = StateCell::new();
        assert!(s.cancel(), "cancel from Idle");
        assert!(!s.post(), "a cancelled request is never posted");
        assert_eq!(s.get(), RegState::Cancelled);
    }
}
