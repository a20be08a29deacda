//! The progress engine and the async one-sided API.

use crate::buf::Buffer;
use crate::fabric::provider::BindSpec;
use crate::fabric::{
    AccessFlags, Completion, Cq, Mr, Mw, Pd, Qp, QpConfig, RecvWr, RegisteredMemory, RemoteAddr,
    RemoteRegion, SendWr, Sge, WcStatus, WrOp,
};
use crate::{Error, Result};
use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Either of the two common kinds of registered memory, for a batch that mixes them (every
/// operation of a batch takes the same buffer type).
#[derive(Debug)]
pub enum LocalBuf {
    /// A registered region (shared).
    Region(Arc<Mr>),
    /// A pooled, pre-registered buffer.
    Pooled(Buffer),
}

impl RegisteredMemory for LocalBuf {
    fn addr(&self) -> u64 {
        match self {
            LocalBuf::Region(m) => m.addr(),
            LocalBuf::Pooled(b) => b.addr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            LocalBuf::Region(m) => m.len(),
            LocalBuf::Pooled(b) => b.len(),
        }
    }
    fn lkey(&self) -> u32 {
        match self {
            LocalBuf::Region(m) => m.lkey(),
            LocalBuf::Pooled(b) => b.lkey(),
        }
    }
    fn rkey(&self) -> u32 {
        match self {
            LocalBuf::Region(m) => m.rkey(),
            LocalBuf::Pooled(b) => b.rkey(),
        }
    }
}

/// A memory window bound by [`AsyncQp::bind_window`].
#[derive(Debug, Clone)]
pub struct WindowBinding {
    /// The window.
    pub mw: Arc<Mw>,
    addr: u64,
    len: u64,
    /// The rights granted.
    pub access: AccessFlags,
}

impl WindowBinding {
    /// What a peer needs: the bound range under the window's current remote key.
    pub fn region(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            len: self.len,
            rkey: self.mw.rkey(),
        }
    }
}

/// How completions reach the futures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// One busy-polling thread per CQ (it naps 50 µs after ~2000 empty polls). Lowest
    /// latency; burns a core per CQ while there is traffic.
    BusyPoll,
    /// Nobody polls but the caller, through [`Engine::progress`].
    Caller,
    /// Event-driven: one tokio task per CQ waits on the completion channel (`AsyncFd`),
    /// then acknowledges, re-arms and drains until the channel would block. Needs a tokio
    /// runtime with I/O and time enabled when the engine is created.
    Event,
}

/// How new QPs are spread over the engine's CQs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Each new QP takes the next CQ (with room).
    RoundRobin,
    /// QPs created on the same thread share a CQ (with room).
    PerThread,
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
    /// [`Progress::Event`] only: also drain this often while operations are in flight.
    /// The soft provider notices a silent peer (its retry timeout) only when polled;
    /// `None` relies on events alone.
    pub event_tick: Option<Duration>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            slots: 4096,
            progress: Progress::BusyPoll,
            assignment: Assignment::RoundRobin,
            event_tick: Some(Duration::from_millis(20)),
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
    /// CQs that overran (their QPs' operations failed with [`Error::CqOverrun`]).
    pub overruns: u64,
    /// Event-driven mode: wake-ups by the completion channel (ticks not counted).
    pub wakeups: u64,
}

/// A QP's share of the engine: its queues' free entries and the CQ it is bound to.
struct QpShared {
    qp: Qp,
    /// Free send-queue entries; a post takes as many as it has work requests and the
    /// completion gives them back, so posting never overflows the queue.
    send_credits: AtomicU32,
    send_depth: u32,
    recv_credits: AtomicU32,
    recv_depth: u32,
    /// Index of the CQ in the engine, or `UNKNOWN_CQ` for a wrapped QP.
    cq: usize,
    /// Entries this QP reserved in its CQ (released on drop).
    reserved: u64,
    engine: Arc<Shared>,
    _progressors: Arc<Progressors>,
}

const UNKNOWN_CQ: usize = usize::MAX;

impl QpShared {
    fn credits(&self, recv: bool) -> &AtomicU32 {
        if recv {
            &self.recv_credits
        } else {
            &self.send_credits
        }
    }

    fn take(&self, recv: bool, n: u32) -> bool {
        self.credits(recv)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(n))
            .is_ok()
    }

    fn give(&self, recv: bool, n: u32) {
        self.credits(recv).fetch_add(n, Ordering::AcqRel);
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        if self.cq != UNKNOWN_CQ {
            self.engine.reserved[self.cq].fetch_sub(self.reserved, Ordering::AcqRel);
        }
    }
}

