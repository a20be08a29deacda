//! The interface every provider implements; the public objects in `objects.rs` wrap it.

use super::{
    AccessFlags, Completion, DeviceInfo, Endpoint, ProviderKind, ProviderOptions, ProviderStatus,
    QpCapacity, QpConfig, QpState, RecvWr, SendWr,
};
use crate::Result;
use std::any::Any;
use std::sync::Arc;

/// One provider: its devices, and how to open one. `crate::providers` lists them all, above
/// fabric and the providers; nothing in `fabric` names a provider's module.
pub(crate) trait Provider: Sync {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;
    /// Whether it can be used here: its devices, or why not.
    fn status(&self) -> ProviderStatus;
    /// Opens a context with these options (the provider's own variant).
    fn open(&self, options: &ProviderOptions) -> Result<Arc<dyn ContextOps>>;
}

/// The error for options of another provider.
pub(crate) fn wrong_options(me: ProviderKind, options: &ProviderOptions) -> crate::Error {
    crate::Error::Mismatch(format!(
        "{me} provider given {} options",
        options.provider()
    ))
}

pub(crate) trait ContextOps: Send + Sync {
    fn device(&self) -> &DeviceInfo;
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>>;
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>>;
    /// Registrations currently alive (leak checks).
    fn live_regions(&self) -> usize;
    /// QPs currently alive (leak checks).
    fn live_qps(&self) -> usize;
}

pub(crate) trait PdOps: Send + Sync {
    fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Box<dyn MrOps>>;
    /// # Safety
    /// `[addr, addr+len)` must stay mapped, and not be unmapped or reused for anything else,
    /// until the returned region is dropped.
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>>;
    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        cfg: &QpConfig,
    ) -> Result<Box<dyn QpOps>>;
    /// The name of the device the PD lives on.
    fn device_name(&self) -> String;
    /// Allocates a type-2 memory window, unbound.
    fn alloc_mw(&self) -> Result<Box<dyn MwOps>>;
}

/// A memory window; dropping it deallocates (invalidating a bound window).
pub(crate) trait MwOps: Send + Sync {
    /// The remote key: the bound window's, or (unbound) one that grants nothing.
    fn rkey(&self) -> u32;
    fn as_any(&self) -> &dyn Any;
}

/// What a bind work request binds: `[addr, addr+len)` of the region named by `lkey`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BindSpec {
    pub(crate) wr_id: u64,
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: AccessFlags,
    pub(crate) signaled: bool,
}

impl BindSpec {
    /// A bind of `len` bytes at `offset` of `mem`, checked: remote rights only, and a range
    /// inside `mem`.
    pub(crate) fn new(
        wr_id: u64,
        mem: &(impl super::RegisteredMemory + ?Sized),
        offset: usize,
        len: usize,
        access: AccessFlags,
        signaled: bool,
    ) -> Result<Self> {
        let remote =
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if !remote.contains(access) {
            return Err(crate::Error::InvalidArgument(format!(
                "a window grants remote rights only, not {access:?}"
            )));
        }
        super::check_range(mem.len(), offset, len)?;
        let sge = mem.sge(offset, 0)?;
        Ok(Self {
            wr_id,
            lkey: sge.lkey,
            addr: sge.addr,
            len: len as u64,
            access,
            signaled,
        })
    }
}

/// A registration; dropping it deregisters.
pub(crate) trait MrOps: Send + Sync {
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    fn access(&self) -> AccessFlags;
}

pub(crate) trait CqOps: Send + Sync {
    fn poll(&self, out: &mut [Completion]) -> Result<usize>;
    fn depth(&self) -> u32;
    /// Arms the CQ: the next completion makes `event_fd` readable.
    fn req_notify(&self) -> Result<()>;
    /// A descriptor that becomes readable when an armed CQ gets a completion.
    fn event_fd(&self) -> std::os::fd::RawFd;
    /// Consumes the pending notifications; returns how many there were.
    fn ack_events(&self) -> Result<usize>;
    fn as_any(&self) -> &dyn Any;
}

pub(crate) trait QpOps: Send + Sync {
    fn qpn(&self) -> u32;
    fn state(&self) -> QpState;
    fn endpoint(&self) -> Endpoint;
    fn to_init(&self) -> Result<()>;
    fn to_rtr(&self, remote: &Endpoint) -> Result<()>;
    fn to_rts(&self) -> Result<()>;
    fn set_error(&self);
    /// The next asynchronous event, waiting up to `timeout` (None: none came).
    fn wait_event(&self, timeout: std::time::Duration) -> Option<super::QpEvent>;
    /// The queue depths the QP really has.
    fn capacity(&self) -> QpCapacity;
    /// (initiator, responder) READ/atomic depths as the device has them; None where the
    /// provider has no such limit.
    fn rd_atomic(&self) -> Result<Option<(u8, u8)>> {
        Ok(None)
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// Posts a bind of `mw` on the send queue; returns the rkey the window has once bound.
    fn post_bind_mw(&self, mw: &dyn MwOps, bind: &BindSpec) -> Result<u32>;
    /// The provider's own object (for provider-specific setup such as RDMA CM).
    fn as_any(&self) -> &dyn Any;
}

/// The provider's own CQ behind `c`, or a mismatch error naming the provider.
pub(crate) fn provider_cq<'a, T: 'static>(c: &'a dyn CqOps, provider: &str) -> Result<&'a T> {
    c.as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| crate::Error::Mismatch(format!("a {provider} QP needs {provider} CQs")))
}
