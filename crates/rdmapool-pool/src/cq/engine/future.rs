//! The future of one operation (or one batch): waits for room, posts, then waits in its slot.

use super::qp_shared::{Credits, QpShared};
use super::slots::ANY_SOURCE;
use crate::fabric::provider::BindSpec;
use crate::fabric::{Completion, Mw, Qp, RecvWr, SendWr, Sge, WcOpcode, WrOp};
use crate::util::spin::PollPause;
use crate::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// What a finished operation reports: its work completion, less the engine's own work
/// request id (an operation is named by its future, not by an id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpCompletion {
    /// What completed (for a batch: its last request).
    pub opcode: WcOpcode,
    /// Bytes transferred (for receives: bytes placed in the buffer).
    pub byte_len: u32,
    /// Immediate data carried by the SEND a receive consumed.
    pub imm: Option<u32>,
    /// The local QP the operation was posted on.
    pub qp_num: u32,
}

impl From<Completion> for OpCompletion {
    #[inline]
    fn from(c: Completion) -> Self {
        Self {
            opcode: c.opcode,
            byte_len: c.byte_len,
            imm: c.imm,
            qp_num: c.qp_num,
        }
    }
}

/// The work requests of an operation, without their buffers.
pub(super) enum Spec {
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
    #[inline]
    fn entries(&self) -> u32 {
        match self {
            Spec::Batch(ops) => ops.len() as u32,
            _ => 1,
        }
    }

    #[inline]
    fn is_recv(&self) -> bool {
        matches!(self, Spec::Recv { .. })
    }

    /// Posts with one doorbell; only the last send is signalled. No heap allocation for a
    /// single operation.
    fn post(&self, qp: &Qp, wr_id: u64) -> Result<()> {
        let posted = match self {
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
        };
        Ok(posted?)
    }
}

/// Where an operation's future is: a plain value, so moving between stages drops nothing
/// (what a stage holds is in the future's own fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Refused before posting (the error is in `refused`).
    Refused,
    /// Waiting for a slot and queue room (its work requests are in `spec`).
    ToPost,
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
    qp: &'q Arc<QpShared>,
    stage: Stage,
    /// The work requests, until posted.
    spec: Option<Spec>,
    /// Why it was refused before posting (boxed: an error is several times the size of a
    /// spec, and the future is moved on every hot path).
    refused: Option<Box<Error>>,
    buf: Option<B>,
}

// The buffer is never pinned: it is moved out when the future resolves.
impl<B: Send + 'static> Unpin for OpFuture<'_, B> {}

impl<'q, B: Send + 'static> OpFuture<'q, B> {
    #[inline]
    pub(super) fn to_post(qp: &'q Arc<QpShared>, spec: Spec, buf: B) -> Self {
        let depth = qp.depth(spec.is_recv());
        if spec.entries() > depth {
            return Self::failed(
                qp,
                Error::Core(crate::CoreError::OutOfLimits {
                    what: "work requests posted at once",
                    value: spec.entries() as u64,
                    min: 1,
                    max: depth as u64,
                }),
                buf,
            );
        }
        OpFuture {
            qp,
            stage: Stage::ToPost,
            spec: Some(spec),
            refused: None,
            buf: Some(buf),
        }
    }

    #[inline]
    pub(super) fn failed(qp: &'q Arc<QpShared>, e: Error, buf: B) -> Self {
        OpFuture {
            qp,
            stage: Stage::Refused,
            spec: None,
            refused: Some(Box::new(e)),
            buf: Some(buf),
        }
    }

    /// Takes `n` queue entries and a slot, or registers to be woken when they free up.
    fn reserve(&self, recv: bool, n: u32, cx: &mut Context<'_>) -> Option<u32> {
        let q = self.qp;
        let table = &q.engine.table;
        for attempt in 0..2 {
            if q.take(recv, n) {
                if let Some(idx) = table.acquire() {
                    return Some(idx);
                }
                q.give(recv, n);
            }
            if attempt == 0 {
                // Register, then look again: room freed in between would not wake us.
                table.wait_for_room(cx.waker());
            }
        }
        None
    }

    /// Posts, or waits for room. Ready(Ok) means posted (the future is now `Posted`).
    fn try_post(&mut self, spec: Spec, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let q = self.qp;
        let s = &q.engine;
        if q.cq != ANY_SOURCE && s.broken[q.cq].load(Ordering::Acquire) {
            return Poll::Ready(Err(Error::Core(crate::CoreError::CqOverrun {
                depth: s.cq(q.cq).depth(),
            })));
        }
        let (recv, n) = (spec.is_recv(), spec.entries());
        let Some(idx) = self.reserve(recv, n, cx) else {
            self.spec = Some(spec);
            return Poll::Pending;
        };
        // Armed from inside this poll: until it ends a pending poll, its completion wakes
        // nobody (the checks below find it).
        let wr_id = s
            .table
            .arm_in_poll(idx, cx.waker(), q.cq, Credits { recv, n }, true);
        match spec.post(&q.qp, wr_id) {
            Ok(()) => {
                self.stage = Stage::Posted(idx);
                Poll::Ready(Ok(()))
            }
            Err(Error::Core(crate::CoreError::QueueFull { .. })) => {
                // Someone posted on the raw QP too: wait for completions to make room.
                s.table.disarm(idx, q);
                self.spec = Some(spec);
                s.table.wait_for_room(cx.waker());
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(e) => {
                s.table.disarm(idx, q);
                Poll::Ready(Err(e))
            }
        }
    }

    fn resolve(&mut self, r: Result<OpCompletion>) -> Poll<(Result<OpCompletion>, B)> {
        self.stage = Stage::Finished;
        let buf = self.buf.take().expect("OpFuture polled after it resolved");
        Poll::Ready((r, buf))
    }
}