/// How an operation ended, as the dispatcher records it.
enum Outcome {
    Completed(Completion),
    /// Its CQ overran (depth): the completion may be lost.
    Overrun(u32),
}

impl Outcome {
    fn into_result(self) -> Result<Completion> {
        match self {
            Outcome::Completed(c) if c.status == WcStatus::Success => Ok(c),
            Outcome::Completed(c) => Err(Error::Completion {
                status: c.status,
                wr_id: c.wr_id,
            }),
            Outcome::Overrun(depth) => Err(Error::CqOverrun { depth }),
        }
    }
}

#[derive(Default)]
struct SlotState {
    active: bool,
    abandoned: bool,
    outcome: Option<Outcome>,
    waker: Option<Waker>,
    /// The buffer of an operation whose future was dropped in flight, kept until the
    /// completion arrives (a live future holds its buffer itself).
    keep: Option<Box<dyn Send>>,
    /// Set when the future is dropped in flight: the QP, kept from being destroyed under
    /// the request and given back its queue entries on completion. (A live future
    /// borrows its QP, so it needs no reference here.)
    owner: Option<Arc<QpShared>>,
    /// Queue entries the operation holds, returned when its slot is released.
    credits: u32,
    recv: bool,
    /// The engine CQ of its QP (`UNKNOWN_CQ` for a wrapped QP).
    cq: usize,
}

type SlotGuard<'a> = parking_lot::MutexGuard<'a, SlotState>;

struct Slot {
    generation: AtomicU32,
    /// Held for a few field moves only, never across a call that may block, wake a thread
    /// or drop a buffer.
    state: Mutex<SlotState>,
}

struct Shared {
    slots: Box<[Slot]>,
    free: ArrayQueue<u32>,
    /// The slot freed last (index + 1; 0 = none), handed out first: with few operations in
    /// flight the same cache-hot slot is reused instead of cycling through the table.
    hot: AtomicU32,
    cqs: Vec<Cq>,
    /// Entries promised to QPs, per CQ (sizing: never more than its depth).
    reserved: Vec<AtomicU64>,
    /// CQs that overran: their QPs fail.
    broken: Vec<AtomicBool>,
    next_cq: AtomicUsize,
    stop: AtomicBool,
    completions: AtomicU64,
    overruns: AtomicU64,
    wakeups: AtomicU64,
    /// Futures waiting for a free slot or queue entries (touched only when there are some).
    waiting: Mutex<Vec<Waker>>,
    has_waiting: AtomicBool,
}

impl Shared {
    fn wr_id(&self, idx: u32) -> u64 {
        ((self.slots[idx as usize].generation.load(Ordering::Acquire) as u64) << 32) | idx as u64
    }

    fn in_flight(&self) -> usize {
        let hot = (self.hot.load(Ordering::Acquire) != 0) as usize;
        self.slots.len() - self.free.len() - hot
    }

    fn take_slot(&self) -> Option<u32> {
        match self.hot.swap(0, Ordering::AcqRel) {
            0 => self.free.pop(),
            h => Some(h - 1),
        }
    }

    fn put_slot(&self, idx: u32) {
        if self
            .hot
            .compare_exchange(0, idx + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            let _ = self.free.push(idx);
        }
    }

