//! The progress engine: configuration, counters and the [`Engine`] handle. The parts live
//! next to it: the slot table (`slots`), the operation future (`future`), the async QP
//! (`async_qp`), who polls the CQs (`drivers`) and how a caller-driven wait spins, then
//! sleeps (`caller`); QP placement is [`super::CqPool`].

mod async_qp;
mod caller;
mod drivers;
mod future;
mod qp_shared;
pub(crate) mod slots;

pub use async_qp::{AsyncQp, WindowBinding};
pub use future::{OpCompletion, OpFuture};

use super::placement::{Assignment, CqPool};
use crate::fabric::{Completion, Cq, Pd, Qp, QpConfig};
use crate::util::spin::PollPause;
use crate::{Error, Result};
use drivers::Progressors;
use qp_shared::QpShared;
use slots::{SlotTable, ANY_SOURCE};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How completions reach the futures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// One busy-polling thread per CQ (it naps 50 µs after ~2000 empty polls). Lowest
    /// latency; burns a core per CQ while there is traffic.
    BusyPoll,
    /// Nobody polls but the caller, through [`Engine::progress`] or
    /// [`Engine::run_until`], which polls while a completion is plausibly near (an
    /// adaptive budget, [`EngineConfig::spin`] at most) and then sleeps on the CQs'
    /// completion channels.
    Caller,
    /// Event-driven: one tokio task per CQ waits on the completion channel (`AsyncFd`),
    /// then acknowledges, re-arms and drains until the channel would block. Needs a tokio
    /// runtime with I/O and time enabled when the engine is created.
    Event,
}

/// How the engine progresses.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Operations in flight at once (the slot table).
    pub slots: usize,
    /// Who polls the CQs.
    pub progress: Progress,
    /// How [`Engine::create_qp`] picks a CQ.
    pub assignment: Assignment,
    /// How long a future that is the engine's only operation in flight polls its CQ for
    /// its own completion before it parks (zero: never). Waking a parked thread costs more
    /// than a round trip on fast paths; with more operations in flight one wake-up serves
    /// many, and futures park at once. With [`Progress::Caller`], the longest a
    /// [`Engine::run_until`] polls before it sleeps on the completion channels (less after
    /// polls that ran out: the budget adapts, see `cq/engine/caller.rs`).
    pub spin: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            slots: 4096,
            progress: Progress::BusyPoll,
            assignment: Assignment::RoundRobin,
            spin: Duration::from_micros(50),
        }
    }
}

/// Counters of an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Operations posted and not finished (including abandoned ones).
    pub in_flight: usize,
    /// Completions dispatched.
    pub completions: u64,
    /// CQs that overran (their QPs' operations failed with [`CoreError::CqOverrun`](crate::CoreError::CqOverrun)).
    pub overruns: u64,
    /// Wake-ups by the completion channel: of the event tasks (event-driven mode), or of
    /// [`Engine::run_until`]'s sleeps (caller-driven).
    pub wakeups: u64,
    /// Caller-driven: how long a wait polls now before it sleeps on the completion
    /// channels (adaptive, [`EngineConfig::spin`] at most; zero otherwise).
    pub caller_spin: Duration,
}

/// What the engine's handles, QPs and progress drivers share.
struct Shared {
    table: SlotTable<QpShared>,
    /// The engine's CQs (a slot's source is an index into them) and their placement.
    pool: CqPool,
    /// CQs that overran: their QPs fail.
    broken: Vec<AtomicBool>,
    stop: AtomicBool,
    completions: AtomicU64,
    overruns: AtomicU64,
    wakeups: AtomicU64,
    /// See [`EngineConfig::spin`].
    spin: Duration,
    /// Completions reach the futures through completion channels ([`Progress::Event`]).
    event_driven: bool,
    /// Event mode: per CQ, whether a notification request is outstanding (its next
    /// completion raises an event). Armed lazily, only for someone who waits: a future
    /// that parks, a spinner leaving others in flight, a future dropped in flight, or the
    /// event loop when operations are in flight and nobody spins. A future that catches its
    /// own completion costs no event, no wake-up of the loop and no re-arm.
    armed: Vec<AtomicBool>,
    /// A busy-polling thread drives every CQ ([`Progress::BusyPoll`]).
    thread_polled: bool,
    /// Futures polling the CQs for their own completion right now (event mode: the event
    /// loop arms no CQ for them; busy-poll mode: the threads leave the CQs to them).
    spinners: AtomicUsize,
    /// Caller-driven progress: nobody else polls the CQs, so [`Engine::run_until`] sleeps
    /// on their channels once its spin budget ran out.
    caller_driven: bool,
    /// The spin budget of [`Engine::run_until`]'s waits (caller-driven), and its value in
    /// nanoseconds for the futures' own spins to read without a lock.
    caller_spin: parking_lot::Mutex<crate::util::spin::AdaptiveSpin>,
    caller_spin_ns: AtomicU64,
}

