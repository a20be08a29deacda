//! rdmapool-soft: a pure-Rust RDMA provider that behaves like an RC NIC (rdmapool's `soft`
//! provider, as `rdmapool::soft`).
//!
//! It implements the provider interface of `rdmapool-core`
//! ([`rdmapool_core::fabric::provider`]); [`SoftConfig`] opens one with
//! [`Context::open`](rdmapool_core::fabric::Context::open). Each context opened on it is one emulated NIC: it pins registered pages
//! with mlock, hands out random keys, and listens on TCP (loopback unless told otherwise) and
//! on a local socket. Requests from peers are executed by the context's own responder
//! threads (module `responder`) with the HCA's checks; the requester half runs when the
//! application posts and polls (module `qp`).
//!
//! Environment: `RDMAPOOL_SOFT_BIND` (TCP listen address, default `127.0.0.1:0`),
//! `RDMAPOOL_SOFT_SPIN_US` (how long the serving loop spins after traffic before sleeping, default 50).

#![warn(missing_docs)]

// `access`, `addr`, `keys` and `proto` are public (and hidden) with feature `fuzzing`, for
// rdmapool's fuzz targets; otherwise private.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod access;
#[cfg(not(feature = "fuzzing"))]
mod access;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod addr;
#[cfg(not(feature = "fuzzing"))]
mod addr;
mod admission;
mod clock;
mod config;
mod context;
mod control;
mod cq;
#[cfg(test)]
mod doc_check;
mod driver;
mod error;
mod io;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod keys;
#[cfg(not(feature = "fuzzing"))]
mod keys;
mod life;
mod peer;
mod peer_diag;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod proto;
#[cfg(not(feature = "fuzzing"))]
mod proto;
mod qp;
mod serve;
mod shm;
mod waker;

// The core crate's modules under the names the provider's files use (`crate::fabric::..`).
use rdmapool_core::{fabric, os, util, Error, Result};

pub use admission::{Admission, AllowUsers};
pub use config::{SoftConfig, Transport};
pub use error::SoftError;

use crate::fabric::provider::{
    provider_cq, ContextOps, ContextOptions, CqOps, MrOps, PdOps, Provider, QpOps,
};
use crate::fabric::{
    AccessFlags, AtomicCap, Completion, DeviceInfo, Endpoint, PortInfo, ProviderKind,
    ProviderStatus, QpConfig, QpState, RecvWr, SendWr,
};
use crate::os::mapping::Mapping;
use crate::os::pin::Pin;
use addr::SoftAddress;
use context::SoftContext;
use cq::{Bound, SoftCq};
use keys::{MrInner, NewRegion};
use qp::SoftQp;
use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Most SGEs in one work request.
pub(crate) const MAX_SGE: usize = crate::fabric::MAX_SGE;
#[doc(hidden)]
pub const MAX_MSG: u32 = 1 << 30;
const MAX_QP_WR: u32 = 16 * 1024;
const MAX_CQE: u32 = 1 << 20;

/// The soft device and its limits. Its one port is the TCP/IP address it listens on:
/// link layer Ethernet, the address as an IPv4-mapped (or IPv6) GID at index 0; not RoCE. The
/// soft wire carries whole messages; the MTU reported is RoCE's usual 4096.
pub(crate) fn device_info(bind: SocketAddr) -> DeviceInfo {
    let gid = match bind.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    DeviceInfo {
        provider: ProviderKind::Soft,
        name: "soft0".into(),
        max_mr_size: 1 << 40,
        max_msg_size: MAX_MSG,
        max_qp_wr: MAX_QP_WR,
        max_sge: MAX_SGE as u32,
        max_cqe: MAX_CQE,
        max_mr: 1 << 20,
        atomic_cap: AtomicCap::Global,
        on_demand_paging: true,
        ports: vec![PortInfo {
            num: 1,
            state: "ACTIVE".into(),
            link_layer: "Ethernet".into(),
            lid: 0,
            active_mtu: 4096,
            gid_index: 0,
            gid: gid
                .segments()
                .iter()
                .map(|s| format!("{s:04x}"))
                .collect::<Vec<_>>()
                .join(":"),
            roce_v2: false,
        }],
    }
}

/// An opened soft NIC as the provider interface sees it.
struct OpenedContext(Arc<SoftContext>);

