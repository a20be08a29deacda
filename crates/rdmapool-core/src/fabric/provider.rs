//! The provider interface: what a provider implements so that the public objects
//! ([`Context`](super::Context), [`Pd`], [`Cq`], [`Qp`],
//! [`Mr`](super::Mr), [`Mw`](super::Mw)) run on it. The `soft` and `verbs` providers live in
//! crates of their own (`rdmapool-soft`, `rdmapool-verbs`) and implement these traits; the
//! public objects wrap them and do every check that all providers share (limits, SGE counts,
//! atomic shapes, ranges), so a provider sees only requests that passed them.
//!
//! A provider is a unit struct implementing [`Provider`] (its devices) and an options type
//! implementing [`ContextOptions`] (how to open one of them); [`Context::open`](super::Context::open)
//! takes any such options. Everything a provider opens then hangs off its [`ContextOps`].

use super::{
    AccessFlags, Completion, ConnectSpec, Cq, DeviceInfo, Endpoint, Pd, ProviderKind,
    ProviderStatus, Qp, QpCapacity, QpConfig, QpState, RecvWr, SendWr,
};
use crate::Result;
use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// One provider: which it is, and its devices (or why it cannot be used here).
pub trait Provider: Sync {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;
    /// Whether it can be used here: its devices, or why not.
    fn status(&self) -> ProviderStatus;
    /// The provider's own connection manager, if it has one (RDMA CM on verbs). rdmapool's
    /// TCP CM port (`rdmapool::conn`) works with every provider; this is the native one.
    fn connection_manager(&self) -> Option<&'static dyn ConnectionManager> {
        None
    }
}

