//! The slot table: every operation in flight owns one slot, named on the wire by its
//! `wr_id = generation << 32 | index`, so a completion finds its operation without a heap
//! allocation or a global lock.
//!
//! The table knows nothing of CQs, QPs or executors. Completions come from a
//! [`CompletionSource`]; what an operation holds besides its slot (queue entries) goes back
//! to its [`Holder`]; sources are told apart by an index only, so an overrun can fail the
//! operations that waited on one. The parts that race — the hot-slot exchange, the waiters'
//! store-fence-load handshake, a completion against an abandoning drop, stale completions of
//! an earlier generation — are checked with loom
//! (`RUSTFLAGS="--cfg loom" cargo test -p rdmapool-pool --release --lib cq::engine::slots`).

use crate::fabric::{Completion, WcStatus};
use crate::{Error, Result};
use std::sync::Arc;
use std::task::{Poll, Waker};

use crate::loom::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use crate::loom::sync::{lock, BoundedQueue as FreeList, Mutex, MutexGuard};

/// Where completions come from (a CQ, or a fake one in tests).
pub(crate) trait CompletionSource {
    /// Moves up to `out.len()` completions into `out`; returns how many.
    /// [`CoreError::CqOverrun`](crate::CoreError::CqOverrun) means completions may have been lost.
    fn poll(&self, out: &mut [Completion]) -> Result<usize>;
}

impl CompletionSource for crate::fabric::Cq {
    #[inline]
    fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        Ok(crate::fabric::Cq::poll(self, out)?)
    }
}

/// The owner of operations (a QP): what an operation holds besides its slot goes back to it
/// when the slot is released.
pub(crate) trait Holder: Send + Sync + 'static {
    /// What one operation holds (queue entries).
    type Lease: Copy + Default + Send;
    /// Takes back what an operation held.
    fn give_back(&self, lease: Self::Lease);
}

/// A slot's source tag meaning "not known": such operations fail with any overrun.
pub(crate) const ANY_SOURCE: usize = usize::MAX;

/// How an operation ended, as the dispatcher records it.
#[derive(Debug)]
pub(crate) enum Outcome {
    Completed(Completion),
    /// Its source overran (depth): the completion may be lost.
    Overrun(u32),
}

impl Outcome {
    /// The operation's result: its completion, or the error it ended with.
    #[inline]
    pub(crate) fn into_result(self) -> Result<Completion> {
        match self {
            Outcome::Completed(c) if c.status == WcStatus::Success => Ok(c),
            Outcome::Completed(c) => Err(Error::Completion {
                status: c.status,
                opcode: c.opcode,
            }),
            Outcome::Overrun(depth) => Err(Error::Core(crate::CoreError::CqOverrun { depth })),
        }
    }
}

struct SlotState<H: Holder> {
    /// Bumped on every release: a completion of an earlier occupant does not match.
    generation: u32,
    active: bool,
    abandoned: bool,
    outcome: Option<Outcome>,
    waker: Option<Waker>,
    /// The future is inside its poll (between arming, or [`SlotTable::look`], and the
    /// [`SlotTable::poll_op`] it ends a pending poll with): a completion only records its
    /// outcome, which the future's own checks find, and wakes nobody. A wake-up from
    /// another thread (a busy-polling one) costs that thread a system call and the task a
    /// second poll, for a completion its future is already looking for.
    in_poll: bool,
    /// The buffer of an operation whose future was dropped in flight, kept until the
    /// completion arrives (a live future holds its buffer itself).
    keep: Option<Box<dyn Send>>,
    /// The holder the lease goes back to, kept alive under the request: set when the future
    /// ends a poll pending (so a completion gives the lease back when it is dispatched,
    /// whether or not anyone polls the future again), or is dropped in flight. A future
    /// that finds its completion within its first poll never clones it.
    owner: Option<Arc<H>>,
    lease: H::Lease,
    /// The source whose completion ends the operation (`ANY_SOURCE` if not known).
    source: usize,
}

impl<H: Holder> Default for SlotState<H> {
    fn default() -> Self {
        Self {
            generation: 0,
            active: false,
            abandoned: false,
            outcome: None,
            waker: None,
            in_poll: false,
            keep: None,
            owner: None,
            lease: H::Lease::default(),
            source: ANY_SOURCE,
        }
    }
}

/// Held for a few field moves only, never across a call that may block, wake a thread or
/// drop a buffer.
type SlotGuard<'a, H> = MutexGuard<'a, SlotState<H>>;

/// A fixed table of operation slots with a free list and waiters for room.
pub(crate) struct SlotTable<H: Holder> {
    slots: Box<[Mutex<SlotState<H>>]>,
    free: FreeList,
    /// The slot freed last (index + 1; 0 = none), handed out first: with few operations in
    /// flight the same cache-hot slot is reused instead of cycling through the table.
    hot: AtomicU32,
    /// Futures waiting for a free slot or for their holder's room (touched only when there
    /// are some).
    waiting: Mutex<Vec<Waker>>,
    has_waiting: AtomicBool,
}