    /// Registers `waker` to be woken when a slot or queue entries free up.
    /// The waiter's half of a store-fence-load handshake with `wake_waiters`: it announces
    /// itself, then (its caller) looks for room again. With a SeqCst fence on both sides,
    /// either the waker sees the announcement or the waiter sees the room, so no wake-up is
    /// lost, and the common path (nobody waiting) only reads the flag: no cache line
    /// bouncing between threads per operation.
    fn wait_for_room(&self, waker: &Waker) {
        self.waiting.lock().push(waker.clone());
        self.has_waiting.store(true, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Called after room was made (a slot or queue entries given back).
    fn wake_waiters(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.has_waiting.load(Ordering::Relaxed)
            && self.has_waiting.swap(false, Ordering::AcqRel)
        {
            for w in self.waiting.lock().drain(..) {
                w.wake();
            }
        }
    }

    /// Gives back what the operation held (queue entries to `qp`, or to the owner of an
    /// abandoned operation; the buffer) and frees the slot. Called with the slot locked.
    fn release(&self, idx: u32, mut st: SlotGuard<'_>, qp: Option<&QpShared>) {
        let owner = st.owner.take();
        if let Some(q) = qp.or(owner.as_deref()) {
            q.give(st.recv, st.credits);
        }
        st.credits = 0;
        st.active = false;
        st.abandoned = false;
        st.outcome = None;
        let waker = st.waker.take();
        let keep = st.keep.take();
        let g = &self.slots[idx as usize].generation;
        // Only the slot's lock holder changes the generation: no read-modify-write needed.
        g.store(g.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        drop(st);
        // Outside the lock: dropping a buffer may deregister it, waking may enter the kernel.
        self.put_slot(idx);
        self.wake_waiters();
        drop((keep, waker, owner));
    }

    fn dispatch(&self, c: &Completion) {
        let idx = (c.wr_id & 0xffff_ffff) as u32;
        let generation = (c.wr_id >> 32) as u32;
        let Some(slot) = self.slots.get(idx as usize) else {
            return;
        };
        let mut st = slot.state.lock();
        if !st.active
            || slot.generation.load(Ordering::Acquire) != generation
            || st.outcome.is_some()
        {
            return; // stale, or a later completion of a batch that already finished
        }
        if st.abandoned {
            self.release(idx, st, None); // the future is gone: release its buffer now
            return;
        }
        st.outcome = Some(Outcome::Completed(*c));
        let waker = st.waker.take();
        drop(st);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Fails every operation of QPs bound to CQ `cq` (and of wrapped QPs, whose CQ is not
    /// known): their completions may be lost.
    fn fail_cq(&self, cq: usize, depth: u32) {
        for (idx, slot) in self.slots.iter().enumerate() {
            let mut st = slot.state.lock();
            let on_cq = st.cq == cq || st.cq == UNKNOWN_CQ;
            if !st.active || st.outcome.is_some() || !on_cq {
                continue;
            }
            if st.abandoned {
                // Its buffer may still be written by a request whose completion was lost;
                // keep it (leak) rather than hand it back for reuse.
                std::mem::forget(st.keep.take());
                self.release(idx as u32, st, None);
                continue;
            }
            st.outcome = Some(Outcome::Overrun(depth));
            let waker = st.waker.take();
            drop(st);
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    fn poll_once(&self, cq: usize, buf: &mut [Completion]) -> usize {
        match self.cqs[cq].poll(buf) {
            Ok(n) => {
                if n > 0 {
                    for c in &buf[..n] {
                        self.dispatch(c);
                    }
                    self.completions.fetch_add(n as u64, Ordering::Relaxed);
                }
                n
            }
            Err(Error::CqOverrun { depth }) => {
                if !self.broken[cq].swap(true, Ordering::AcqRel) {
                    self.overruns.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(cq, depth, "completion queue overrun: failing its QPs");
                }
                // Again on every poll: a wrapped QP (CQ unknown) can still post onto it.
                self.fail_cq(cq, depth);
                0
            }
            Err(e) => {
                tracing::error!("completion queue failed: {e}");
                0
            }
        }
    }

    /// Polls `cq` until it is empty.
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

/// The engine's progress threads or tasks. Every `Engine` and `AsyncQp` holds them, so they
/// stop only when the last of those is gone: a QP that outlives its `Engine` handle still
/// gets its completions.
struct Progressors {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    #[cfg(not(loom))]
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Progressors {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // The last holder may be a progress thread itself (releasing an abandoned
        // operation's QP): it must not wait for itself, and exits on the stop flag.
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        #[cfg(not(loom))]
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Engine {
    /// An engine over `cqs` (every CQ its QPs use). With [`Progress::Event`] it must be
    /// created inside a tokio runtime.
    pub fn new(cqs: Vec<Cq>, cfg: EngineConfig) -> Result<Self> {
        if cfg.slots == 0 || cfg.slots > u32::MAX as usize || cqs.is_empty() {
            return Err(Error::InvalidArgument(
                "an engine needs CQs and 1..=2^32-1 slots".into(),
            ));
        }
        let free = ArrayQueue::new(cfg.slots);
        for i in 0..cfg.slots as u32 {
            let _ = free.push(i);
        }
        let slots = (0..cfg.slots)
            .map(|_| Slot {
                generation: AtomicU32::new(0),
                state: Mutex::new(SlotState::default()),
            })
            .collect();
        let n = cqs.len();
        let shared = Arc::new(Shared {
            slots,
            free,
            hot: AtomicU32::new(0),
            cqs,
            reserved: (0..n).map(|_| AtomicU64::new(0)).collect(),
            broken: (0..n).map(|_| AtomicBool::new(false)).collect(),
            next_cq: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            completions: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            waiting: Mutex::new(Vec::new()),
            has_waiting: AtomicBool::new(false),
        });
        let mut engine = Progressors {
            shared,
            threads: Vec::new(),
            #[cfg(not(loom))]
            tasks: Vec::new(),
        };
        match cfg.progress {
            Progress::Caller => {}
            Progress::BusyPoll => {
                for i in 0..n {
                    let s = engine.shared.clone();
                    engine.threads.push(
                        std::thread::Builder::new()
                            .name(format!("rdmapool-progress-{i}"))
                            .spawn(move || busy_poll(&s, i))
                            .map_err(|e| Error::Sys {
                                call: "spawn",
                                source: e,
                            })?,
                    );
                }
            }
            #[cfg(not(loom))]
            Progress::Event => {
                let rt = tokio::runtime::Handle::try_current().map_err(|_| {
                    Error::InvalidArgument(
                        "event-driven progress needs a tokio runtime (create the engine \
                         inside one)"
                            .into(),
                    )
                })?;
                let _in_runtime = rt.enter();
                for i in 0..n {
                    let channel =
                        super::event::CompletionChannel::new(engine.shared.cqs[i].clone());
                    // SAFETY: the channel holds its CQ, so the descriptor stays open and the
                    // same for the AsyncFd's whole life.
                    let afd = unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            channel,
                            tokio::io::Interest::READABLE,
                        )
                    }
                    .map_err(|e| Error::Sys {
                        call: "AsyncFd::register (completion channel)",
                        source: e.into_parts().1,
                    })?;
                    let s = engine.shared.clone();
                    engine.tasks.push(
                        rt.spawn(event_loop(s, i, afd, cfg.event_tick))
                            .abort_handle(),
                    );
                }
            }
            #[cfg(loom)]
            Progress::Event => {
                return Err(Error::InvalidArgument(
                    "event-driven progress is not built under loom".into(),
                ))
            }
        }
        Ok(Self {
            shared: engine.shared.clone(),
            assignment: cfg.assignment,
            progressors: Arc::new(engine),
        })
    }

    /// Polls every CQ once and dispatches what it finds (caller-driven mode); returns how
    /// many completions it dispatched.
    pub fn progress(&self) -> usize {
        self.progress_into(&mut [Completion::EMPTY; 32])
    }

    fn progress_into(&self, buf: &mut [Completion]) -> usize {
        (0..self.shared.cqs.len())
            .map(|i| self.shared.poll_once(i, buf))
            .sum()
    }

    /// Polls CQ `cq` (an index into the engine's CQs) once; for threads that each drive
    /// their own CQ. Returns how many completions it dispatched (0 for a bad index).
    pub fn progress_cq(&self, cq: usize) -> usize {
        let mut buf = [Completion::EMPTY; 32];
        if cq >= self.shared.cqs.len() {
            return 0;
        }
        self.shared.poll_once(cq, &mut buf)
    }

    /// Runs `fut` to completion on this thread, progressing the engine between polls: the
    /// caller-driven busy-poll loop, with no thread hand-off (the lowest latency).
    ///
    /// ```
    /// # use rdmapool::cq::{Engine, EngineConfig, Progress};
    /// # use rdmapool::fabric::*;
    /// # use std::sync::Arc;
    /// # fn main() -> rdmapool::Result<()> {
    /// let ctx = Context::open_soft()?;
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
        let mut buf = [Completion::EMPTY; 16];
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            self.progress_into(&mut buf);
        }
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            in_flight: self.shared.in_flight(),
            completions: self.shared.completions.load(Ordering::Relaxed),
            overruns: self.shared.overruns.load(Ordering::Relaxed),
            wakeups: self.shared.wakeups.load(Ordering::Relaxed),
        }
    }

    /// Creates a QP on `pd` bound (send and receive) to one of the engine's CQs, chosen by
    /// the [`Assignment`] among those with room: a CQ is never promised more entries
    /// (`max_send_wr + max_recv_wr` per QP) than its depth, so it cannot overrun. Connect
    /// it with [`AsyncQp::connect`].
    pub fn create_qp(&self, pd: &Pd, cfg: &QpConfig) -> Result<AsyncQp> {
        let s = &self.shared;
        let need = cfg.max_send_wr as u64 + cfg.max_recv_wr as u64;
        let n = s.cqs.len();
        let start = match self.assignment {
            Assignment::RoundRobin => s.next_cq.fetch_add(1, Ordering::Relaxed),
            Assignment::PerThread => super::thread_hash(),
        };
        let cq = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| {
                let depth = s.cqs[i].depth() as u64;
                s.reserved[i]
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                        (r + need <= depth).then_some(r + need)
                    })
                    .is_ok()
            })
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no CQ has room for a QP of {need} entries (send + receive depth); \
                     use deeper or more CQs"
                ))
            })?;
        let qp = match pd.create_qp(&s.cqs[cq], &s.cqs[cq], cfg) {
            Ok(qp) => qp,
            Err(e) => {
                s.reserved[cq].fetch_sub(need, Ordering::AcqRel);
                return Err(e);
            }
        };
        Ok(self.async_qp(qp, cq, need))
    }

    /// Wraps a QP made elsewhere (for example by [`crate::conn`]) whose CQs belong to this
    /// engine (see [`Engine::cqs`]); its queue depths come from [`Qp::capacity`]. Sizing its
    /// CQ is then the caller's job.
    pub fn wrap(&self, qp: Qp) -> AsyncQp {
        self.async_qp(qp, UNKNOWN_CQ, 0)
    }

    /// The engine's CQs, in the order given to [`Engine::new`].
    pub fn cqs(&self) -> &[Cq] {
        &self.shared.cqs
    }

    fn async_qp(&self, qp: Qp, cq: usize, reserved: u64) -> AsyncQp {
        let capacity = qp.capacity();
        AsyncQp {
            inner: Arc::new(QpShared {
                qp,
                send_credits: AtomicU32::new(capacity.send),
                send_depth: capacity.send,
                recv_credits: AtomicU32::new(capacity.recv),
                recv_depth: capacity.recv,
                cq,
                reserved,
                engine: self.shared.clone(),
                _progressors: self.progressors.clone(),
            }),
        }
    }
}

