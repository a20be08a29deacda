//! Non-blocking memory registration: [`Registrar::submit`] returns at once with a
//! [`RegHandle`]; worker threads do the pinning; the result arrives as a future (any
//! executor), a blocking [`RegHandle::wait`], and/or a callback.

use super::owned::OwnedRegHandle;
use super::state::{RegState, StateCell};
use crate::fabric::{AccessFlags, Mr, Pd, StableBuf};
use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Bounded exponential backoff for retryable failures (ENOMEM, EAGAIN).
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry; doubled each time.
    pub initial_delay: Duration,
    /// Longest delay between retries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 5,
            initial_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(100),
        }
    }
}

/// How a [`Registrar`] works.
#[derive(Debug, Clone)]
pub struct RegistrarConfig {
    /// Worker threads doing registrations.
    pub workers: usize,
    /// Retries for ENOMEM/EAGAIN.
    pub retry: RetryPolicy,
    /// A request not finished this long after submission fails with [`Error::TimedOut`].
    pub timeout: Option<Duration>,
}

impl Default for RegistrarConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            retry: RetryPolicy::default(),
            timeout: None,
        }
    }
}

/// What to register.
#[derive(Debug, Clone, Copy)]
enum RegionSpec {
    /// Memory the region allocates and owns.
    Alloc { len: usize, access: AccessFlags },
    /// Caller memory (see [`Registrar::submit_raw`]).
    Raw {
        addr: usize,
        len: usize,
        access: AccessFlags,
    },
}

/// Counters of everything a registrar did (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistrarStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Registrations handed to callers.
    pub completed: u64,
    /// Requests that failed (any reason but cancellation).
    pub failed: u64,
    /// Requests cancelled before completion.
    pub cancelled: u64,
    /// Retries made after ENOMEM/EAGAIN.
    pub retries: u64,
    /// Registrations that finished after their request was cancelled, and were undone.
    pub undone_after_cancel: u64,
    /// Requests that hit their timeout.
    pub timed_out: u64,
}

#[derive(Default)]
struct Counters {
    submitted: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    retries: AtomicU64,
    undone_after_cancel: AtomicU64,
    timed_out: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

type Callback = Box<dyn FnOnce(&Result<Mr>) + Send>;

struct Request {
    state: StateCell,
    spec: RegionSpec,
    submitted: Instant,
    deadline: Option<Instant>,
    outcome: Mutex<Outcome>,
    done: Condvar,
    /// An owned buffer whose handle was dropped before the outcome was taken: kept until the
    /// request itself is gone. Last field: dropped after `outcome` (and any region in it).
    keep: Mutex<Option<Box<dyn Send>>>,
}

#[derive(Default)]
struct Outcome {
    result: Option<Result<Mr>>,
    taken: bool,
    waker: Option<Waker>,
    callback: Option<Callback>,
}

impl Request {
    /// Stores the final result and wakes every kind of waiter.
    fn finish(&self, result: Result<Mr>) {
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

/// Upper bounds (bytes) of the size classes registration latency is recorded by.
pub const LATENCY_CLASSES: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, u64::MAX];

/// Registration latency (submission to completion) of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyClass {
    /// Largest region size in the class, bytes (`u64::MAX`: the rest).
    pub up_to: u64,
    /// Registrations recorded.
    pub count: u64,
    /// Median, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Maximum, ns.
    pub max_ns: u64,
}

fn spec_len(spec: RegionSpec) -> u64 {
    match spec {
        RegionSpec::Alloc { len, .. } | RegionSpec::Raw { len, .. } => len as u64,
    }
}

struct Shared {
    latency: Mutex<Vec<hdrhistogram::Histogram<u64>>>,
    pd: Pd,
    cfg: RegistrarConfig,
    queue: Mutex<VecDeque<Arc<Request>>>,
    work: Condvar,
    shutdown: AtomicBool,
    broken: Mutex<Option<String>>,
    counters: Counters,
}

/// Registers memory on worker threads so callers never block on pinning.
///
/// ```
/// use rdmapool::fabric::{AccessFlags, Context, RegisteredMemory};
/// use rdmapool::mr::{Registrar, RegistrarConfig, RegState};
/// # fn main() -> rdmapool::Result<()> {
/// let pd = Context::open_soft()?.alloc_pd()?;
/// let reg = Registrar::new(pd, RegistrarConfig::default())?;
/// let handle = reg.submit(1 << 20, AccessFlags::all_remote());   // returns at once
/// let mr = handle.wait()?;                                       // or `.await`
/// assert_eq!(mr.len(), 1 << 20);
/// # Ok(()) }
/// ```
pub struct Registrar {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Registrar {
    /// Starts `cfg.workers` worker threads registering on `pd`.
    pub fn new(pd: Pd, cfg: RegistrarConfig) -> Result<Self> {
        if cfg.workers == 0 {
            return Err(Error::InvalidArgument(
                "a registrar needs at least one worker".into(),
            ));
        }
        let shared = Arc::new(Shared {
            latency: Mutex::new(
                LATENCY_CLASSES
                    .iter()
                    .map(|_| {
                        hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                            .expect("valid bounds")
                    })
                    .collect(),
            ),
            pd,
            cfg: cfg.clone(),
            queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            shutdown: AtomicBool::new(false),
            broken: Mutex::new(None),
            counters: Counters::default(),
        });
        let mut workers = Vec::with_capacity(cfg.workers);
        for i in 0..cfg.workers {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("rdmapool-reg-{i}"))
                .spawn(move || {
                    // Registration is background work: a lower priority keeps a worker that
                    // was just woken from preempting the thread that submitted (on few cores
                    // that otherwise shows up as milliseconds of caller blocking).
                    // SAFETY: setpriority on this thread's own id.
                    unsafe {
                        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10)
                    };
                    worker(&s)
                })
                .map_err(|e| Error::Sys {
                    call: "spawn",
                    source: e,
                })?;
            workers.push(h);
        }
        Ok(Self { shared, workers })
    }

