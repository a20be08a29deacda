//! One registration request: what to register, its state and outcome, and the caller's
//! [`RegHandle`] to it (a future, a blocking wait, cancellation).

use super::stats::inc;
use super::Shared;
use crate::fabric::{AccessFlags, Mr};
use crate::mr::state::{RegState, StateCell};
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// What to register.
#[derive(Debug, Clone, Copy)]
pub(super) enum RegionSpec {
    /// Memory the region allocates and owns.
    Alloc { len: usize, access: AccessFlags },
    /// Caller memory (see [`Registrar::submit_raw`](super::Registrar::submit_raw)).
    Raw {
        addr: usize,
        len: usize,
        access: AccessFlags,
    },
}

pub(super) fn spec_len(spec: RegionSpec) -> u64 {
    match spec {
        RegionSpec::Alloc { len, .. } | RegionSpec::Raw { len, .. } => len as u64,
    }
}

pub(super) type Callback = Box<dyn FnOnce(&Result<Mr>) + Send>;

pub(super) struct Request {
    pub(super) state: StateCell,
    pub(super) spec: RegionSpec,
    pub(super) submitted: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) outcome: Mutex<Outcome>,
    pub(super) done: Condvar,
    /// An owned buffer whose handle was dropped before the outcome was taken: kept until the
    /// request itself is gone. Last field: dropped after `outcome` (and any region in it).
    pub(super) keep: Mutex<Option<Box<dyn Send>>>,
}

#[derive(Default)]
pub(super) struct Outcome {
    pub(super) result: Option<Result<Mr>>,
    pub(super) taken: bool,
    pub(super) waker: Option<Waker>,
    pub(super) callback: Option<Callback>,
}

impl Request {
    /// Stores the final result and wakes every kind of waiter.
    pub(super) fn finish(&self, result: Result<Mr>) {
        // The callback runs without the lock held, so it may use the handle freely.
        let callback = self.outcome.lock().callback.take();
        if let Some(cb) = callback {
            cb(&result);
        }
        let mut o = self.outcome.lock();
        o.result = Some(result);
        if let Some(w) = o.waker.take() {
            w.wake();
        }
        self.done.notify_all();
    }
}

/// A submitted registration: poll it as a future, [`wait`](RegHandle::wait) for it, or
/// [`cancel`](RegHandle::cancel) it. Dropping an unfinished handle cancels the request; a
/// registration that completes anyway is deregistered.
pub struct RegHandle {
    pub(super) req: Arc<Request>,
    pub(super) shared: Weak<Shared>,
}

impl RegHandle {
    /// Where the request is now.
    pub fn state(&self) -> RegState {
        self.req.state.get()
    }

    /// Cancels the request. True if it was cancelled; false if it had already completed or
    /// failed (then the outcome stays available).
    pub fn cancel(&self) -> bool {
        if !self.req.state.cancel() {
            return false;
        }
        if let Some(s) = self.shared.upgrade() {
            inc(&s.counters.cancelled);
            s.pd.recorder()
                .registrar_event(crate::fabric::recorder::RegistrarEvent::Cancelled);
        }
        self.req.finish(Err(Error::Cancelled));
        true
    }

    fn take(o: &mut Outcome) -> Option<Result<Mr>> {
        if o.taken {
            return Some(Err(Error::InvalidArgument(
                "the registration's outcome was already taken".into(),
            )));
        }
        let r = o.result.take()?;
        o.taken = true;
        Some(r)
    }

    /// Blocks until the request reaches a final state and returns its outcome.
    pub fn wait(&self) -> Result<Mr> {
        let mut o = self.req.outcome.lock();
        loop {
            if let Some(r) = Self::take(&mut o) {
                return r;
            }
            self.req.done.wait(&mut o);
        }
    }
}

impl RegHandle {
    /// Keeps `b` alive until the request is gone (after its worker and its outcome).
    pub(in crate::mr) fn keep_until_done(&self, b: Box<dyn Send>) {
        *self.req.keep.lock() = Some(b);
    }
}

impl Future for RegHandle {
    type Output = Result<Mr>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut o = self.req.outcome.lock();
        match Self::take(&mut o) {
            Some(r) => Poll::Ready(r),
            None => {
                o.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for RegHandle {
    fn drop(&mut self) {
        if !self.req.state.get().is_final() {
            self.cancel();
        }
    }
}
