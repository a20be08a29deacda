//! The public objects: thin, provider-independent handles (`Context`, `Pd`, `Cq`; `Qp` is in
//! queue_pair.rs).

use super::memory::RegisterError;
use super::mr::{Alloc, Raw, StableBuf};
use super::provider::{ContextOps, ContextOptions, CqOps, PdOps};
use super::queue_pair::Qp;
use super::recorder::objects::{CqTag, QpTag};
use super::recorder::{ContextMetrics, Recorder};
use super::{AccessFlags, Completion, DeviceInfo, Mr, Mw, ProviderKind, QpConfig, WindowTable};
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
    /// Opens a device: the provider and device the options name, with those options. This is
    /// the one way to open a context. The options are a provider's own type (`SoftConfig` of
    /// `rdmapool-soft`, `VerbsConfig` of `rdmapool-verbs`) or the run-time choice between
    /// them (`rdmapool::fabric::ProviderOptions`, also read from the environment);
    /// `rdmapool::devices()` lists what can be opened.
    ///
    /// Fails with [`Error::ProviderUnavailable`](crate::Error::ProviderUnavailable) when the
    /// provider cannot be used here and [`Error::NoSuchDevice`](crate::Error::NoSuchDevice)
    /// (naming the devices there are) for a device that does not exist.
    ///
    /// ```
    /// use rdmapool::fabric::{Context, SoftConfig};
    /// let ctx = Context::open(SoftConfig::default())?;
    /// assert_eq!(ctx.device().name, "soft0");
    /// # Ok::<(), rdmapool::Error>(())
    /// ```
    pub fn open(options: impl ContextOptions) -> Result<Self> {
        let provider = options.provider();
        let status = provider.status();
        if let Some(reason) = status.unavailable {
            return Err(Error::ProviderUnavailable {
                provider: provider.kind().name().into(),
                reason,
            });
        }
        if let Some(name) = options.device() {
            if !status.devices.iter().any(|d| d.name == name) {
                return Err(Error::NoSuchDevice {
                    provider: provider.kind(),
                    name: name.into(),
                    known: status.devices.into_iter().map(|d| d.name).collect(),
                });
            }
        }
        Ok(Self::from_ops(options.open_context()?))
    }

    /// A context on an opened provider context, with a recorder of its own.
    fn from_ops(inner: Arc<dyn ContextOps>) -> Self {
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
    #[doc(hidden)]
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// Allocates `len` zeroed, page-aligned bytes owned by the returned region and registers
    /// them. The memory lives exactly as long as the region.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr<Alloc>> {
        let t = std::time::Instant::now();
        let r = self.inner.alloc_mr(len, access);
        self.recorder.record_registration(r.is_ok(), t.elapsed());
        Ok(Mr::registered(r?, &self.recorder, Alloc))
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
    ) -> Result<Mr<Raw>> {
        let t = std::time::Instant::now();
        let r = if addr.is_null() {
            // Checked here once for every provider; a failed registration all the same.
            Err(Error::NullAddress {
                what: "memory to register",
            })
        } else {
            // SAFETY: forwarded from the caller's contract.
            unsafe { self.inner.register_raw(addr, len, access) }
        };
        self.recorder.record_registration(r.is_ok(), t.elapsed());
        Ok(Mr::registered(r?, &self.recorder, Raw))
    }

    /// Registers a buffer the caller owns, safely: the region takes the buffer and
    /// [`Mr::into_inner`] gives it back after deregistering. On failure the buffer
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
    ) -> std::result::Result<Mr<B>, RegisterError<B>> {
        let (ptr, len) = (buf.stable_ptr(), buf.stable_len());
        // SAFETY: `StableBuf` promises the bytes stay put and owned while `buf` lives and is
        // not mutably accessed; `Mr<B>` owns `buf`, never lends it, and drops the
        // registration before the buffer.
        match unsafe { self.register_raw(ptr, len, access) } {
            Ok(mr) => Ok(mr.into_owned(buf)),
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
        let listing = QpTag::new(&self.recorder, &self.device.name, inner.qpn());
        Ok(Qp::new(
            self.provider(),
            self.windows.clone(),
            cfg.max_sge as usize,
            listing,
            inner,
        ))
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
    /// `rdmapool::metrics::ContextMetrics::track_objects`): unique in the process, from 1.
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
