//! [`AsyncQp`]: a QP with async operations, and its share of the engine (queue credits, the
//! CQ it is bound to).

use super::drivers::Progressors;
use super::future::{OpFuture, Spec};
use super::slots::{Holder, ANY_SOURCE};
use super::Shared;
use crate::buf::Buffer;
use crate::fabric::provider::BindSpec;
use crate::fabric::{AccessFlags, Mr, Mw, Qp, RegisteredMemory, RemoteAddr, RemoteRegion, WrOp};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

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

/// A QP's share of the engine: its queues' free entries and the CQ it is bound to.
pub(super) struct QpShared {
    pub(super) qp: Qp,
    /// Free send-queue entries; a post takes as many as it has work requests and the
    /// completion gives them back, so posting never overflows the queue.
    send_credits: AtomicU32,
    send_depth: u32,
    recv_credits: AtomicU32,
    recv_depth: u32,
    /// Index of the CQ in the engine, or `ANY_SOURCE` for a wrapped QP.
    pub(super) cq: usize,
    /// Entries this QP reserved in its CQ (released on drop).
    reserved: u64,
    pub(super) engine: Arc<Shared>,
    _progressors: Arc<Progressors>,
}

/// The queue entries one operation holds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Credits {
    /// On the receive queue (else the send queue).
    pub(super) recv: bool,
    /// How many.
    pub(super) n: u32,
}

impl QpShared {
    #[inline]
    fn credits(&self, recv: bool) -> &AtomicU32 {
        if recv {
            &self.recv_credits
        } else {
            &self.send_credits
        }
    }

    /// The depth of the receive or the send queue.
    #[inline]
    pub(super) fn depth(&self, recv: bool) -> u32 {
        if recv {
            self.recv_depth
        } else {
            self.send_depth
        }
    }

    /// Takes `n` free entries of a queue, if it has them.
    #[inline]
    pub(super) fn take(&self, recv: bool, n: u32) -> bool {
        self.credits(recv)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(n))
            .is_ok()
    }

    /// Gives `n` entries back to a queue.
    #[inline]
    pub(super) fn give(&self, recv: bool, n: u32) {
        self.credits(recv).fetch_add(n, Ordering::AcqRel);
    }
}

impl Holder for QpShared {
    type Lease = Credits;

    #[inline]
    fn give_back(&self, c: Credits) {
        self.give(c.recv, c.n);
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        if self.cq != ANY_SOURCE {
            self.engine.pool.unreserve(self.cq, self.reserved);
        }
    }
}

/// A QP with async one-sided and two-sided operations.
pub struct AsyncQp {
    pub(super) inner: Arc<QpShared>,
}

impl AsyncQp {
    pub(super) fn new(
        qp: Qp,
        cq: usize,
        reserved: u64,
        engine: Arc<Shared>,
        progressors: Arc<Progressors>,
    ) -> Self {
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
                engine,
                _progressors: progressors,
            }),
        }
    }

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
        (self.inner.cq != ANY_SOURCE).then_some(self.inner.cq)
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
