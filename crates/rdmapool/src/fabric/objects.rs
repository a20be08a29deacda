//! The public objects: thin, provider-independent handles.

use super::memory::{RegisterError, Registered, RegisteredMemory, StableBuf};
use super::provider::{BindSpec, ContextOps, CqOps, PdOps, QpOps};
use super::recorder::objects::{CqTag, QpTag};
use super::recorder::{ContextMetrics, Recorder};
use super::{
    AccessFlags, BoundWindow, Completion, DeviceInfo, Endpoint, Mr, Mw, ProviderKind, QpCapacity,
    QpConfig, QpState, RecvWr, RemoteRegion, SendWr, WindowError, WindowTable, WrOp,
};
use crate::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An open device: the root of every other object.
///
/// ```
/// use rdmapool::fabric::{Context, SoftConfig};
/// let ctx = Context::open(SoftConfig::default()).unwrap();
/// assert_eq!(ctx.device().name, "soft0");
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<dyn ContextOps>,
    /// What this context's objects did (`Context::metrics`).
    recorder: Arc<Recorder>,
}

impl Context {
    /// A context on an opened provider context (`crate::providers` opens them), with a
    /// recorder of its own.
    pub(crate) fn from_ops(inner: Arc<dyn ContextOps>) -> Self {
        Self {
            inner,
            recorder: Recorder::new(),
        }
    }

    /// What this context's objects did, and the opt-in metrics settings: every PD, region,
    /// CQ and QP opened here, and the registrars, caches, pools, connections and memory
    /// servers built on them, record into it (docs/METRICS.md).
    pub fn metrics(&self) -> ContextMetrics {
        ContextMetrics(self.recorder.clone())
    }

    /// The device's description and limits.
    pub fn device(&self) -> &DeviceInfo {
        self.inner.device()
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            inner: self.inner.alloc_pd()?,
            device: Arc::new(self.device().clone()),
            windows: Arc::default(),
            recorder: self.recorder.clone(),
        })
    }

    /// Creates a completion queue holding up to `depth` completions.
    pub fn create_cq(&self, depth: u32) -> Result<Cq> {
        Ok(Cq {
            inner: self.inner.create_cq(depth)?,
            provider: self.device().provider,
            listing: CqTag::new(&self.recorder, &self.device().name),
        })
    }

    /// Memory regions registered in this context right now.
    pub fn live_regions(&self) -> usize {
        self.inner.live_regions()
    }

    /// Queue pairs created in this context and not yet destroyed, right now.
    pub fn live_qps(&self) -> usize {
        self.inner.live_qps()
    }
}

/// A protection domain: regions and QPs of one PD can only be used together.
#[derive(Clone)]
pub struct Pd {
    inner: Arc<dyn PdOps>,
    /// The device's description and limits (checks common to every provider use them).
    device: Arc<DeviceInfo>,
    /// Its memory windows' bind state, kept here for every provider.
    windows: Arc<WindowTable>,
    /// Its context's recorder.
    recorder: Arc<Recorder>,
}

impl Pd {
    /// The recorder of the context this PD belongs to.
    pub(crate) fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// Allocates `len` zeroed, page-aligned bytes owned by the returned region and registers
    /// them. The memory lives exactly as long as the region.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        let t = std::time::Instant::now();
        let r = self.inner.alloc_mr(len, access);
        self.recorder.record_registration(r.is_ok(), t.elapsed());
        Ok(Mr::from_ops(r?, &self.recorder))
    }

    /// Registers caller-owned memory.
    ///
    /// # Safety
    /// `[addr, addr+len)` must be mapped memory that stays mapped, and is not freed, moved
    /// or reused, until the returned [`Mr`] is dropped. The device and remote peers may read
    /// and write it (as `access` allows) at any time until then, so the caller must not hold
    /// Rust references to it that such writes would invalidate.
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr> {
        let t = std::time::Instant::now();
        // SAFETY: forwarded from the caller's contract.
        let r = unsafe { self.inner.register_raw(addr, len, access) };
        self.recorder.record_registration(r.is_ok(), t.elapsed());
        Ok(Mr::from_ops(r?, &self.recorder))
    }

    /// Registers a buffer the caller owns, safely: the registration takes the buffer and
    /// [`Registered::into_inner`] gives it back after deregistering. On failure the buffer
    /// comes back inside the error.
    ///
    /// ```
    /// use rdmapool::fabric::*;
    /// # fn main() -> rdmapool::Result<()> {
    /// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
    /// let reg = pd.register(vec![0u8; 8192], AccessFlags::LOCAL_WRITE)?;
    /// assert_eq!(reg.len(), 8192);
    /// let err = pd.register(Vec::new(), AccessFlags::LOCAL_WRITE).unwrap_err();
    /// assert!(err.into_inner().is_empty());          // an empty buffer is refused, and returned
    /// # Ok(()) }
    /// ```
    pub fn register<B: StableBuf>(
        &self,
        mut buf: B,
        access: AccessFlags,
    ) -> std::result::Result<Registered<B>, RegisterError<B>> {
        let (ptr, len) = (buf.stable_ptr(), buf.stable_len());
        // SAFETY: `StableBuf` promises the bytes stay put and owned while `buf` lives and is
        // not mutably accessed; `Registered` owns `buf`, never lends it mutably, and drops the
        // registration before the buffer.
        match unsafe { self.register_raw(ptr, len, access) } {
            Ok(mr) => Ok(Registered::from_parts(mr, buf)),
            Err(e) => Err(RegisterError::new(e, buf)),
        }
    }

    /// Allocates a type-2 memory window, unbound (see [`Mw`]).
    pub fn alloc_mw(&self) -> Result<Mw> {
        Ok(Mw::new(
            self.inner.alloc_mw()?,
            self.provider(),
            self.windows.clone(),
        ))
    }

    /// The provider of the device this PD lives on.
    pub fn provider(&self) -> ProviderKind {
        self.device.provider
    }

    /// The name of the device this PD lives on.
    pub fn device_name(&self) -> String {
        self.inner.device_name()
    }

    /// Creates an RC queue pair in the RESET state.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cfg: &QpConfig) -> Result<Qp> {
        cfg.check(&self.device)?;
        for cq in [send_cq, recv_cq] {
            if cq.provider != self.provider() {
                return Err(Error::Mismatch(format!(
                    "a {} QP needs {0} CQs, not a {} CQ",
                    self.provider(),
                    cq.provider
                )));
            }
        }
        let inner = self
            .inner
            .create_qp(send_cq.inner.as_ref(), recv_cq.inner.as_ref(), cfg)?;
        Ok(Qp {
            provider: self.provider(),
            windows: self.windows.clone(),
            _connection: None,
            max_sge: cfg.max_sge as usize,
            listing: QpTag::new(&self.recorder, &self.device.name, inner.qpn()),
            inner,
        })
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    inner: Arc<dyn CqOps>,
    /// Objects of different providers never mix; fabric tells them apart by this.
    provider: ProviderKind,
    /// This CQ's entry in the per-object metrics (shared by its clones).
    listing: Arc<CqTag>,
}

