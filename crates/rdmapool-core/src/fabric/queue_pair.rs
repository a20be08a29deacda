//! `Qp`: a reliable-connected queue pair (posting, binding windows, state changes), and the
//! connection manager's state it keeps.

use super::memory::RegisteredMemory;
use super::provider::{BindSpec, QpOps};
use super::recorder::objects::QpTag;
use super::{
    AccessFlags, BoundWindow, Endpoint, Mw, ProviderKind, QpCapacity, QpState, RecvWr,
    RemoteRegion, SendWr, WindowError, WindowTable, WrOp,
};
use crate::{Error, Result};
use std::sync::Arc;

/// A connection manager's state kept with a QP: dropped (disconnecting) before the QP, and
/// the source of the QP's events after establishment.
#[doc(hidden)]
pub trait ConnectionState: Send + Sync {
    /// The connection's next event, waiting up to `timeout`.
    fn wait_event(&self, timeout: std::time::Duration) -> Option<super::QpEvent>;
}

/// A reliable-connected queue pair.
///
/// Dropping it destroys the QP. Invalidate (or drop) the memory windows bound through it
/// first: on rxe (Linux 6.1) a bound window holds a reference to its QP, and destroying the
/// QP then waits about 50 s; the library logs a warning when it sees this happen.
pub struct Qp {
    /// What keeps a connection-manager connection alive; dropped (disconnecting) before the
    /// QP itself is destroyed.
    _connection: Option<Box<dyn ConnectionState>>,
    /// Most SGEs per work request (checked here, for every provider).
    max_sge: usize,
    provider: ProviderKind,
    /// Its PD's memory windows.
    windows: Arc<WindowTable>,
    /// This QP's entry in the per-object metrics, with its context's recorder; declared
    /// before `inner` so that it leaves the listing before the QP number is given back (and
    /// perhaps reused).
    listing: QpTag,
    inner: Box<dyn QpOps>,
}

impl Drop for Qp {
    fn drop(&mut self) {
        let bound = self.windows.lock().bound_through(self.qpn());
        if bound > 0 && self.provider == ProviderKind::Verbs {
            tracing::warn!(
                qpn = self.qpn(),
                windows = bound,
                "destroying a QP with memory windows still bound through it: rxe waits about \
                 50 s for them; invalidate or drop the windows first"
            );
        }
    }
}

impl Qp {
    /// A QP of `provider` on a PD with these windows, listed in the metrics by `listing`.
    pub(super) fn new(
        provider: ProviderKind,
        windows: Arc<WindowTable>,
        max_sge: usize,
        listing: QpTag,
        inner: Box<dyn QpOps>,
    ) -> Qp {
        Qp {
            _connection: None,
            max_sge,
            provider,
            windows,
            listing,
            inner,
        }
    }

    /// Ties a connection manager's state to this QP (it is dropped first).
    #[doc(hidden)]
    pub fn with_connection(mut self, c: Box<dyn ConnectionState>) -> Qp {
        self._connection = Some(c);
        self
    }