impl ContextOps for OpenedContext {
    fn device(&self) -> &DeviceInfo {
        &self.0.device
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        Ok(Arc::new(SoftPd {
            ctx: self.0.clone(),
            id: self.0.shared.next_pd.fetch_add(1, Ordering::Relaxed),
        }))
    }

    fn live_regions(&self) -> usize {
        self.0.shared.keys.len()
    }

    fn live_qps(&self) -> usize {
        self.0.shared.qps.read().len()
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>> {
        if depth == 0 || depth > MAX_CQE {
            return Err(Error::OutOfLimits {
                what: "CQ depth",
                value: depth.into(),
                min: 1,
                max: MAX_CQE.into(),
            });
        }
        Ok(Arc::new(SoftCqHandle(Arc::new(SoftCq::new(depth)?))))
    }
}

struct SoftPd {
    ctx: Arc<SoftContext>,
    id: u32,
}

struct SoftMr {
    inner: Arc<MrInner>,
    ctx: Arc<SoftContext>,
}

/// A type-2 memory window: its current remote key (unbound: a fresh key naming nothing).
pub(crate) struct SoftMw {
    ctx: Arc<SoftContext>,
    pub(crate) pd_id: u32,
    rkey: AtomicU32,
}

impl SoftMw {
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }
    pub(crate) fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        // Deallocating a bound window invalidates it.
        self.ctx
            .shared
            .keys
            .invalidate_window(self.rkey(), self.pd_id);
    }
}

impl crate::fabric::provider::MwOps for SoftMw {
    fn rkey(&self) -> u32 {
        SoftMw::rkey(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.ctx.shared.keys.remove(&self.inner);
    }
}

impl MrOps for SoftMr {
    fn addr(&self) -> u64 {
        self.inner.addr
    }
    fn len(&self) -> usize {
        self.inner.len as usize
    }
    fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    fn rkey(&self) -> u32 {
        self.inner.rkey
    }
    fn access(&self) -> AccessFlags {
        self.inner.access
    }
}

/// Pins the range, except for on-demand-paging regions (the soft NIC then touches pages as
/// it needs them, which faults them in like an ODP-capable HCA).
///
/// # Safety
/// The range must be mapped memory of this process.
unsafe fn pin_unless_on_demand(
    access: AccessFlags,
    addr: *mut u8,
    len: usize,
) -> Result<Option<Pin>> {
    if access.contains(AccessFlags::ON_DEMAND) {
        return Ok(None);
    }
    // SAFETY: forwarded from the caller.
    unsafe { Pin::new(addr as usize, len) }.map(Some)
}

impl PdOps for SoftPd {
    fn device_name(&self) -> String {
        self.ctx.device.name.clone()
    }

    fn alloc_mw(&self) -> Result<Box<dyn crate::fabric::provider::MwOps>> {
        Ok(Box::new(SoftMw {
            ctx: self.ctx.clone(),
            pd_id: self.id,
            rkey: AtomicU32::new(self.ctx.shared.keys.unused_rkey()?),
        }))
    }

    fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Box<dyn MrOps>> {
        self.ctx.device.check_registration(len, access)?;
        let mapping = Mapping::new(control::len_with_control(len))?;
        // SAFETY: the mapping was just created and lives in the region, so it outlives the pin.
        let pin = unsafe { pin_unless_on_demand(access, mapping.ptr(), mapping.len())? };
        let inner = self.ctx.shared.keys.insert(NewRegion {
            addr: mapping.ptr() as u64,
            len: len as u64,
            access,
            pd_id: self.id,
            pin,
            mapping: Some(mapping),
        })?;
        Ok(Box::new(SoftMr {
            inner,
            ctx: self.ctx.clone(),
        }))
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        self.ctx.device.check_registration(len, access)?;
        // SAFETY: the caller promises the range is mapped for the region's lifetime.
        let pin = unsafe { pin_unless_on_demand(access, addr, len)? };
        let inner = self.ctx.shared.keys.insert(NewRegion {
            addr: addr as u64,
            len: len as u64,
            access,
            pd_id: self.id,
            pin,
            mapping: None,
        })?;
        Ok(Box::new(SoftMr {
            inner,
            ctx: self.ctx.clone(),
        }))
    }

    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        cfg: &QpConfig,
    ) -> Result<Box<dyn QpOps>> {
        let soft_cq = |c| provider_cq::<SoftCqHandle>(c, "soft").map(|h| h.0.clone());
        let qp = SoftQp::new(
            self.ctx.shared.clone(),
            self.id,
            soft_cq(send_cq)?,
            soft_cq(recv_cq)?,
            cfg.clone(),
        )?;
        Ok(Box::new(SoftQpHandle(qp)))
    }
}