/// A provider's own connection manager (on verbs, RDMA CM): listen, take a request with its
/// private data, accept or reject it, connect. The QPs are the caller's, made on the given PD
/// and CQs; the manager moves them to RTS. Private data crosses this interface unframed on
/// the way in and, from `connect` and `raw_private_data`, as it arrived (framed and padded).
pub trait ConnectionManager: Sync {
    /// Listens for connection requests on `addr` (port 0 picks one).
    fn listen(&self, addr: SocketAddr) -> Result<Box<dyn CmListenerOps>>;
    /// Connects to a listener at `addr` with the QP and private data of `spec`; returns the
    /// QP (in RTS) and the acceptor's private data as it arrived.
    fn connect(&self, addr: SocketAddr, spec: &ConnectSpec<'_>) -> Result<(Qp, Vec<u8>)>;
}

/// A listener of a provider's connection manager.
pub trait CmListenerOps: Send + Sync {
    /// The address it listens on (the port chosen when 0 was asked).
    fn local_addr(&self) -> SocketAddr;
    /// The next connection request, waiting up to `timeout`. A request whose private data
    /// is not framed is rejected and reported as `Error::BadPrivateData`.
    fn get_request(&self, timeout: Duration) -> Result<Box<dyn CmRequestOps>>;
}

/// A connection request of a provider's connection manager, waiting for an answer.
pub trait CmRequestOps: Send + Sync {
    /// The requester's private data, unframed.
    fn private_data(&self) -> &[u8];
    /// The private data as it arrived (framed and padded).
    fn raw_private_data(&self) -> &[u8];
    /// The requester's address, if the manager knows it.
    fn peer_addr(&self) -> Option<SocketAddr>;
    /// Accepts: a QP on `pd` and these CQs, moved to RTS once the requester is ready, with
    /// `private_data` sent back; waits up to `timeout`.
    fn accept(
        self: Box<Self>,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Qp>;
    /// Rejects, with `private_data` sent back.
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<()>;
}

/// A provider's own options for opening a context (`SoftConfig`, `VerbsConfig`, or the
/// run-time choice between them): what [`Context::open`](super::Context::open) takes.
pub trait ContextOptions {
    /// The provider these options open a context on.
    fn provider(&self) -> &'static dyn Provider;
    /// The device these options name, if any. `Context::open` checks it against the
    /// provider's devices before [`open_context`](Self::open_context) is called.
    fn device(&self) -> Option<&str> {
        None
    }
    /// Opens the provider's context. Called by `Context::open` once the provider is known to
    /// be available and the device to exist.
    fn open_context(&self) -> Result<Arc<dyn ContextOps>>;
}

impl<T: ContextOptions + ?Sized> ContextOptions for &T {
    fn provider(&self) -> &'static dyn Provider {
        (**self).provider()
    }
    fn device(&self) -> Option<&str> {
        (**self).device()
    }
    fn open_context(&self) -> Result<Arc<dyn ContextOps>> {
        (**self).open_context()
    }
}

/// An opened device: what a [`Context`](super::Context) wraps.
pub trait ContextOps: Send + Sync {
    /// The device and its limits.
    fn device(&self) -> &DeviceInfo;
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>>;
    /// Creates a completion queue of at least `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>>;
    /// Registrations currently alive (leak checks).
    fn live_regions(&self) -> usize;
    /// QPs currently alive (leak checks).
    fn live_qps(&self) -> usize;
}

/// A protection domain: registrations, QPs and windows are made in one.
pub trait PdOps: Send + Sync {
    /// Allocates `len` bytes of memory the provider owns and registers them.
    fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Box<dyn MrOps>>;
    /// Registers `[addr, addr+len)` of the caller's memory (`addr` is not null: `Pd` checked).
    ///
    /// # Safety
    /// `[addr, addr+len)` must stay mapped, and not be unmapped or reused for anything else,
    /// until the returned region is dropped.
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>>;
    /// Creates an RC QP on these CQs (the provider's own, or a mismatch error), in RESET or
    /// INIT; `cfg` was checked against the device's limits.
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
pub trait MwOps: Send + Sync {
    /// The remote key: the bound window's, or (unbound) one that grants nothing.
    fn rkey(&self) -> u32;
    /// The provider's own object.
    fn as_any(&self) -> &dyn Any;
}

/// What a bind work request binds: `[addr, addr+len)` of the region named by `lkey`.
#[derive(Debug, Clone, Copy)]
pub struct BindSpec {
    /// The work request id its completion carries.
    pub wr_id: u64,
    /// The lkey of the region bound into.
    pub lkey: u32,
    /// The first byte bound.
    pub addr: u64,
    /// Bytes bound.
    pub len: u64,
    /// The remote rights the window grants.
    pub access: AccessFlags,
    /// Whether a successful bind completes.
    pub signaled: bool,
}

impl BindSpec {
    /// A bind of `len` bytes at `offset` of `mem`, checked: remote rights only, and a range
    /// inside `mem`.
    pub fn new(
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
            return Err(crate::Error::BadAccess {
                access,
                reason: "a window grants remote rights only",
            });
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
// A registration is never empty (zero bytes are refused before a provider sees them).
#[allow(clippy::len_without_is_empty)]
pub trait MrOps: Send + Sync {
    /// The first byte registered.
    fn addr(&self) -> u64;
    /// Bytes registered.
    fn len(&self) -> usize;
    /// The local key.
    fn lkey(&self) -> u32;
    /// The remote key.
    fn rkey(&self) -> u32;
    /// The rights it was registered with.
    fn access(&self) -> AccessFlags;
}

/// A completion queue.
pub trait CqOps: Send + Sync {
    /// Takes up to `out.len()` completions, never waiting; returns how many.
    fn poll(&self, out: &mut [Completion]) -> Result<usize>;
    /// The entries it holds.
    fn depth(&self) -> u32;
    /// Arms the CQ: the next completion makes `event_fd` readable.
    fn req_notify(&self) -> Result<()>;
    /// A descriptor that becomes readable when an armed CQ gets a completion.
    fn event_fd(&self) -> std::os::fd::RawFd;
    /// Consumes the pending notifications; returns how many there were.
    fn ack_events(&self) -> Result<usize>;
    /// The provider's own object.
    fn as_any(&self) -> &dyn Any;
}

/// A reliable-connected queue pair.
pub trait QpOps: Send + Sync {
    /// Its number.
    fn qpn(&self) -> u32;
    /// Its state now.
    fn state(&self) -> QpState;
    /// The address a peer connects to it by.
    fn endpoint(&self) -> Endpoint;
    /// RESET to INIT.
    fn to_init(&self) -> Result<()>;
    /// INIT to RTR, aimed at `remote`.
    fn to_rtr(&self, remote: &Endpoint) -> Result<()>;
    /// RTR to RTS.
    fn to_rts(&self) -> Result<()>;
    /// Moves it to ERR: outstanding work requests flush.
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
    /// Posts send-queue work requests (checked by `Qp` already), all or none.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    /// Posts receive work requests, all or none.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// Posts a bind of `mw` on the send queue; returns the rkey the window has once bound.
    fn post_bind_mw(&self, mw: &dyn MwOps, bind: &BindSpec) -> Result<u32>;
    /// The provider's own object (for provider-specific setup such as RDMA CM).
    fn as_any(&self) -> &dyn Any;
}

/// The provider's own CQ behind `c`, or a mismatch error naming the provider.
pub fn provider_cq<'a, T: 'static>(c: &'a dyn CqOps, provider: &str) -> Result<&'a T> {
    c.as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| crate::Error::Mismatch(format!("a {provider} QP needs {provider} CQs")))
}