fn busy_poll(s: &Shared, cq: usize) {
    let mut buf = [Completion::EMPTY; 32];
    let mut idle = 0u32;
    while !s.stop.load(Ordering::Acquire) {
        if s.poll_once(cq, &mut buf) > 0 {
            idle = 0;
        } else if s.broken[cq].load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        } else {
            idle += 1;
            if idle > 2000 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

#[cfg(not(loom))]
async fn event_loop(
    s: Arc<Shared>,
    cq: usize,
    afd: tokio::io::unix::AsyncFd<super::event::CompletionChannel>,
    tick: Option<Duration>,
) {
    loop {
        // Arm first, then drain: a completion that lands after the drain's last poll
        // raises an event, and the ones before the arm are drained here.
        if let Err(e) = s.cqs[cq].req_notify() {
            tracing::error!(cq, "cannot arm the completion queue: {e}");
            return;
        }
        s.drain(cq);
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let ready = match tick {
            Some(t) if s.in_flight() > 0 => tokio::time::timeout(t, afd.readable()).await.ok(),
            _ => Some(afd.readable().await),
        };
        match ready {
            None => {}
            Some(Err(e)) => {
                tracing::error!(cq, "completion channel failed: {e}");
                return;
            }
            Some(Ok(mut guard)) => {
                s.wakeups.fetch_add(1, Ordering::Relaxed);
                // Consume every queued event (an unconsumed one raises no new edge), then
                // clear readiness only if the channel would now block.
                let _ = s.cqs[cq].ack_events();
                if !guard.get_inner().readable_now() {
                    guard.clear_ready();
                }
            }
        }
    }
}

/// The work requests of an operation, without their buffers.
enum Spec {
    One {
        op: WrOp,
        sge: Sge,
    },
    Batch(Vec<(WrOp, Sge)>),
    Recv {
        sge: Sge,
    },
    /// A local operation without SGEs (an invalidation).
    Local {
        op: WrOp,
    },
    /// A memory-window bind (the window travels with the future).
    Bind {
        mw: Arc<Mw>,
        bind: BindSpec,
    },
}

impl Spec {
    fn entries(&self) -> u32 {
        match self {
            Spec::Batch(ops) => ops.len() as u32,
            _ => 1,
        }
    }

    fn is_recv(&self) -> bool {
        matches!(self, Spec::Recv { .. })
    }

    /// Posts with one doorbell; only the last send is signalled. No heap allocation for a
    /// single operation.
    fn post(&self, qp: &Qp, wr_id: u64) -> Result<()> {
        match self {
            Spec::One { op, sge } => qp.post_send(&[SendWr {
                wr_id,
                op: *op,
                sg_list: std::slice::from_ref(sge),
                signaled: true,
            }]),
            Spec::Batch(ops) => {
                let last = ops.len() - 1;
                let wrs: Vec<SendWr<'_>> = ops
                    .iter()
                    .enumerate()
                    .map(|(i, (op, sge))| SendWr {
                        wr_id,
                        op: *op,
                        sg_list: std::slice::from_ref(sge),
                        signaled: i == last,
                    })
                    .collect();
                qp.post_send(&wrs)
            }
            Spec::Recv { sge } => qp.post_recv(&[RecvWr {
                wr_id,
                sg_list: std::slice::from_ref(sge),
            }]),
            Spec::Local { op } => qp.post_send(&[SendWr {
                wr_id,
                op: *op,
                sg_list: &[],
                signaled: true,
            }]),
            Spec::Bind { mw, bind } => qp
                .post_bind(
                    mw,
                    &BindSpec {
                        wr_id,
                        signaled: true,
                        ..*bind
                    },
                )
                .map(|_| ()),
        }
    }
}

/// Where an operation's future is.
enum Stage {
    /// Refused before posting.
    Failed(Error),
    /// Waiting for a slot and queue room.
    ToPost(Spec),
    /// Posted: the slot holds the waker.
    Posted(u32),
    /// Its result was returned.
    Finished,
}

/// An operation in flight. It resolves to its outcome and the buffer it was given, in the
/// style of tokio-uring: `(Ok(completion), buf)`, or `(Err(e), buf)` for a refusal or an
/// error completion, so data READ into the buffer can be looked at and the buffer reused.
///
/// Dropping it in flight never frees the buffer early: the engine keeps the buffer until the
/// completion arrives, then drops it. Like every future, it must not be polled again after
/// it resolved.
pub struct OpFuture<'q, B: Send + 'static> {
    qp: &'q AsyncQp,
    stage: Stage,
    buf: Option<B>,
}

// The buffer is never pinned: it is moved out when the future resolves.
impl<B: Send + 'static> Unpin for OpFuture<'_, B> {}

impl<'q, B: Send + 'static> OpFuture<'q, B> {
    fn to_post(qp: &'q AsyncQp, spec: Spec, buf: B) -> Self {
        let depth = if spec.is_recv() {
            qp.inner.recv_depth
        } else {
            qp.inner.send_depth
        };
        if spec.entries() > depth {
            return Self::failed(
                qp,
                Error::InvalidArgument(format!(
                    "{} work requests at once, the queue holds {depth}",
                    spec.entries()
                )),
                buf,
            );
        }
        OpFuture {
            qp,
            stage: Stage::ToPost(spec),
            buf: Some(buf),
        }
    }

    fn failed(qp: &'q AsyncQp, e: Error, buf: B) -> Self {
        OpFuture {
            qp,
            stage: Stage::Failed(e),
            buf: Some(buf),
        }
    }

    /// Takes `n` queue entries and a slot, or registers to be woken when they free up.
    fn reserve(&self, recv: bool, n: u32, cx: &mut Context<'_>) -> Option<u32> {
        let q = &self.qp.inner;
        let s = &q.engine;
        for attempt in 0..2 {
            if q.take(recv, n) {
                if let Some(idx) = s.take_slot() {
                    return Some(idx);
                }
                q.give(recv, n);
            }
            if attempt == 0 {
                // Register, then look again: room freed in between would not wake us.
                s.wait_for_room(cx.waker());
            }
        }
        None
    }

    /// Posts, or waits for room. Ready(Ok) means posted (the future is now `Posted`).
    fn try_post(&mut self, spec: Spec, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let q = &self.qp.inner;
        let s = &q.engine;
        if q.cq != UNKNOWN_CQ && s.broken[q.cq].load(Ordering::Acquire) {
            return Poll::Ready(Err(Error::CqOverrun {
                depth: s.cqs[q.cq].depth(),
            }));
        }
        let (recv, credits) = (spec.is_recv(), spec.entries());
        let Some(idx) = self.reserve(recv, credits, cx) else {
            self.stage = Stage::ToPost(spec);
            return Poll::Pending;
        };
        let wr_id = s.wr_id(idx);
        let slot = &s.slots[idx as usize];
        {
            // Filled before posting: the completion may arrive before post returns.
            let mut st = slot.state.lock();
            st.active = true;
            st.waker = Some(cx.waker().clone());
            st.cq = q.cq;
            st.credits = credits;
            st.recv = recv;
        }
        match spec.post(&q.qp, wr_id) {
            Ok(()) => {
                self.stage = Stage::Posted(idx);
                Poll::Ready(Ok(()))
            }
            Err(Error::QueueFull { .. }) => {
                // Someone posted on the raw QP too: wait for completions to make room.
                s.release(idx, slot.state.lock(), Some(q));
                self.stage = Stage::ToPost(spec);
                s.wait_for_room(cx.waker());
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(e) => {
                s.release(idx, slot.state.lock(), Some(q));
                Poll::Ready(Err(e))
            }
        }
    }

    fn resolve(&mut self, r: Result<Completion>) -> Poll<(Result<Completion>, B)> {
        let buf = self.buf.take().expect("OpFuture polled after it resolved");
        Poll::Ready((r, buf))
    }
}

impl<B: Send + 'static> Future for OpFuture<'_, B> {
    type Output = (Result<Completion>, B);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let idx = match std::mem::replace(&mut self.stage, Stage::Finished) {
            Stage::Posted(idx) => idx,
            Stage::ToPost(spec) => {
                // Posted: the slot holds our waker, so a completion wakes us.
                return match self.try_post(spec, cx) {
                    Poll::Ready(Ok(())) | Poll::Pending => Poll::Pending,
                    Poll::Ready(Err(e)) => self.resolve(Err(e)),
                };
            }
            Stage::Failed(e) => return self.resolve(Err(e)),
            Stage::Finished => panic!("OpFuture polled after it resolved"),
        };
        let s = &self.qp.inner.engine;
        let mut st = s.slots[idx as usize].state.lock();
        match st.outcome.take() {
            Some(outcome) => {
                s.release(idx, st, Some(&self.qp.inner));
                self.resolve(outcome.into_result())
            }
            None => {
                if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.waker = Some(cx.waker().clone());
                }
                drop(st);
                self.stage = Stage::Posted(idx);
                Poll::Pending
            }
        }
    }
}

