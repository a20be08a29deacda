//! Non-blocking memory registration: [`Registrar::submit`] returns at once with a
//! [`RegHandle`]; worker threads do the pinning; the result arrives as a future (any
//! executor), a blocking [`RegHandle::wait`], and/or a callback.

mod owned;
mod request;
mod stats;
mod worker;

use super::state::StateCell;
use crate::fabric::{AccessFlags, Alloc, Mr, Pd, Raw, StableBuf};
use crate::{Error, Result};
pub use owned::OwnedRegHandle;
use parking_lot::{Condvar, Mutex};
use request::{Callback, Job, Outcome, RegionSpec, Request};
pub use request::{RegHandle, RegOwner};
use stats::{inc, Counters};
pub use stats::{LatencyClass, RegistrarStats, LATENCY_CLASSES};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

struct Shared {
    latency: Mutex<Vec<hdrhistogram::Histogram<u64>>>,
    pd: Pd,
    cfg: RegistrarConfig,
    queue: Mutex<VecDeque<Arc<dyn Job>>>,
    work: Condvar,
    shutdown: AtomicBool,
    broken: Mutex<Option<String>>,
    counters: Counters,
}

/// Registers memory on worker threads so callers never block on pinning.
///
/// ```
/// use rdmapool_pool::fabric::{AccessFlags, Context, RegisteredMemory, SoftConfig};
/// use rdmapool_pool::mr::{Registrar, RegistrarConfig, RegState};
/// # fn main() -> rdmapool_pool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
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
    /// Most worker threads a registrar starts: registration is bounded by the kernel's page
    /// pinning, not by threads, and each one costs a stack.
    pub const MAX_WORKERS: usize = 1024;

    /// Starts `cfg.workers` worker threads registering on `pd` (1..=[`Self::MAX_WORKERS`]).
    pub fn new(pd: Pd, cfg: RegistrarConfig) -> Result<Self> {
        if cfg.workers == 0 || cfg.workers > Self::MAX_WORKERS {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "registrar workers",
                value: cfg.workers as u64,
                min: 1,
                max: Self::MAX_WORKERS as u64,
            }));
        }
        let shared = Arc::new(Shared {
            latency: Mutex::new(stats::latency_histograms()),
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
                    worker::worker(&s)
                })
                .map_err(|e| {
                    Error::Core(crate::CoreError::Sys {
                        call: "spawn",
                        source: e,
                    })
                });
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    // Out of threads: stop the ones already started, then say so.
                    let partial = Self { shared, workers };
                    drop(partial);
                    return Err(e);
                }
            }
        }
        Ok(Self { shared, workers })
    }

    /// Submits a registration of `len` bytes that the region allocates (page aligned) and
    /// owns. Returns at once.
    pub fn submit(&self, len: usize, access: AccessFlags) -> RegHandle {
        self.enqueue(
            RegionSpec {
                addr: 0,
                len,
                access,
            },
            None,
        )
    }

    /// Like [`Registrar::submit`], and calls `callback` (on a worker thread, or on the
    /// cancelling thread) with the outcome when the request reaches a final state.
    pub fn submit_with(
        &self,
        len: usize,
        access: AccessFlags,
        callback: impl FnOnce(&Result<Mr<Alloc>>) + Send + 'static,
    ) -> RegHandle {
        self.enqueue(
            RegionSpec {
                addr: 0,
                len,
                access,
            },
            Some(Box::new(callback)),
        )
    }

    /// Submits a registration of caller memory.
    ///
    /// # Safety
    /// `[addr, addr+len)` must stay mapped, unmoved and unreused until the handle and any
    /// [`Mr`] obtained from it are dropped (the [`Pd::register_raw`] contract).
    pub unsafe fn submit_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> RegHandle<Raw> {
        self.enqueue(
            RegionSpec {
                addr: addr as usize,
                len,
                access,
            },
            None,
        )
    }

    /// Submits a registration of a buffer the caller owns, safely: the handle resolves to the
    /// registered buffer (an [`Mr<B>`](Mr)), or to the error with the buffer back. Dropping the handle
    /// early cancels the request; the buffer is freed only after the worker is done with it.
    ///
    /// ```
    /// use rdmapool_pool::fabric::{AccessFlags, Context, SoftConfig};
    /// use rdmapool_pool::mr::{Registrar, RegistrarConfig};
    /// # fn main() -> rdmapool_pool::Result<()> {
    /// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
    /// let registrar = Registrar::new(pd, RegistrarConfig::default())?;
    /// let handle = registrar.submit_owned(vec![0u8; 1 << 16], AccessFlags::LOCAL_WRITE);
    /// let reg = handle.wait()?;                  // or `.await`
    /// let buf: Vec<u8> = reg.into_inner();
    /// assert_eq!(buf.len(), 1 << 16);
    /// # Ok(()) }
    /// ```
    pub fn submit_owned<B: StableBuf>(&self, mut buf: B, access: AccessFlags) -> OwnedRegHandle<B> {
        let spec = RegionSpec {
            addr: buf.stable_ptr() as usize,
            len: buf.stable_len(),
            access,
        };
        OwnedRegHandle::new(self.enqueue(spec, None), buf)
    }

    fn enqueue<O: RegOwner>(
        &self,
        spec: RegionSpec,
        callback: Option<Callback<O>>,
    ) -> RegHandle<O> {
        let req = Arc::new(Request {
            state: StateCell::new(),
            spec,
            submitted: Instant::now(),
            deadline: self.shared.cfg.timeout.map(|t| Instant::now() + t),
            outcome: Mutex::new(Outcome::new(callback)),
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
            self.shared
                .queue
                .lock()
                .push_back(req.clone() as Arc<dyn Job>);
            self.shared.work.notify_one();
        }
        RegHandle {
            req,
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Why the device was marked broken (EIO/ENODEV during a registration), if it was.
    pub fn broken(&self) -> Option<String> {
        self.shared.broken.lock().clone()
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        // Set under the queue's lock: a worker checks the flag under it and then waits, so
        // a flag set (and notified) between its check and its wait would never wake it, and
        // this join would hang (seen: `rdma-tool monitor` stuck at exit in a CI run).
        {
            let _queue = self.shared.queue.lock();
            self.shared.shutdown.store(true, Ordering::Release);
        }
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // Anything still queued is cancelled (its waiters get Error::Cancelled).
        let left: Vec<_> = self.shared.queue.lock().drain(..).collect();
        for r in left {
            if r.state().cancel() {
                inc(&self.shared.counters.cancelled);
                self.shared
                    .pd
                    .recorder()
                    .registrar_event(crate::fabric::recorder::RegistrarEvent::Cancelled);
                r.finish_err(Error::Cancelled);
            }
        }
    }
}