/// A spinner counted by [`Shared::keep_threads_off`], uncounted when dropped (a panic in
/// between must not keep the threads off for good).
struct SpinnerGuard<'a>(&'a AtomicUsize);

impl Drop for SpinnerGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    /// How long a future that is the only operation in flight spins before it parks: the
    /// configured [`EngineConfig::spin`], or, caller-driven, the adaptive budget
    /// (`caller.rs`).
    #[inline]
    fn future_spin(&self) -> Duration {
        if self.caller_driven {
            Duration::from_nanos(self.caller_spin_ns.load(Ordering::Relaxed))
        } else {
            self.spin
        }
    }

    #[inline]
    fn cq(&self, i: usize) -> &Cq {
        &self.pool.cqs()[i]
    }

    /// Under busy-polling threads, counts the caller as a spinner until the guard drops:
    /// while every operation in flight is looked for by its own future, the threads keep
    /// off the CQs (polling them too would only pull their lines across cores). Nothing in
    /// the other modes.
    #[inline]
    fn keep_threads_off(&self) -> Option<SpinnerGuard<'_>> {
        self.thread_polled.then(|| {
            self.spinners.fetch_add(1, Ordering::AcqRel);
            SpinnerGuard(&self.spinners)
        })
    }

    #[inline]
    fn poll_once(&self, cq: usize, buf: &mut [Completion]) -> usize {
        match self.table.poll_source(self.cq(cq), buf) {
            Ok(n) => {
                if n > 0 {
                    self.completions.fetch_add(n as u64, Ordering::Relaxed);
                }
                n
            }
            Err(Error::Core(crate::CoreError::CqOverrun { depth })) => {
                if !self.broken[cq].swap(true, Ordering::AcqRel) {
                    self.overruns.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(cq, depth, "completion queue overrun: failing its QPs");
                }
                // Again on every poll: a wrapped QP (CQ unknown) can still post onto it.
                self.table.fail_source(cq, depth);
                0
            }
            Err(e) => {
                tracing::error!("completion queue failed: {e}");
                0
            }
        }
    }

    /// Polls once, and dispatches, the CQ an operation's completion comes on: `source`, or
    /// every CQ for [`ANY_SOURCE`] (a wrapped QP's).
    #[inline]
    fn poll_source_of(&self, source: usize, buf: &mut [Completion]) {
        if source == ANY_SOURCE {
            for cq in 0..self.pool.cqs().len() {
                self.poll_once(cq, buf);
            }
        } else {
            self.poll_once(source, buf);
        }
    }

    /// Polls, and dispatches, the CQ an operation's completion comes on (every CQ for
    /// [`ANY_SOURCE`]) until it is empty: after arming it, since what came before the arm
    /// raises no event.
    fn drain_source_of(&self, source: usize) {
        let mut buf = [Completion::EMPTY; 32];
        let cqs = match source {
            ANY_SOURCE => 0..self.pool.cqs().len(),
            cq => cq..cq + 1,
        };
        for cq in cqs {
            while self.poll_once(cq, &mut buf) == buf.len() {}
        }
    }

    /// Takes one completion off `cq` without dispatching it (counted; an overrun handled as
    /// in [`Self::poll_once`]).
    #[inline]
    fn poll_one(&self, cq: usize) -> Option<Completion> {
        let mut buf = [Completion::EMPTY; 1];
        match self.cq(cq).poll(&mut buf) {
            Ok(1) => {
                self.completions.fetch_add(1, Ordering::Relaxed);
                Some(buf[0])
            }
            Ok(_) => None,
            Err(_) => {
                // The error path (overrun, failure) is poll_once's.
                self.poll_once(cq, &mut buf);
                None
            }
        }
    }

    /// Event mode: makes sure `cq` raises an event for its next completion. Returns true if
    /// it requested one now: the caller then polls once, since completions that arrived
    /// before the request raise none.
    #[inline]
    fn ensure_armed(&self, cq: usize) -> bool {
        if self.armed[cq].load(Ordering::SeqCst) || self.armed[cq].swap(true, Ordering::SeqCst) {
            return false;
        }
        if let Err(e) = self.cq(cq).req_notify() {
            tracing::error!(cq, "cannot arm the completion queue: {e}");
        }
        true
    }

    /// Event mode: arms every CQ nobody armed, for the operations that wait on them, and
    /// drains each it armed (completions before the arm raise no event).
    fn arm_all(&self) {
        for cq in 0..self.pool.cqs().len() {
            if self.ensure_armed(cq) {
                self.drain_source_of(cq);
            }
        }
    }

    /// Polls `cq` until it is empty.
    #[cfg(not(loom))]
    fn drain(&self, cq: usize) -> usize {
        let mut buf = [Completion::EMPTY; 32];
        let mut total = 0;
        loop {
            let n = self.poll_once(cq, &mut buf);
            total += n;
            if n < buf.len() {
                return total;
            }
        }
    }
}