    /// Submits a registration of `len` bytes that the region allocates (page aligned) and
    /// owns. Returns at once.
    pub fn submit(&self, len: usize, access: AccessFlags) -> RegHandle {
        self.enqueue(RegionSpec::Alloc { len, access }, None)
    }

    /// Like [`Registrar::submit`], and calls `callback` (on a worker thread, or on the
    /// cancelling thread) with the outcome when the request reaches a final state.
    pub fn submit_with(
        &self,
        len: usize,
        access: AccessFlags,
        callback: impl FnOnce(&Result<Mr>) + Send + 'static,
    ) -> RegHandle {
        self.enqueue(RegionSpec::Alloc { len, access }, Some(Box::new(callback)))
    }

    /// Submits a registration of caller memory.
    ///
    /// # Safety
    /// `[addr, addr+len)` must stay mapped, unmoved and unreused until the handle and any
    /// [`Mr`] obtained from it are dropped (the [`Pd::register_raw`] contract).
    pub unsafe fn submit_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> RegHandle {
        self.enqueue(
            RegionSpec::Raw {
                addr: addr as usize,
                len,
                access,
            },
            None,
        )
    }

    /// Submits a registration of a buffer the caller owns, safely: the handle resolves to a
    /// [`crate::fabric::Registered`] buffer, or to the error with the buffer back. Dropping the handle
    /// early cancels the request; the buffer is freed only after the worker is done with it.
    ///
    /// ```
    /// use rdmapool::fabric::{AccessFlags, Context};
    /// use rdmapool::mr::{Registrar, RegistrarConfig};
    /// # fn main() -> rdmapool::Result<()> {
    /// let registrar = Registrar::new(Context::open_soft()?.alloc_pd()?, RegistrarConfig::default())?;
    /// let handle = registrar.submit_owned(vec![0u8; 1 << 16], AccessFlags::LOCAL_WRITE);
    /// let reg = handle.wait()?;                  // or `.await`
    /// let buf: Vec<u8> = reg.into_inner();
    /// assert_eq!(buf.len(), 1 << 16);
    /// # Ok(()) }
    /// ```
    pub fn submit_owned<B: StableBuf>(&self, mut buf: B, access: AccessFlags) -> OwnedRegHandle<B> {
        let spec = RegionSpec::Raw {
            addr: buf.stable_ptr() as usize,
            len: buf.stable_len(),
            access,
        };
        OwnedRegHandle::new(self.enqueue(spec, None), buf)
    }

