//! The progress engine and the async one-sided API.

use crate::buf::Buffer;
use crate::fabric::{Completion, Cq, Mr, Qp, RecvWr, RemoteAddr, SendWr, Sge, WcStatus, WrOp};
use crate::{Error, Result};
use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Local memory an async operation uses, kept alive until its completion arrives — even if
/// the future is dropped first.
pub enum LocalBuf {
    /// A registered region (shared).
    Region(Arc<Mr>),
    /// A pooled, pre-registered buffer.
    Pooled(Buffer),
    /// Several, for a batch.
    Many(Vec<LocalBuf>),
}

impl LocalBuf {
    fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        match self {
            LocalBuf::Region(m) => m.sge(offset, len),
            LocalBuf::Pooled(b) => b.sge(offset, len),
            LocalBuf::Many(_) => Err(Error::InvalidArgument(
                "a batch buffer has no single SGE".into(),
            )),
        }
    }
}

/// How the engine progresses.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Operations in flight at once (the slot table).
    pub slots: usize,
    /// One busy-polling thread per CQ (it sleeps briefly after long idle stretches). When
    /// false, completions are dispatched only by [`Engine::progress`] (caller-driven).
    pub busy_poll_threads: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            slots: 4096,
            busy_poll_threads: true,
        }
    }
}

#[derive(Default)]
struct SlotState {
    active: bool,
    abandoned: bool,
    result: Option<Completion>,
    waker: Option<Waker>,
    keep: Option<LocalBuf>,
}

struct Slot {
    generation: AtomicU32,
    state: Mutex<SlotState>,
}

struct Shared {
    slots: Box<[Slot]>,
    free: ArrayQueue<u32>,
    cqs: Vec<Cq>,
    stop: AtomicBool,
    /// Futures waiting for a free slot or send-queue space (touched only when there are some).
    waiting: Mutex<Vec<Waker>>,
    has_waiting: AtomicBool,
}

impl Shared {
    fn wr_id(&self, idx: u32) -> u64 {
        ((self.slots[idx as usize].generation.load(Ordering::Acquire) as u64) << 32) | idx as u64
    }

    fn release(&self, idx: u32, st: &mut SlotState) {
        st.active = false;
        st.abandoned = false;
        st.result = None;
        st.waker = None;
        st.keep = None;
        self.slots[idx as usize]
            .generation
            .fetch_add(1, Ordering::AcqRel);
        let _ = self.free.push(idx);
        if self.has_waiting.swap(false, Ordering::AcqRel) {
            for w in self.waiting.lock().drain(..) {
                w.wake();
            }
        }
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
            || st.result.is_some()
        {
            return; // stale, or a later completion of a batch that already finished
        }
        if st.abandoned {
            self.release(idx, &mut st); // the future is gone: release its buffer now
            return;
        }
        st.result = Some(*c);
        if let Some(w) = st.waker.take() {
            w.wake();
        }
    }

    fn poll_once(&self, cq: &Cq, buf: &mut [Completion]) -> usize {
        match cq.poll(buf) {
            Ok(n) => {
                for c in &buf[..n] {
                    self.dispatch(c);
                }
                n
            }
            Err(e) => {
                tracing::error!("completion queue failed: {e}");
                0
            }
        }
    }
}

