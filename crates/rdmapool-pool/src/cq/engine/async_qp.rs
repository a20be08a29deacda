//! [`AsyncQp`]: a QP with async operations, and its share of the engine (queue credits, the
//! CQ it is bound to).

use super::drivers::Progressors;
use super::future::{OpFuture, Spec};
use super::qp_shared::QpShared;
use super::slots::ANY_SOURCE;
use super::Shared;
use crate::fabric::provider::BindSpec;
use crate::fabric::{AccessFlags, Mw, Qp, RegisteredMemory, RemoteAddr, RemoteRegion, WrOp};
use crate::{Error, Result};
use std::sync::Arc;

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
        AsyncQp {
            inner: Arc::new(QpShared::new(qp, cq, reserved, engine, progressors)),
        }
    }

    /// The wrapped QP.
    pub fn qp(&self) -> &Qp {
        &self.inner.qp
    }

    /// Connects the QP to a peer's endpoint (RESET to RTS).
    pub fn connect(&self, remote: &crate::fabric::Endpoint) -> Result<()> {
        Ok(self.inner.qp.connect(remote)?)
    }

    /// What its send queue and the engine hold now, for a report of an operation that
    /// waits too long: free send-queue entries, the queue's depth, and the operations in
    /// flight on the whole engine.
    pub fn queue_state(&self) -> (u32, u32, usize) {
        (
            self.inner.free(false),
            self.inner.depth(false),
            self.inner.engine.table.in_flight(),
        )
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
            Ok(sge) => OpFuture::to_post(&self.inner, Spec::One { op, sge }, local),
            Err(e) => OpFuture::failed(&self.inner, e.into(), local),
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
            Ok(sge) => OpFuture::to_post(&self.inner, Spec::Recv { sge }, local),
            Err(e) => OpFuture::failed(&self.inner, e.into(), local),
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
                OpFuture::to_post(&self.inner, Spec::Bind { mw, bind }, binding)
            }
            Err(e) => {
                let binding = WindowBinding {
                    mw,
                    addr: 0,
                    len: 0,
                    access,
                };
                OpFuture::failed(&self.inner, e.into(), binding)
            }
        }
    }

    /// Invalidates the window with remote key `rkey` (a local invalidate on this QP's send
    /// queue, in order with what was posted before); peers using it fail from then on.
    pub fn invalidate(&self, rkey: u32) -> OpFuture<'_, ()> {
        OpFuture::to_post(
            &self.inner,
            Spec::Local {
                op: WrOp::LocalInvalidate { rkey },
            },
            (),
        )
    }

    /// Posts `ops` (operation, buffer, offset, length) as one list with one doorbell, only
    /// the last signalled; resolves when the last completes (RC order: all are done), or
    /// with the first error completion, and gives every buffer back in order. At most the
    /// send-queue depth of them. (Views, [`Mr<Shared>`](crate::fabric::Shared), mix regions of every origin.)
    pub fn batch<B: RegisteredMemory + Send + 'static>(
        &self,
        mut ops: Vec<(WrOp, B, usize, u32)>,
    ) -> OpFuture<'_, Vec<B>> {
        if ops.len() == 1 {
            // A list of one posts as one operation (no list to build, here or at the post).
            let (op, local, offset, len) = ops.pop().expect("one work request");
            return match local.sge(offset, len) {
                Ok(sge) => OpFuture::to_post(&self.inner, Spec::One { op, sge }, vec![local]),
                Err(e) => OpFuture::failed(&self.inner, e.into(), vec![local]),
            };
        }
        let mut list = Vec::with_capacity(ops.len());
        let mut keep = Vec::with_capacity(ops.len());
        let mut refused = None;
        for (op, local, offset, len) in ops {
            match local.sge(offset, len) {
                Ok(sge) => list.push((op, sge)),
                Err(e) => refused = refused.or(Some(Error::from(e))),
            }
            keep.push(local);
        }
        if keep.is_empty() {
            refused = Some(Error::Core(crate::CoreError::OutOfLimits {
                what: "work requests in a batch",
                value: 0,
                min: 1,
                max: self.inner.depth(false) as u64,
            }));
        }
        match refused {
            Some(e) => OpFuture::failed(&self.inner, e, keep),
            None => OpFuture::to_post(&self.inner, Spec::Batch(list), keep),
        }
    }
}
