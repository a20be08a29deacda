//! One registration request: what to register, its state and outcome, and the caller's
//! [`RegHandle`] to it (a future, a blocking wait, cancellation). A request is typed by the
//! owner of the region it yields ([`Alloc`] or [`Raw`]); the workers see it as a [`Job`].

use super::stats::inc;
use super::Shared;
use crate::fabric::{AccessFlags, Alloc, Mr, Pd, Raw};
use crate::mr::state::{RegState, StateCell};
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// What to register: `len` bytes with `access`, at `addr` for caller memory ([`Raw`]; the
/// address is unused for memory the region allocates, [`Alloc`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct RegionSpec {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) access: AccessFlags,
}

/// The owners a registrar's region can have: [`Alloc`] and [`Raw`] (sealed).
pub trait RegOwner: sealed::Register {}

impl RegOwner for Alloc {}
impl RegOwner for Raw {}

mod sealed {
    use super::*;

    /// How a worker makes a region of each owner.
    pub trait Register: Send + Sync + Sized + 'static {
        /// Registers `len` bytes with `access` on `pd` (at `addr` for caller memory): a
        /// worker thread's call.
        fn register(pd: &Pd, addr: usize, len: usize, access: AccessFlags) -> Result<Mr<Self>>;
    }
}

impl sealed::Register for Alloc {
    fn register(pd: &Pd, _addr: usize, len: usize, access: AccessFlags) -> Result<Mr<Alloc>> {
        Ok(pd.alloc_mr(len, access)?)
    }
}

impl sealed::Register for Raw {
    fn register(pd: &Pd, addr: usize, len: usize, access: AccessFlags) -> Result<Mr<Raw>> {
        // SAFETY: the submit_raw caller promised the range stays valid for the request's
        // lifetime and that of the region it yields.
        Ok(unsafe { pd.register_raw(addr as *mut u8, len, access) }?)
    }
}

pub(super) type Callback<O> = Box<dyn FnOnce(&Result<Mr<O>>) + Send>;

/// A request as the workers see it, whatever its owner type.
pub(super) trait Job: Send + Sync {
    /// Where it is.
    fn state(&self) -> &StateCell;
    /// Registers (with retries), and records and delivers the outcome.
    fn run(&self, s: &Shared);
    /// Ends it with `e` (it already reached a final state).
    fn finish_err(&self, e: Error);
}

pub(super) struct Request<O> {
    pub(super) state: StateCell,
    pub(super) spec: RegionSpec,
    pub(super) submitted: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) outcome: Mutex<Outcome<O>>,
    pub(super) done: Condvar,
    /// An owned buffer whose handle was dropped before the outcome was taken: kept until the
    /// request itself is gone. Last field: dropped after `outcome` (and any region in it).
    pub(super) keep: Mutex<Option<Box<dyn Send>>>,
}

pub(super) struct Outcome<O> {
    pub(super) result: Option<Result<Mr<O>>>,
    pub(super) taken: bool,
    pub(super) waker: Option<Waker>,
    pub(super) callback: Option<Callback<O>>,
}

impl<O> Outcome<O> {
    pub(super) fn new(callback: Option<Callback<O>>) -> Self {
        Self {
            result: None,
            taken: false,
            waker: None,
            callback,
        }
    }
}

impl<O> Request<O> {
    /// Stores the final result and wakes every kind of waiter.
    pub(super) fn finish(&self, result: Result<Mr<O>>) {
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
/// registration that completes anyway is deregistered. It resolves to an [`Mr`] of memory the
/// region allocated ([`Alloc`], from [`Registrar::submit`](super::Registrar::submit)) or of
/// caller memory ([`Raw`], from [`Registrar::submit_raw`](super::Registrar::submit_raw)).
pub struct RegHandle<O: RegOwner = Alloc> {
    pub(super) req: Arc<Request<O>>,
    pub(super) shared: Weak<Shared>,
}

impl<O: RegOwner> RegHandle<O> {
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

    fn take(o: &mut Outcome<O>) -> Option<Result<Mr<O>>> {
        if o.taken {
            return Some(Err(Error::OutcomeTaken));
        }
        let r = o.result.take()?;
        o.taken = true;
        Some(r)
    }

    /// Blocks until the request reaches a final state and returns its outcome.
    pub fn wait(&self) -> Result<Mr<O>> {
        let mut o = self.req.outcome.lock();
        loop {
            if let Some(r) = Self::take(&mut o) {
                return r;
            }
            self.req.done.wait(&mut o);
        }
    }
}

impl<O: RegOwner> RegHandle<O> {
    /// Keeps `b` alive until the request is gone (after its worker and its outcome).
    pub(in crate::mr) fn keep_until_done(&self, b: Box<dyn Send>) {
        *self.req.keep.lock() = Some(b);
    }
}

impl<O: RegOwner> Future for RegHandle<O> {
    type Output = Result<Mr<O>>;

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

impl<O: RegOwner> Drop for RegHandle<O> {
    fn drop(&mut self) {
        if !self.req.state.get().is_final() {
            self.cancel();
        }
    }
}
