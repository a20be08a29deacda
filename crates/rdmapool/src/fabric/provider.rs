//! The interface every provider implements; the public objects in `objects.rs` wrap it.

use super::{
    AccessFlags, Completion, DeviceInfo, Endpoint, QpCapacity, QpConfig, QpState, RecvWr, SendWr,
};
use crate::Result;
use std::any::Any;
use std::sync::Arc;

pub(crate) trait ContextOps: Send + Sync {
    fn device(&self) -> &DeviceInfo;
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>>;
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>>;
    /// Registrations currently alive (leak checks).
    fn live_regions(&self) -> usize;
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
    /// The queue depths the QP really has.
    fn capacity(&self) -> QpCapacity;
    /// (initiator, responder) READ/atomic depths as the device has them; None where the
    /// provider has no such limit.
    fn rd_atomic(&self) -> Result<Option<(u8, u8)>> {
        Ok(None)
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// The provider's own object (for provider-specific setup such as RDMA CM).
    fn as_any(&self) -> &dyn Any;
}

/// The provider's own CQ behind `c`, or a mismatch error naming the provider.
pub(crate) fn provider_cq<'a, T: 'static>(c: &'a dyn CqOps, provider: &str) -> Result<&'a T> {
    c.as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| crate::Error::Mismatch(format!("a {provider} QP needs {provider} CQs")))
}