struct SoftCqHandle(Arc<SoftCq>);

impl CqOps for SoftCqHandle {
    fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        self.0.poll(out)
    }
    fn depth(&self) -> u32 {
        self.0.depth()
    }
    fn req_notify(&self) -> Result<()> {
        self.0.req_notify();
        Ok(())
    }
    fn event_fd(&self) -> std::os::fd::RawFd {
        self.0.event_fd()
    }
    fn ack_events(&self) -> Result<usize> {
        Ok(self.0.ack_events())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct SoftQpHandle(Arc<SoftQp>);

impl Drop for SoftQpHandle {
    fn drop(&mut self) {
        // Destroying the QP takes effect now, even if a responder thread still holds it for
        // a moment: local peers read ERR from its state page from here on.
        self.0.mark_destroyed();
    }
}

impl QpOps for SoftQpHandle {
    fn qpn(&self) -> u32 {
        self.0.qpn
    }
    fn state(&self) -> QpState {
        self.0.state()
    }
    fn endpoint(&self) -> Endpoint {
        self.0.endpoint()
    }
    fn to_init(&self) -> Result<()> {
        self.0.to_init()
    }
    fn to_rtr(&self, remote: &Endpoint) -> Result<()> {
        self.0.to_rtr(remote)
    }
    fn to_rts(&self) -> Result<()> {
        self.0.to_rts()
    }
    fn capacity(&self) -> crate::fabric::QpCapacity {
        // Exactly what was asked for, on both transports.
        crate::fabric::QpCapacity {
            send: self.0.cfg.max_send_wr,
            recv: self.0.cfg.max_recv_wr,
        }
    }
    fn set_error(&self) {
        self.0.enter_error();
        self.0.progress_nowait();
    }
    fn wait_event(&self, timeout: std::time::Duration) -> Option<crate::fabric::QpEvent> {
        self.0.wait_event(timeout)
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.0.post_send(wrs)
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.0.post_recv(wrs)
    }
    fn post_bind_mw(
        &self,
        mw: &dyn crate::fabric::provider::MwOps,
        bind: &crate::fabric::provider::BindSpec,
    ) -> Result<u32> {
        let mw = mw
            .as_any()
            .downcast_ref::<SoftMw>()
            .ok_or_else(|| Error::Mismatch("a soft QP binds soft memory windows".into()))?;
        self.0.post_bind(mw, bind)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The soft provider: its one device ([`Provider::status`]); [`SoftConfig`] opens it.
pub struct SoftProvider;

/// The soft provider, for a table of providers (`rdmapool::devices()`).
pub static PROVIDER: SoftProvider = SoftProvider;

impl Provider for SoftProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Soft
    }

    fn status(&self) -> ProviderStatus {
        let bind = SoftConfig::from_env()
            .map(|c| c.bind)
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        ProviderStatus {
            provider: ProviderKind::Soft,
            devices: vec![device_info(bind)],
            unavailable: None,
        }
    }
}

impl ContextOptions for SoftConfig {
    fn provider(&self) -> &'static dyn Provider {
        &PROVIDER
    }

    fn open_context(&self) -> Result<Arc<dyn ContextOps>> {
        let (ctx, tcp, unix) = SoftContext::open(self.clone())?;
        serve::start(tcp, unix, &ctx.shared)?;
        Ok(Arc::new(OpenedContext(Arc::new(ctx))))
    }
}

/// The TCP address where the soft context behind `endpoint` listens (`None` for another
/// provider's endpoint): for tools that must reach a soft peer's host, such as a relay.
pub fn tcp_addr(endpoint: &Endpoint) -> Option<SocketAddr> {
    match endpoint.provider {
        ProviderKind::Soft => SoftAddress::decode(&endpoint.address).ok().map(|a| a.tcp),
        ProviderKind::Verbs => None,
    }
}