impl<B: Send + 'static> Future for OpFuture<'_, B> {
    type Output = (Result<OpCompletion>, B);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let idx = match self.stage {
            Stage::Posted(idx) => idx,
            Stage::ToPost => {
                let spec = self
                    .spec
                    .take()
                    .expect("a future not yet posted holds its work requests");
                // Under a busy-polling thread, the thread keeps off the CQ from before the
                // post (an intra-host request completes during it) to the look after it.
                let _looking = self.qp.engine.keep_threads_off();
                return self.post_and_look(spec, cx);
            }
            Stage::Refused => {
                let e = self
                    .refused
                    .take()
                    .expect("a refused future holds its error");
                return self.resolve(Err(*e));
            }
            Stage::Finished => panic!("OpFuture polled after it resolved"),
        };
        let q = self.qp;
        match q.engine.table.look(idx, q) {
            Some(outcome) => self.resolve(outcome.into_result().map(OpCompletion::from)),
            None => self.spin_then_park(idx, cx),
        }
    }
}

impl<B: Send + 'static> OpFuture<'_, B> {
    /// The first poll: posts (or waits for room), then looks once for the completion.
    fn post_and_look(
        &mut self,
        spec: Spec,
        cx: &mut Context<'_>,
    ) -> Poll<<Self as Future>::Output> {
        // Posted: the slot holds our waker, so a completion wakes us.
        match self.try_post(spec, cx) {
            Poll::Ready(Ok(())) => {
                if self.qp.engine.future_spin().is_zero() {
                    return self.park(cx);
                }
                // One look at the CQ, no spin: a request that completed while it
                // was posted (the intra-host path) resolves now, without a re-poll
                // (which on a tokio runtime polls the reactor: a system call).
                if let Poll::Ready(out) = self.look_once() {
                    return Poll::Ready(out);
                }
                // Not yet: the task may post more operations in this same poll (a
                // join of several), and spinning now would hold them back. Asking
                // to be polled again costs a re-poll, not a park; the next poll
                // spins if this is still the only operation in flight.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => self.resolve(Err(e)),
        }
    }

    /// Just posted as the only operation in flight: polls its CQ (every CQ, for a wrapped
    /// QP) once and resolves if its completion is there (or a busy-polling thread already
    /// took it: being in its poll, it was not woken for it). With others in flight it
    /// leaves the CQs to whoever drives them. If it stays pending its caller asks to be
    /// polled again at once, so the operation stays "in its poll" until then: a completion
    /// in between (a busy-polling thread's) wakes nobody, the next poll finds it.
    fn look_once(&mut self) -> Poll<<Self as Future>::Output> {
        let q = self.qp;
        let s = &q.engine;
        let Stage::Posted(idx) = self.stage else {
            return Poll::Pending;
        };
        if s.table.in_flight() <= 1 {
            if q.cq == ANY_SOURCE {
                s.poll_source_of(ANY_SOURCE, &mut [Completion::EMPTY; 2]);
            } else if let Some(c) = s.poll_one(q.cq) {
                // Its own completion (the usual case here) is taken straight, without being
                // recorded in the slot for the look below; anyone else's is dispatched.
                if c.wr_id as u32 == idx {
                    if let Some(outcome) = s.table.finish_own(idx, &c, q) {
                        return self.resolve(outcome.into_result().map(OpCompletion::from));
                    }
                } else {
                    s.table.dispatch(&c);
                }
            }
        }
        match s.table.look(idx, q) {
            Some(outcome) => self.resolve(outcome.into_result().map(OpCompletion::from)),
            None => Poll::Pending,
        }
    }

    /// The only operation in flight polls its CQ (every CQ, for a wrapped QP) for its own
    /// completion for up to [`super::EngineConfig::spin`] before it parks: for one
    /// operation at a time, a wake-up (another thread's, or the completion channel's) costs
    /// more than the round trip itself. Past its first microseconds it yields between polls
    /// ([`PollPause`]), so the threads it waits for get a core when all are busy.
    fn spin_then_park(&mut self, idx: u32, cx: &mut Context<'_>) -> Poll<<Self as Future>::Output> {
        let q = self.qp;
        let s = &q.engine;
        if s.future_spin().is_zero() || s.table.in_flight() > 1 {
            return self.park(cx);
        }
        if s.event_driven {
            s.spinners.fetch_add(1, Ordering::SeqCst);
        }
        let out = {
            let _spinning = s.keep_threads_off();
            self.spin(idx)
        };
        if s.event_driven {
            s.spinners.fetch_sub(1, Ordering::SeqCst);
            // Others posted meanwhile may have parked on an unarmed CQ (the event loop
            // does not arm one while somebody spins): arm for them.
            fence(Ordering::SeqCst);
            if s.table.in_flight() > out.is_pending() as usize {
                s.arm_all();
            }
        }
        match out {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => self.park(cx),
        }
    }

    /// Leaves the completion to whoever drives the CQs. In event mode the CQs this
    /// operation completes on must raise an event first: arms them if nobody did, then
    /// looks once for completions that arrived before the arm (they raise none).
    fn park(&mut self, cx: &mut Context<'_>) -> Poll<<Self as Future>::Output> {
        let q = self.qp;
        let s = &q.engine;
        let Stage::Posted(idx) = self.stage else {
            return Poll::Pending;
        };
        if s.event_driven {
            // Pairs with the event loop's fence: either the loop sees this operation in
            // flight (and arms the CQ), or this sees the CQ unarmed.
            fence(Ordering::SeqCst);
            let armed_now = if q.cq == ANY_SOURCE {
                (0..s.pool.cqs().len()).fold(false, |any, cq| s.ensure_armed(cq) | any)
            } else {
                s.ensure_armed(q.cq)
            };
            if armed_now {
                // Every completion that came before the arm, not only this operation's: they
                // raise no event (rxe, ibv_req_notify_cq(3)), and one left in the CQ would
                // wait for a later completion that may never come (the rest of a join of 8
                // hung on rxe, 1 run in 6).
                s.drain_source_of(q.cq);
            }
        }
        // Ends the poll: the waker recorded, a completion from now on wakes it.
        match s.table.poll_op(idx, q, cx.waker()) {
            Poll::Ready(outcome) => self.resolve(outcome.into_result().map(OpCompletion::from)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// [`Self::spin_then_park`]'s spin: Ready with the outcome, or Pending when the spin
    /// ran out or others are in flight.
    fn spin(&mut self, idx: u32) -> Poll<<Self as Future>::Output> {
        let q = self.qp;
        let s = &q.engine;
        let mut until = None; // read the clock only once the first look failed
        let mut buf = [Completion::EMPTY; 2];
        let mut pause = PollPause::new();
        loop {
            s.poll_source_of(q.cq, &mut buf);
            if let Some(outcome) = s.table.look(idx, q) {
                return self.resolve(outcome.into_result().map(OpCompletion::from));
            }
            let now = std::time::Instant::now();
            if now >= *until.get_or_insert(now + s.future_spin()) || s.table.in_flight() > 1 {
                return Poll::Pending;
            }
            pause.pause();
        }
    }
}

impl<B: Send + 'static> Drop for OpFuture<'_, B> {
    fn drop(&mut self) {
        if let Stage::Posted(idx) = self.stage {
            let (qp, buf) = (self.qp, &mut self.buf);
            if qp.engine.event_driven {
                // Its completion must still reach the engine to free the slot and buffer.
                fence(Ordering::SeqCst);
                qp.engine.arm_all();
            }
            // The engine releases slot, entries and buffer on completion; until then the
            // slot keeps the QP and the buffer alive (the one allocation on this path).
            qp.engine
                .table
                .abandon(idx, qp, || buf.take().map(|b| Box::new(b) as Box<dyn Send>));
        }
    }
}