impl Cq {
    /// Moves up to `out.len()` completions into `out`; returns how many, 0 if none is ready.
    ///
    /// It never blocks, on any provider. (On the soft provider it first applies, without
    /// waiting, the responses that have arrived for the QPs bound to this CQ; the emulated
    /// NIC's own thread does the same when nobody polls.)
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let n = self.inner.poll(out)?;
        let done = &out[..n.min(out.len())];
        let recorder = self.listing.recorder();
        recorder.record_completions(done);
        recorder.ops.completed(done);
        self.listing.polled(done);
        Ok(n)
    }

    /// The number this CQ is listed under in the per-object metrics (the `cq` label of
    /// `rdmapool_cq_completions_total`; see
    /// [`crate::metrics::ContextMetrics::track_objects`]): unique in the process, from 1.
    pub fn metrics_id(&self) -> u64 {
        self.listing.id()
    }

    /// Depth.
    pub fn depth(&self) -> u32 {
        self.inner.depth()
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion makes [`Cq::event_fd`]
    /// readable. After a wake-up, [`Cq::ack_events`], re-arm, then drain with [`Cq::poll`]
    /// until it returns 0 — completions that arrived before re-arming raise no new event.
    pub fn req_notify(&self) -> Result<()> {
        self.inner.req_notify()
    }

    /// The completion channel's descriptor, for poll/epoll or tokio's `AsyncFd`: readable
    /// once an armed CQ has a completion, on every provider (retry timeouts included, with
    /// nobody polling).
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.inner.event_fd()
    }

    /// Consumes pending notifications (`ibv_get_cq_event` + `ibv_ack_cq_events`); returns
    /// how many there were.
    pub fn ack_events(&self) -> Result<usize> {
        self.inner.ack_events()
    }

    /// Busy-polls until `n` completions arrived or `timeout` passed; returns what arrived.
    pub fn wait(&self, n: usize, timeout: Duration) -> Result<Vec<Completion>> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        let mut buf = [Completion::EMPTY; 16];
        while got.len() < n {
            let k = self.poll(&mut buf[..(n - got.len()).min(16)])?;
            got.extend_from_slice(&buf[..k]);
            if k == 0 {
                if Instant::now() >= deadline {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        Ok(got)
    }
}

/// A connection manager's state kept with a QP: dropped (disconnecting) before the QP, and
/// the source of the QP's events after establishment.
pub(crate) trait ConnectionState: Send + Sync {
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
    /// This QP's entry in the per-object metrics; declared before `inner` so that it leaves
    /// the listing before the QP number is given back (and perhaps reused).
    /// Its entry in the per-object metrics, with its context's recorder.
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
    /// Ties a connection manager's state to this QP (it is dropped first).
    pub(crate) fn with_connection(mut self, c: Box<dyn ConnectionState>) -> Qp {
        self._connection = Some(c);
        self
    }

    /// The provider's QP object.
    pub(crate) fn provider_qp(&self) -> &dyn std::any::Any {
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
    /// How many work requests its queues hold: exactly what [`QpConfig`] asked for, on every
    /// provider (a device that rounds its rings up, as rxe does, is still held to it).
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
    /// ([`Cq::poll`]), on every provider, as on mlx5 and rxe: a signaled request's own
    /// completion, or for an unsignaled one the next signaled completion of this QP. Posting
    /// more than [`QpCapacity::send`] requests without polling fails with
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
        if let (Some(key), Err(_)) = (sampled, &r) {
            ops.post_failed(key);
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
    pub(crate) fn post_bind(&self, mw: &Mw, bind: &BindSpec) -> Result<u32> {
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
            return Err(Error::InvalidArgument(format!(
                "{n} SGEs, the QP allows {}",
                self.max_sge
            )));
        }
        Ok(())
    }
}