    /// The provider's QP object.
    #[doc(hidden)]
    pub fn provider_qp(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn()
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.inner.state()
    }
    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> Endpoint {
        self.inner.endpoint()
    }
    /// RESET -> INIT.
    pub fn modify_to_init(&self) -> Result<()> {
        self.inner.to_init()
    }
    /// INIT -> RTR, bound to `remote`.
    pub fn modify_to_rtr(&self, remote: &Endpoint) -> Result<()> {
        self.inner.to_rtr(remote)
    }
    /// RTR -> RTS.
    pub fn modify_to_rts(&self) -> Result<()> {
        self.inner.to_rts()
    }
    /// How many RDMA READs/atomics the QP may have outstanding as initiator and accepts as
    /// responder, as the device has them now (after RDMA CM negotiated them); None where
    /// the provider has no such limit (soft).
    pub fn rd_atomic(&self) -> Result<Option<(u8, u8)>> {
        self.inner.rd_atomic()
    }
    /// How many work requests its queues hold: exactly what [`QpConfig`](super::QpConfig)
    /// asked for, on every provider (a device that rounds its rings up, as rxe does, is still
    /// held to it).
    ///
    /// ```
    /// use rdmapool::fabric::*;
    /// # fn main() -> rdmapool::Result<()> {
    /// let ctx = Context::open(SoftConfig::default())?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
    /// let cfg = QpConfig { max_send_wr: 4, max_recv_wr: 3, ..QpConfig::default() };
    /// let qp = pd.create_qp(&cq, &cq, &cfg)?;
    /// assert_eq!(qp.capacity(), QpCapacity { send: 4, recv: 3 });
    /// # Ok(()) }
    /// ```
    pub fn capacity(&self) -> QpCapacity {
        self.inner.capacity()
    }
    /// Moves the QP to ERR: everything outstanding and posted later is flushed.
    pub fn modify_to_error(&self) {
        self.inner.set_error()
    }
    /// Waits up to `timeout` for the QP's next asynchronous event (such as
    /// [`QpEvent::PeerDisconnected`](super::QpEvent::PeerDisconnected)); `None` if none
    /// came. Events queue until taken.
    ///
    /// Taking [`QpEvent::PeerDisconnected`](super::QpEvent::PeerDisconnected) moves the QP
    /// to ERR (posted receives flush). Until then the QP is untouched, as in verbs: local
    /// work such as a local invalidate still completes, and a request to the gone peer
    /// fails when it is retried out. Soft QPs report their peer's end on every path; verbs
    /// QPs when RDMA CM connected them (its DISCONNECTED event); a verbs QP connected
    /// another way has no source of such events and always times out.
    pub fn wait_event(&self, timeout: std::time::Duration) -> Option<super::QpEvent> {
        let e = match &self._connection {
            Some(c) => c.wait_event(timeout),
            None => self.inner.wait_event(timeout),
        };
        if e == Some(super::QpEvent::PeerDisconnected) {
            // As an RDMA CM application does on DISCONNECTED: the QP goes to ERR, so what
            // is posted flushes instead of waiting for a peer that is gone.
            self.inner.set_error();
        }
        e
    }
    /// RESET (or INIT) -> INIT -> RTR -> RTS against `remote`.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        if self.state() == QpState::Reset {
            self.modify_to_init()?;
        }
        self.modify_to_rtr(remote)?;
        self.modify_to_rts()
    }
    /// Posts send work requests, in order.
    ///
    /// A malformed request ([`SendWr::validate`]: misaligned atomic, wrong atomic buffer)
    /// rejects the whole list before anything is posted. Errors found while posting (wrong
    /// state, too many SGEs, full queue) are returned and nothing from the failing request on
    /// is posted. Errors found while executing a request arrive as error completions.
    ///
    /// A send-queue entry frees when the completion that retires it is **polled**
    /// ([`Cq::poll`](super::Cq::poll)), on every provider, as on mlx5 and rxe: a signaled
    /// request's own completion, or for an unsignaled one the next signaled completion of this
    /// QP. Posting more than [`QpCapacity::send`] requests without polling fails with
    /// [`Error::QueueFull`] however long ago they finished, and unsignaled requests with no
    /// signaled one after them hold their entries for good: signal at least one request per
    /// queue depth.
    ///
    /// A [`WrOp::LocalInvalidate`] is accepted only for a window bound through this QP and
    /// not yet invalidated ([`Error::Window`] otherwise, and nothing of the list is posted).
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        for wr in wrs {
            wr.validate()?;
            self.check_sges(wr.sg_list.len())?;
        }
        let invalidates = |wr: &SendWr<'_>| match wr.op {
            WrOp::LocalInvalidate { rkey } => Some(rkey),
            _ => None,
        };
        if wrs.iter().any(|wr| invalidates(wr).is_some()) {
            // Only keys of windows bound through this QP reach the device, and each once:
            // rxe 6.1 dereferences NULL invalidating an unbound window. The table stays
            // locked until they are posted; a key handed to the device is forgotten even if
            // the post failed part way (a window wrongly taken for unbound can only fail a
            // later bind, never reach the device's invalidate twice).
            let mut table = self.windows.lock();
            for rkey in wrs.iter().filter_map(invalidates) {
                table.check_invalidate(rkey, self.qpn())?;
            }
            let r = self.post_send_checked(wrs);
            for rkey in wrs.iter().filter_map(invalidates) {
                table.forget(rkey);
            }
            return r;
        }
        self.post_send_checked(wrs)
    }

    fn post_send_checked(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let ops = &self.listing.recorder().ops;
        let sampled = ops.before_post(|| self.inner.qpn(), wrs);
        let r = self.inner.post_send(wrs);
        match (sampled, &r) {
            (Some(key), Err(_)) => ops.post_failed(key),
            (_, Ok(())) => self.listing.recorder().record_sends(wrs.len()),
            _ => {}
        }
        r
    }
    /// Posts a bind of `mw` to `len` bytes at `offset` of `mem` with the rights `access`
    /// (remote ones only; REMOTE_WRITE and REMOTE_ATOMIC need a region with LOCAL_WRITE), on
    /// the send queue in order with the requests before it. The region must allow
    /// [`AccessFlags::MW_BIND`] and belong to this QP's PD. Returns the window as it will be
    /// once the bind's completion ([`super::WcOpcode::BindMw`]) arrives; a bind the device
    /// refuses completes with [`super::WcStatus::MwBindErr`] (and the QP goes to ERR, as on verbs).
    ///
    /// ```
    /// use rdmapool::fabric::*;
    /// # fn main() -> rdmapool::Result<()> {
    /// let ctx = Context::open(SoftConfig::default())?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
    /// let region = pd.alloc_mr(1 << 16, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    /// let (a, b) = (pd.create_qp(&cq, &cq, &QpConfig::default())?, pd.create_qp(&cq, &cq, &QpConfig::default())?);
    /// a.connect(&b.endpoint())?;
    /// b.connect(&a.endpoint())?;
    /// let mw = pd.alloc_mw()?;
    /// let window = b.post_bind_mw(7, &mw, &region, 4096, 256, AccessFlags::REMOTE_READ, true)?;
    /// let done = cq.wait(1, std::time::Duration::from_secs(5))?;
    /// assert_eq!((done[0].opcode, done[0].status), (WcOpcode::BindMw, WcStatus::Success));
    /// assert_eq!((window.region.len, window.region.rkey), (256, mw.rkey()));
    /// // Send window.region to the peer: it reads those 256 bytes, and nothing else.
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &Mw,
        mem: &(impl RegisteredMemory + ?Sized),
        offset: usize,
        len: usize,
        access: AccessFlags,
        signaled: bool,
    ) -> Result<BoundWindow> {
        let bind = BindSpec::new(wr_id, mem, offset, len, access, signaled)?;
        let rkey = self.post_bind(mw, &bind)?;
        Ok(BoundWindow {
            region: RemoteRegion {
                addr: bind.addr,
                len: bind.len,
                rkey,
            },
            access,
        })
    }

    /// Posts a checked bind; the window's rkey once bound.
    #[doc(hidden)]
    pub fn post_bind(&self, mw: &Mw, bind: &BindSpec) -> Result<u32> {
        if mw.provider() != self.provider {
            return Err(Error::Mismatch(format!(
                "a {} QP binds {0} memory windows, not a {} window",
                self.provider,
                mw.provider()
            )));
        }
        if !Arc::ptr_eq(mw.table(), &self.windows) {
            return Err(WindowError::WindowOfAnotherPd.into());
        }
        if bind.len == 0 {
            return Err(WindowError::ZeroLength.into());
        }
        let mut table = self.windows.lock();
        table.check_unbound(mw.rkey())?;
        let rkey = self.inner.post_bind_mw(mw.ops(), bind)?;
        table.bound(rkey, self.qpn());
        Ok(rkey)
    }

    /// Posts receive work requests. A receive-queue entry frees when its completion is
    /// polled, not when a message consumes it (as on mlx5; see [`Qp::post_send`]).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        for wr in wrs {
            self.check_sges(wr.sg_list.len())?;
        }
        self.inner.post_recv(wrs)
    }

    fn check_sges(&self, n: usize) -> Result<()> {
        if n > self.max_sge {
            return Err(Error::OutOfLimits {
                what: "SGEs in a work request",
                value: n as u64,
                min: 0,
                max: self.max_sge as u64,
            });
        }
        Ok(())
    }
}