impl<B: Send + 'static> Drop for OpFuture<'_, B> {
    fn drop(&mut self) {
        if let Stage::Posted(idx) = self.stage {
            let s = &self.qp.inner.engine;
            let mut st = s.slots[idx as usize].state.lock();
            if st.outcome.is_some() {
                s.release(idx, st, Some(&self.qp.inner)); // completed, never polled again
            } else {
                // The engine releases slot, entries and buffer on completion; until then the
                // slot keeps the QP and the buffer alive (the one allocation on this path).
                st.abandoned = true;
                st.waker = None;
                st.owner = Some(self.qp.inner.clone());
                st.keep = self.buf.take().map(|b| Box::new(b) as Box<dyn Send>);
            }
        }
    }
}

/// A QP with async one-sided and two-sided operations.
pub struct AsyncQp {
    inner: Arc<QpShared>,
}

impl AsyncQp {
    /// The wrapped QP.
    pub fn qp(&self) -> &Qp {
        &self.inner.qp
    }

    /// Connects the QP to a peer's endpoint (RESET to RTS).
    pub fn connect(&self, remote: &crate::fabric::Endpoint) -> Result<()> {
        self.inner.qp.connect(remote)
    }

    /// Which of the engine's CQs the QP is bound to (None for a wrapped QP).
    pub fn cq_index(&self) -> Option<usize> {
        (self.inner.cq != UNKNOWN_CQ).then_some(self.inner.cq)
    }