    fn enqueue(&self, spec: RegionSpec, callback: Option<Callback>) -> RegHandle {
        let req = Arc::new(Request {
            state: StateCell::new(),
            spec,
            submitted: Instant::now(),
            deadline: self.shared.cfg.timeout.map(|t| Instant::now() + t),
            outcome: Mutex::new(Outcome {
                callback,
                ..Outcome::default()
            }),
            done: Condvar::new(),
            keep: Mutex::new(None),
        });
        inc(&self.shared.counters.submitted);
        if let Some(reason) = self.shared.broken.lock().clone() {
            req.state.post();
            req.state.fail();
            inc(&self.shared.counters.failed);
            req.finish(Err(Error::DeviceBroken(reason)));
        } else {
            req.state.post();
            self.shared.queue.lock().push_back(req.clone());
            self.shared.work.notify_one();
        }
        RegHandle {
            req,
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> RegistrarStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RegistrarStats {
            submitted: g(&c.submitted),
            completed: g(&c.completed),
            failed: g(&c.failed),
            cancelled: g(&c.cancelled),
            retries: g(&c.retries),
            undone_after_cancel: g(&c.undone_after_cancel),
            timed_out: g(&c.timed_out),
        }
    }

    /// Registration latency per size class ([`LATENCY_CLASSES`]), for classes that saw any.
    pub fn latency(&self) -> Vec<LatencyClass> {
        let h = self.shared.latency.lock();
        LATENCY_CLASSES
            .iter()
            .zip(h.iter())
            .filter(|(_, h)| !h.is_empty())
            .map(|(&up_to, h)| LatencyClass {
                up_to,
                count: h.len(),
                p50_ns: h.value_at_quantile(0.5),
                p99_ns: h.value_at_quantile(0.99),
                max_ns: h.max(),
            })
            .collect()
    }

    /// Why the device was marked broken (EIO/ENODEV during a registration), if it was.
    pub fn broken(&self) -> Option<String> {
        self.shared.broken.lock().clone()
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // Anything still queued is cancelled (its waiters get Error::Cancelled).
        let left: Vec<_> = self.shared.queue.lock().drain(..).collect();
        for r in left {
            if r.state.cancel() {
                inc(&self.shared.counters.cancelled);
                r.finish(Err(Error::Cancelled));
            }
        }
    }
}

enum Class {
    Retry,
    Broken,
    Fatal,
}

fn classify(e: &Error) -> Class {
    let errno = match e {
        Error::MemlockLimit { errno, .. } => Some(*errno),
        Error::Sys { source, .. } => source.raw_os_error(),
        _ => None,
    };
    match errno {
        Some(libc::ENOMEM | libc::EAGAIN) => Class::Retry,
        Some(libc::EIO | libc::ENODEV | libc::ENXIO) => Class::Broken,
        _ => Class::Fatal,
    }
}

fn register(pd: &Pd, spec: RegionSpec) -> Result<Mr> {
    match spec {
        RegionSpec::Alloc { len, access } => pd.alloc_mr(len, access),
        // SAFETY: the submit_raw caller promised the range stays valid for the request's
        // lifetime and that of the region it yields.
        RegionSpec::Raw { addr, len, access } => unsafe {
            pd.register_raw(addr as *mut u8, len, access)
        },
    }
}

fn worker(s: &Shared) {
    loop {
        let req = {
            let mut q = s.queue.lock();
            loop {
                if s.shutdown.load(Ordering::Acquire) {
                    return;
                }
                if let Some(r) = q.pop_front() {
                    break r;
                }
                s.work.wait(&mut q);
            }
        };
        if req.state.get() != RegState::Posted {
            continue; // cancelled while queued
        }
        let result = attempt(s, &req);
        match result {
            Ok(mr) => {
                if req.state.complete() {
                    inc(&s.counters.completed);
                    let len = spec_len(req.spec);
                    let class = LATENCY_CLASSES
                        .iter()
                        .position(|&c| len <= c)
                        .unwrap_or(LATENCY_CLASSES.len() - 1);
                    let ns = req.submitted.elapsed().as_nanos().max(1) as u64;
                    s.latency.lock()[class].saturating_record(ns);
                    req.finish(Ok(mr));
                } else {
                    inc(&s.counters.undone_after_cancel);
                    drop(mr); // cancelled meanwhile: deregister, never leak
                }
            }
            Err(e) => {
                if req.state.fail() {
                    inc(&s.counters.failed);
                    req.finish(Err(e));
                }
            }
        }
    }
}

/// Registers with retries by error class, honouring cancellation and the deadline.
fn attempt(s: &Shared, req: &Request) -> Result<Mr> {
    let mut delay = s.cfg.retry.initial_delay;
    let mut retries = 0;
    loop {
        if let Some(reason) = s.broken.lock().clone() {
            return Err(Error::DeviceBroken(reason));
        }
        if req.deadline.is_some_and(|d| Instant::now() >= d) {
            inc(&s.counters.timed_out);
            return Err(Error::TimedOut("registration".into()));
        }
        let e = match register(&s.pd, req.spec) {
            Ok(mr) => return Ok(mr),
            Err(e) => e,
        };
        match classify(&e) {
            Class::Fatal => return Err(e),
            Class::Broken => {
                let reason = e.to_string();
                *s.broken.lock() = Some(reason.clone());
                fail_all_queued(s, &reason);
                return Err(Error::DeviceBroken(reason));
            }
            Class::Retry if retries >= s.cfg.retry.max_retries => return Err(e),
            Class::Retry => {
                retries += 1;
                inc(&s.counters.retries);
                let mut wait = delay;
                if let Some(d) = req.deadline {
                    wait = wait.min(d.saturating_duration_since(Instant::now()));
                }
                std::thread::sleep(wait);
                delay = (delay * 2).min(s.cfg.retry.max_delay);
                if req.state.get() != RegState::Posted {
                    return Err(Error::Cancelled);
                }
            }
        }
    }
}

fn fail_all_queued(s: &Shared, reason: &str) {
    let left: Vec<_> = s.queue.lock().drain(..).collect();
    for r in left {
        if r.state.fail() {
            inc(&s.counters.failed);
            r.finish(Err(Error::DeviceBroken(reason.to_string())));
        }
    }
}

/// A submitted registration: poll it as a future, [`wait`](RegHandle::wait) for it, or
/// [`cancel`](RegHandle::cancel) it. Dropping an unfinished handle cancels the request; a
/// registration that completes anyway is deregistered.
pub struct RegHandle {
    req: Arc<Request>,
    shared: Weak<Shared>,
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
    pub(super) fn keep_until_done(&self, b: Box<dyn Send>) {
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