/// Dispatches completions of its CQs to the futures of [`AsyncQp`] operations.
pub struct Engine {
    shared: Arc<Shared>,
    assignment: Assignment,
    progressors: Arc<Progressors>,
}

impl Engine {
    /// An engine over `cqs` (every CQ its QPs use). With [`Progress::Event`] it must be
    /// created inside a tokio runtime.
    pub fn new(cqs: Vec<Cq>, cfg: EngineConfig) -> Result<Self> {
        if cqs.is_empty() {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "CQs of an engine",
                value: 0,
                min: 1,
                max: u32::MAX.into(),
            }));
        }
        Self::with_pool(CqPool::from_cqs(cqs)?, cfg)
    }

    /// An engine over the CQs of `pool`, which then places the QPs of
    /// [`Engine::create_qp`] (by [`EngineConfig::assignment`]). With [`Progress::Event`] it
    /// must be created inside a tokio runtime.
    pub fn with_pool(pool: CqPool, cfg: EngineConfig) -> Result<Self> {
        if cfg.slots == 0 || cfg.slots > u32::MAX as usize {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "EngineConfig::slots",
                value: cfg.slots as u64,
                min: 1,
                max: u32::MAX.into(),
            }));
        }
        let n = pool.cqs().len();
        let shared = Arc::new(Shared {
            table: SlotTable::new(cfg.slots),
            pool,
            broken: (0..n).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
            completions: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            spin: cfg.spin,
            event_driven: cfg.progress == Progress::Event,
            thread_polled: cfg.progress == Progress::BusyPoll,
            armed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            spinners: AtomicUsize::new(0),
            caller_driven: cfg.progress == Progress::Caller,
            caller_spin: caller::budget(cfg.spin),
            caller_spin_ns: AtomicU64::new(cfg.spin.as_nanos() as u64),
        });
        let progressors = Progressors::start(shared.clone(), &cfg)?;
        Ok(Self {
            shared,
            assignment: cfg.assignment,
            progressors: Arc::new(progressors),
        })
    }

    /// Polls every CQ once and dispatches what it finds (caller-driven mode); returns how
    /// many completions it dispatched.
    pub fn progress(&self) -> usize {
        self.progress_into(&mut [Completion::EMPTY; 32])
    }

    fn progress_into(&self, buf: &mut [Completion]) -> usize {
        (0..self.shared.pool.cqs().len())
            .map(|i| self.shared.poll_once(i, buf))
            .sum()
    }

    /// Polls CQ `cq` (an index into the engine's CQs) once; for threads that each drive
    /// their own CQ. Returns how many completions it dispatched (0 for a bad index).
    pub fn progress_cq(&self, cq: usize) -> usize {
        let mut buf = [Completion::EMPTY; 32];
        if cq >= self.shared.pool.cqs().len() {
            return 0;
        }
        self.shared.poll_once(cq, &mut buf)
    }

    /// Runs `fut` to completion on this thread, progressing the engine between polls, with
    /// no thread hand-off (the lowest latency). Caller-driven, it polls while a completion
    /// is plausibly near and then sleeps on the CQs' completion channels, a millisecond at
    /// most between polls of `fut` (`cq/engine/caller.rs` has the rule); in the other modes
    /// it polls until `fut` is done.
    ///
    /// ```
    /// # use rdmapool_pool::cq::{Engine, EngineConfig, Progress};
    /// # use rdmapool_pool::fabric::*;
    /// # use std::sync::Arc;
    /// # fn main() -> rdmapool_pool::Result<()> {
    /// let ctx = Context::open(SoftConfig::default())?;
    /// let pd = ctx.alloc_pd()?;
    /// let cfg = EngineConfig { progress: Progress::Caller, ..EngineConfig::default() };
    /// let engine = Engine::new(vec![ctx.create_cq(1024)?], cfg)?;
    /// let (a, b) = (engine.create_qp(&pd, &QpConfig::default())?, engine.create_qp(&pd, &QpConfig::default())?);
    /// a.connect(&b.qp().endpoint())?;
    /// b.connect(&a.qp().endpoint())?;
    /// let target = pd.alloc_mr(4096, AccessFlags::all_remote())?;
    /// let local = Arc::new(pd.alloc_mr(4096, AccessFlags::all_remote())?);
    /// local.write_at(0, b"hello")?;
    /// let (result, _local) = engine.run_until(a.write(local, 0, 5, target.remote_at(0)?));
    /// result?;
    /// let mut got = [0u8; 5];
    /// target.read_at(0, &mut got)?;
    /// assert_eq!(&got, b"hello");
    /// # Ok(()) }
    /// ```
    pub fn run_until<F: Future>(&self, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let mut cx = Context::from_waker(Waker::noop());
        // Most operations resolve in their first poll (see EngineConfig::spin): the buffer
        // is only made for the ones that do not.
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let mut buf = [Completion::EMPTY; 16];
        // Past its first microseconds the loop yields between polls, so that on a machine
        // with more busy threads than cores the threads this one waits for get a core.
        let mut pause = PollPause::new();
        if !self.shared.caller_driven {
            // Threads or tasks poll the CQs too: the loop only spins.
            loop {
                self.progress_into(&mut buf);
                if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                    return v;
                }
                pause.pause();
            }
        }
        // Caller-driven: poll while the budget allows, then sleep on the completion
        // channels (`caller.rs`).
        let mut wait = caller::CallerWait::start(&self.shared);
        loop {
            self.progress_into(&mut buf);
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                wait.done();
                return v;
            }
            if wait.pending() {
                pause.pause();
            } else {
                wait.sleep();
            }
        }
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            in_flight: self.shared.table.in_flight(),
            completions: self.shared.completions.load(Ordering::Relaxed),
            overruns: self.shared.overruns.load(Ordering::Relaxed),
            wakeups: self.shared.wakeups.load(Ordering::Relaxed),
            caller_spin: if self.shared.caller_driven {
                self.shared.future_spin()
            } else {
                Duration::ZERO
            },
        }
    }

    /// Creates a QP on `pd` bound (send and receive) to one of the engine's CQs, chosen by
    /// the [`Assignment`] among those with room: a CQ is never promised more entries
    /// (`max_send_wr + max_recv_wr` per QP) than its depth, so it cannot overrun. Connect
    /// it with [`AsyncQp::connect`].
    pub fn create_qp(&self, pd: &Pd, cfg: &QpConfig) -> Result<AsyncQp> {
        let pool = &self.shared.pool;
        let need = cfg.max_send_wr as u64 + cfg.max_recv_wr as u64;
        let cq = pool.reserve(self.assignment, need)?;
        let qp = match pd.create_qp(&pool.cqs()[cq], &pool.cqs()[cq], cfg) {
            Ok(qp) => qp,
            Err(e) => {
                pool.unreserve(cq, need);
                return Err(e.into());
            }
        };
        Ok(self.async_qp(qp, cq, need))
    }

    /// Wraps a QP made elsewhere (for example by [`crate::conn`]) whose CQs belong to this
    /// engine (see [`Engine::cqs`]); its queue depths come from [`Qp::capacity`]. Sizing its
    /// CQ is then the caller's job.
    pub fn wrap(&self, qp: Qp) -> AsyncQp {
        self.async_qp(qp, ANY_SOURCE, 0)
    }

    /// The engine's CQs, in the order given to [`Engine::new`].
    pub fn cqs(&self) -> &[Cq] {
        self.shared.pool.cqs()
    }

    fn async_qp(&self, qp: Qp, cq: usize, reserved: u64) -> AsyncQp {
        AsyncQp::new(
            qp,
            cq,
            reserved,
            self.shared.clone(),
            self.progressors.clone(),
        )
    }
}