impl<H: Holder> SlotTable<H> {
    /// A table of `n` slots (`1..=u32::MAX`, checked by the caller), all free.
    pub(crate) fn new(n: usize) -> Self {
        let free = FreeList::new(n);
        for i in 0..n as u32 {
            free.push(i);
        }
        Self {
            slots: (0..n).map(|_| Mutex::new(SlotState::default())).collect(),
            free,
            hot: AtomicU32::new(0),
            waiting: Mutex::new(Vec::new()),
            has_waiting: AtomicBool::new(false),
        }
    }

    /// Slots taken (including those of abandoned operations).
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        let hot = (self.hot.load(Ordering::Acquire) != 0) as usize;
        self.slots.len() - self.free.len() - hot
    }

    /// Takes a free slot (the hot one first).
    #[inline]
    pub(crate) fn acquire(&self) -> Option<u32> {
        match self.hot.swap(0, Ordering::AcqRel) {
            0 => self.free.pop(),
            h => Some(h - 1),
        }
    }

    #[inline]
    fn put(&self, idx: u32) {
        if self
            .hot
            .compare_exchange(0, idx + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            self.free.push(idx);
        }
    }

    /// Registers `waker` to be woken when a slot or a holder's room frees up.
    /// The waiter's half of a store-fence-load handshake with [`Self::wake_waiters`]: it
    /// announces itself, then (its caller) looks for room again. With a SeqCst fence on both
    /// sides, either the waker sees the announcement or the waiter sees the room, so no
    /// wake-up is lost, and the common path (nobody waiting) only reads the flag: no cache
    /// line bouncing between threads per operation.
    pub(crate) fn wait_for_room(&self, waker: &Waker) {
        lock(&self.waiting).push(waker.clone());
        self.has_waiting.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Called after room was made (a slot or a lease given back).
    #[inline]
    pub(crate) fn wake_waiters(&self) {
        fence(Ordering::SeqCst);
        if self.has_waiting.load(Ordering::Relaxed)
            && self.has_waiting.swap(false, Ordering::AcqRel)
        {
            for w in lock(&self.waiting).drain(..) {
                w.wake();
            }
        }
    }

    #[inline]
    fn slot(&self, idx: u32) -> SlotGuard<'_, H> {
        lock(&self.slots[idx as usize])
    }

    /// Fills slot `idx` (just acquired) for an operation about to be posted, and returns the
    /// `wr_id` to post it with. Filled before posting: the completion may arrive before the
    /// post returns.
    #[cfg(test)]
    pub(crate) fn arm(&self, idx: u32, waker: &Waker, source: usize, lease: H::Lease) -> u64 {
        self.arm_in_poll(idx, waker, source, lease, false)
    }

    /// [`Self::arm`] from inside the future's poll (`in_poll`): until the future ends a
    /// pending poll with [`Self::poll_op`], its completion wakes nobody.
    #[inline]
    pub(crate) fn arm_in_poll(
        &self,
        idx: u32,
        waker: &Waker,
        source: usize,
        lease: H::Lease,
        in_poll: bool,
    ) -> u64 {
        let mut st = self.slot(idx);
        st.active = true;
        st.in_poll = in_poll;
        st.waker = Some(waker.clone());
        st.source = source;
        st.lease = lease;
        ((st.generation as u64) << 32) | idx as u64
    }

    /// Gives slot `idx` back after its post failed (nothing of it reached the device).
    #[inline]
    pub(crate) fn disarm(&self, idx: u32, holder: &H) {
        self.release(idx, self.slot(idx), Some(holder));
    }

    /// The future's poll: its outcome (and the slot released), or its waker recorded and
    /// the future out of its poll (a completion from now on wakes it, and gives its lease
    /// back to `holder` at once: see [`Self::hold`]).
    #[inline]
    pub(crate) fn poll_op(&self, idx: u32, holder: &Arc<H>, waker: &Waker) -> Poll<Outcome> {
        let mut st = self.slot(idx);
        match st.outcome.take() {
            Some(outcome) => {
                self.release(idx, st, Some(holder));
                Poll::Ready(outcome)
            }
            None => {
                Self::hold(&mut st, holder);
                st.in_poll = false;
                if !st.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    st.waker = Some(waker.clone());
                }
                Poll::Pending
            }
        }
    }

    /// The future's look while inside its poll: its outcome (and the slot released), or
    /// nothing, and the future marked in its poll (its lease given back to `holder` on
    /// dispatch from now on: see [`Self::hold`]). It must end a pending poll with
    /// [`Self::poll_op`].
    #[inline]
    pub(crate) fn look(&self, idx: u32, holder: &Arc<H>) -> Option<Outcome> {
        let mut st = self.slot(idx);
        match st.outcome.take() {
            Some(outcome) => {
                self.release(idx, st, Some(holder));
                Some(outcome)
            }
            None => {
                Self::hold(&mut st, holder);
                st.in_poll = true;
                None
            }
        }
    }

    /// The slot keeps its holder from the first look that found no outcome: from then on a
    /// completion gives the operation's lease back as it is dispatched, not when its future
    /// is next polled. A queue entry is free once its completion was polled, and a future
    /// set aside unpolled (one of a batch nobody drives for a while) must not keep it from
    /// other operations; it could keep them for good. A future that finds its completion in
    /// its first look never clones the holder.
    #[inline]
    fn hold(st: &mut SlotGuard<'_, H>, holder: &Arc<H>) {
        if st.owner.is_none() {
            st.owner = Some(holder.clone());
        }
    }

    /// The future's drop while posted. If the operation already ended, the slot is released
    /// now; otherwise the slot takes `holder` and the buffer `keep` makes (the one allocation
    /// on this path) and the completion releases them.
    pub(crate) fn abandon(
        &self,
        idx: u32,
        holder: &Arc<H>,
        keep: impl FnOnce() -> Option<Box<dyn Send>>,
    ) {
        let mut st = self.slot(idx);
        if st.outcome.is_some() {
            self.release(idx, st, Some(holder)); // completed, never polled again
        } else {
            st.abandoned = true;
            st.waker = None;
            if st.owner.is_none() {
                st.owner = Some(holder.clone());
            }
            st.keep = keep();
        }
    }

    /// Gives back what the operation held (its lease to `holder`, or to the owner of an
    /// abandoned operation; the buffer) and frees the slot. Called with the slot locked.
    #[inline]
    fn release(&self, idx: u32, mut st: SlotGuard<'_, H>, holder: Option<&H>) {
        let owner = st.owner.take();
        let lease = std::mem::take(&mut st.lease);
        if let Some(h) = holder.or(owner.as_deref()) {
            h.give_back(lease);
        }
        st.active = false;
        st.in_poll = false;
        st.abandoned = false;
        st.outcome = None;
        st.source = ANY_SOURCE;
        st.generation = st.generation.wrapping_add(1);
        let waker = st.waker.take();
        let keep = st.keep.take();
        drop(st);
        // Outside the lock: dropping a buffer may deregister it, waking may enter the kernel.
        self.put(idx);
        self.wake_waiters();
        drop((keep, waker, owner));
    }

    /// The future of operation `idx`, inside its poll, took its own completion `c` off the
    /// CQ: its outcome now (and the slot released), without recording it for a later look.
    /// `None` if `c` is stale (an earlier occupant's) or the operation already has an
    /// outcome (which [`Self::look`] then returns).
    #[inline]
    pub(crate) fn finish_own(&self, idx: u32, c: &Completion, holder: &H) -> Option<Outcome> {
        let st = self.slot(idx);
        let generation = (c.wr_id >> 32) as u32;
        if !st.active || st.generation != generation || st.outcome.is_some() || st.abandoned {
            return None;
        }
        self.release(idx, st, Some(holder));
        Some(Outcome::Completed(*c))
    }

    /// Hands completion `c` to the operation its `wr_id` names; stale ones (an earlier
    /// generation, an unknown slot, a later completion of a batch that already ended) are
    /// ignored.
    #[inline]
    pub(crate) fn dispatch(&self, c: &Completion) {
        let idx = (c.wr_id & 0xffff_ffff) as u32;
        let generation = (c.wr_id >> 32) as u32;
        let Some(slot) = self.slots.get(idx as usize) else {
            return;
        };
        let mut st = lock(slot);
        if !st.active || st.generation != generation || st.outcome.is_some() {
            return;
        }
        if st.abandoned {
            self.release(idx, st, None); // the future is gone: release its buffer now
            return;
        }
        st.outcome = Some(Outcome::Completed(*c));
        // Its queue entries are free now: back to the holder, whoever polls the future.
        let returned = st.owner.is_some();
        if returned {
            let lease = std::mem::take(&mut st.lease);
            if let Some(h) = st.owner.as_deref() {
                h.give_back(lease);
            }
        }
        let waker = if st.in_poll {
            None // its future finds it before it ends its poll
        } else {
            st.waker.take()
        };
        drop(st);
        if returned {
            self.wake_waiters();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Polls `src` once into `buf` and dispatches what it returned; returns how many.
    #[inline]
    pub(crate) fn poll_source(
        &self,
        src: &impl CompletionSource,
        buf: &mut [Completion],
    ) -> Result<usize> {
        let n = src.poll(buf)?;
        for c in &buf[..n] {
            self.dispatch(c);
        }
        Ok(n)
    }

    /// Fails every pending operation waiting on `source` (and those whose source is not
    /// known) with an overrun of `depth`: their completions may be lost. The buffers of
    /// abandoned ones are leaked, not freed: a request whose completion was lost may still
    /// write them.
    pub(crate) fn fail_source(&self, source: usize, depth: u32) {
        for (idx, slot) in self.slots.iter().enumerate() {
            let mut st = lock(slot);
            let on_source = st.source == source || st.source == ANY_SOURCE;
            if !st.active || st.outcome.is_some() || !on_source {
                continue;
            }
            if st.abandoned {
                std::mem::forget(st.keep.take());
                self.release(idx as u32, st, None);
                continue;
            }
            st.outcome = Some(Outcome::Overrun(depth));
            if st.in_poll {
                continue;
            }
            let waker = st.waker.take();
            drop(st);
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