    fn op<B: RegisteredMemory + Send + 'static>(
        &self,
        op: WrOp,
        local: B,
        offset: usize,
        len: u32,
    ) -> OpFuture<'_, B> {
        match local.sge(offset, len) {
            Ok(sge) => OpFuture::to_post(self, Spec::One { op, sge }, local),
            Err(e) => OpFuture::failed(self, e, local),
        }
    }

    /// RDMA WRITE of `len` bytes at `offset` of `local` to `remote`.
    pub fn write<B: RegisteredMemory + Send + 'static>(
        &self,
        local: B,
        offset: usize,
        len: u32,
        remote: RemoteAddr,
    ) -> OpFuture<'_, B> {
        self.op(WrOp::Write { remote, imm: None }, local, offset, len)
    }

    /// RDMA READ of `len` bytes from `remote` into `offset` of `local`; the buffer comes back
    /// with the outcome, holding the data.
    pub fn read<B: RegisteredMemory + Send + 'static>(
        &self,
        local: B,
        offset: usize,
        len: u32,
        remote: RemoteAddr,
    ) -> OpFuture<'_, B> {
        self.op(WrOp::Read { remote }, local, offset, len)
    }

    /// Compare-and-swap; the old value lands at `offset` of `local` (8 bytes).
    pub fn compare_and_swap<B: RegisteredMemory + Send + 'static>(
        &self,
        local: B,
        offset: usize,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> OpFuture<'_, B> {
        self.op(
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            },
            local,
            offset,
            8,
        )
    }

    /// Fetch-and-add; the old value lands at `offset` of `local` (8 bytes).
    pub fn fetch_and_add<B: RegisteredMemory + Send + 'static>(
        &self,
        local: B,
        offset: usize,
        remote: RemoteAddr,
        add: u64,
    ) -> OpFuture<'_, B> {
        self.op(WrOp::FetchAdd { remote, add }, local, offset, 8)
    }

    /// SEND of `len` bytes at `offset` of `local`.
    pub fn send<B: RegisteredMemory + Send + 'static>(
        &self,
        local: B,
        offset: usize,
        len: u32,
    ) -> OpFuture<'_, B> {
        self.op(WrOp::Send { imm: None }, local, offset, len)
    }

    /// Posts a receive into `len` bytes at `offset` of `local`; resolves when a message lands.
    pub fn recv<B: RegisteredMemory + Send + 'static>(
        &self,
        local: B,
        offset: usize,
        len: u32,
    ) -> OpFuture<'_, B> {
        match local.sge(offset, len) {
            Ok(sge) => OpFuture::to_post(self, Spec::Recv { sge }, local),
            Err(e) => OpFuture::failed(self, e, local),
        }
    }

    /// Binds `mw` to `len` bytes at `offset` of `mem` with the remote rights `access` (see
    /// [`crate::fabric::Qp::post_bind_mw`]); resolves when the bind completed, giving the
    /// binding back: [`WindowBinding::region`] is what to hand the peer. The window reaches
    /// the memory only through this QP's connection.
    pub fn bind_window(
        &self,
        mw: Arc<Mw>,
        mem: &(impl RegisteredMemory + ?Sized),
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> OpFuture<'_, WindowBinding> {
        match BindSpec::new(0, mem, offset, len, access, true) {
            Ok(bind) => {
                let binding = WindowBinding {
                    mw: mw.clone(),
                    addr: bind.addr,
                    len: bind.len,
                    access,
                };
                OpFuture::to_post(self, Spec::Bind { mw, bind }, binding)
            }
            Err(e) => {
                let binding = WindowBinding {
                    mw,
                    addr: 0,
                    len: 0,
                    access,
                };
                OpFuture::failed(self, e, binding)
            }
        }
    }

    /// Invalidates the window with remote key `rkey` (a local invalidate on this QP's send
    /// queue, in order with what was posted before); peers using it fail from then on.
    pub fn invalidate(&self, rkey: u32) -> OpFuture<'_, ()> {
        OpFuture::to_post(
            self,
            Spec::Local {
                op: WrOp::LocalInvalidate { rkey },
            },
            (),
        )
    }

    /// Posts `ops` (operation, buffer, offset, length) as one list with one doorbell, only
    /// the last signalled; resolves when the last completes (RC order: all are done), or
    /// with the first error completion, and gives every buffer back in order. At most the
    /// send-queue depth of them. ([`LocalBuf`] mixes regions and pooled buffers.)
    pub fn batch<B: RegisteredMemory + Send + 'static>(
        &self,
        ops: Vec<(WrOp, B, usize, u32)>,
    ) -> OpFuture<'_, Vec<B>> {
        let mut list = Vec::with_capacity(ops.len());
        let mut keep = Vec::with_capacity(ops.len());
        let mut refused = None;
        for (op, local, offset, len) in ops {
            match local.sge(offset, len) {
                Ok(sge) => list.push((op, sge)),
                Err(e) => refused = refused.or(Some(e)),
            }
            keep.push(local);
        }
        if keep.is_empty() {
            refused = Some(Error::InvalidArgument("an empty batch".into()));
        }
        match refused {
            Some(e) => OpFuture::failed(self, e, keep),
            None => OpFuture::to_post(self, Spec::Batch(list), keep),
        }
    }
}