/// Dispatches completions of its CQs to the futures of [`AsyncQp`] operations.
pub struct Engine {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Engine {
    /// An engine over `cqs` (every CQ the async QPs use, send and receive).
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
        let shared = Arc::new(Shared {
            slots,
            free,
            cqs,
            stop: AtomicBool::new(false),
            waiting: Mutex::new(Vec::new()),
            has_waiting: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        if cfg.busy_poll_threads {
            for i in 0..shared.cqs.len() {
                let s = shared.clone();
                threads.push(
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
        Ok(Self { shared, threads })
    }

    /// Polls every CQ once and dispatches what it finds (caller-driven mode); returns how
    /// many completions it dispatched.
    pub fn progress(&self) -> usize {
        let mut buf = [Completion::EMPTY; 32];
        self.shared
            .cqs
            .iter()
            .map(|cq| self.shared.poll_once(cq, &mut buf))
            .sum()
    }

    /// Wraps a connected QP whose CQs belong to this engine.
    pub fn wrap(&self, qp: Qp) -> AsyncQp {
        AsyncQp {
            qp,
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn busy_poll(s: &Shared, cq: usize) {
    let mut buf = [Completion::EMPTY; 32];
    let mut idle = 0u32;
    while !s.stop.load(Ordering::Acquire) {
        if s.poll_once(&s.cqs[cq], &mut buf) > 0 {
            idle = 0;
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

/// What a future still has to post (kept until there is a slot and send-queue space).
enum ToPost {
    Send {
        ops: Vec<(WrOp, Sge)>,
        keep: LocalBuf,
    },
    Recv {
        sge: Sge,
        keep: LocalBuf,
    },
}

/// An operation in flight: resolves to its completion, or to the typed error of an error
/// completion. Dropping it never frees its buffer early.
pub struct OpFuture<'q> {
    qp: &'q AsyncQp,
    pending: Option<ToPost>,
    slot: Option<(u32, u32)>,
    error: Option<Error>,
}

impl<'q> OpFuture<'q> {
    fn to_post(qp: &'q AsyncQp, todo: ToPost) -> Self {
        OpFuture {
            qp,
            pending: Some(todo),
            slot: None,
            error: None,
        }
    }

    fn failed(qp: &'q AsyncQp, e: Error) -> Self {
        OpFuture {
            qp,
            pending: None,
            slot: None,
            error: Some(e),
        }
    }

    fn try_post(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let s = &self.qp.shared;
        let Some(idx) = s.free.pop() else {
            s.waiting.lock().push(cx.waker().clone());
            s.has_waiting.store(true, Ordering::Release);
            // A slot may have been freed between pop and push: try once more.
            return match s.free.pop() {
                Some(i) => self.post_with(i, cx),
                None => Poll::Pending,
            };
        };
        self.post_with(idx, cx)
    }

    fn post_with(&mut self, idx: u32, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let s = &self.qp.shared;
        let wr_id = s.wr_id(idx);
        let slot = &s.slots[idx as usize];
        let todo = self.pending.take().expect("posting once");
        {
            let mut st = slot.state.lock();
            st.active = true;
            st.waker = Some(cx.waker().clone());
        }
        let (res, keep) = match todo {
            ToPost::Send { ops, keep } => {
                let sges: Vec<[Sge; 1]> = ops.iter().map(|(_, g)| [*g]).collect();
                let last = ops.len() - 1;
                let wrs: Vec<SendWr> = ops
                    .iter()
                    .zip(&sges)
                    .enumerate()
                    .map(|(i, ((op, _), sg))| SendWr {
                        wr_id,
                        op: *op,
                        sg_list: sg,
                        signaled: i == last,
                    })
                    .collect();
                (self.qp.qp.post_send(&wrs), ToPost::Send { ops, keep })
            }
            ToPost::Recv { sge, keep } => (
                self.qp.qp.post_recv(&[RecvWr {
                    wr_id,
                    sg_list: &[sge],
                }]),
                ToPost::Recv { sge, keep },
            ),
        };
        match res {
            Ok(()) => {
                let keep = match keep {
                    ToPost::Send { keep, .. } | ToPost::Recv { keep, .. } => keep,
                };
                slot.state.lock().keep = Some(keep);
                self.slot = Some((idx, (wr_id >> 32) as u32));
                Poll::Ready(Ok(()))
            }
            Err(Error::QueueFull { .. }) => {
                // Backpressure: give the slot back and wait for completions to make room.
                let mut st = slot.state.lock();
                s.release(idx, &mut st);
                drop(st);
                self.pending = Some(keep);
                s.waiting.lock().push(cx.waker().clone());
                s.has_waiting.store(true, Ordering::Release);
                // Completions that freed room before we registered would not wake us.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(e) => {
                let mut st = slot.state.lock();
                s.release(idx, &mut st);
                Poll::Ready(Err(e))
            }
        }
    }
}

impl Future for OpFuture<'_> {
    type Output = Result<Completion>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(e) = self.error.take() {
            return Poll::Ready(Err(e));
        }
        if self.pending.is_some() {
            match self.try_post(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
        }
        let Some((idx, _)) = self.slot else {
            return Poll::Ready(Err(Error::InvalidArgument(
                "the operation already finished".into(),
            )));
        };
        let s = &self.qp.shared;
        let mut st = s.slots[idx as usize].state.lock();
        match st.result.take() {
            Some(c) => {
                s.release(idx, &mut st);
                drop(st);
                self.slot = None;
                Poll::Ready(if c.status == WcStatus::Success {
                    Ok(c)
                } else {
                    Err(Error::Completion {
                        status: c.status,
                        wr_id: c.wr_id,
                    })
                })
            }
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for OpFuture<'_> {
    fn drop(&mut self) {
        if let Some((idx, _)) = self.slot.take() {
            let s = &self.qp.shared;
            let mut st = s.slots[idx as usize].state.lock();
            if st.result.is_some() {
                s.release(idx, &mut st); // completed but never polled again
            } else {
                st.abandoned = true; // the engine releases slot and buffer on completion
                st.waker = None;
            }
        }
    }
}

/// A QP with async one-sided and two-sided operations.
pub struct AsyncQp {
    qp: Qp,
    shared: Arc<Shared>,
}

impl AsyncQp {
    /// The wrapped QP.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    fn op(&self, op: WrOp, local: LocalBuf, offset: usize, len: u32) -> OpFuture<'_> {
        match local.sge(offset, len) {
            Ok(sge) => OpFuture::to_post(
                self,
                ToPost::Send {
                    ops: vec![(op, sge)],
                    keep: local,
                },
            ),
            Err(e) => OpFuture::failed(self, e),
        }
    }

    /// RDMA WRITE of `len` bytes at `offset` of `local` to `remote`.
    pub fn write(
        &self,
        local: LocalBuf,
        offset: usize,
        len: u32,
        remote: RemoteAddr,
    ) -> OpFuture<'_> {
        self.op(WrOp::Write { remote, imm: None }, local, offset, len)
    }

    /// RDMA READ of `len` bytes from `remote` into `offset` of `local`.
    pub fn read(
        &self,
        local: LocalBuf,
        offset: usize,
        len: u32,
        remote: RemoteAddr,
    ) -> OpFuture<'_> {
        self.op(WrOp::Read { remote }, local, offset, len)
    }

    /// Compare-and-swap; the old value lands at `offset` of `local` (8 bytes).
    pub fn compare_and_swap(
        &self,
        local: LocalBuf,
        offset: usize,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> OpFuture<'_> {
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
    pub fn fetch_and_add(
        &self,
        local: LocalBuf,
        offset: usize,
        remote: RemoteAddr,
        add: u64,
    ) -> OpFuture<'_> {
        self.op(WrOp::FetchAdd { remote, add }, local, offset, 8)
    }

    /// SEND of `len` bytes at `offset` of `local`.
    pub fn send(&self, local: LocalBuf, offset: usize, len: u32) -> OpFuture<'_> {
        self.op(WrOp::Send { imm: None }, local, offset, len)
    }

    /// Posts a receive into `len` bytes at `offset` of `local`; resolves when a message lands.
    pub fn recv(&self, local: LocalBuf, offset: usize, len: u32) -> OpFuture<'_> {
        match local.sge(offset, len) {
            Ok(sge) => OpFuture::to_post(self, ToPost::Recv { sge, keep: local }),
            Err(e) => OpFuture::failed(self, e),
        }
    }

    /// Posts `ops` (operation, buffer, offset, length) as one list with one doorbell, only
    /// the last signalled; resolves when the last completes (RC order: all are done), or
    /// with the first error completion.
    pub fn batch(&self, ops: Vec<(WrOp, LocalBuf, usize, u32)>) -> OpFuture<'_> {
        if ops.is_empty() {
            return OpFuture::failed(self, Error::InvalidArgument("an empty batch".into()));
        }
        let mut list = Vec::with_capacity(ops.len());
        let mut keep = Vec::with_capacity(ops.len());
        for (op, local, offset, len) in ops {
            match local.sge(offset, len) {
                Ok(sge) => list.push((op, sge)),
                Err(e) => return OpFuture::failed(self, e),
            }
            keep.push(local);
        }
        OpFuture::to_post(
            self,
            ToPost::Send {
                ops: list,
                keep: LocalBuf::Many(keep),
            },
        )
    }
}
