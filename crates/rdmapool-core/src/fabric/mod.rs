//! The provider-independent RDMA object model.
//!
//! One set of types — [`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`], work requests and
//! [`Completion`]s — drives every provider. Open a device with [`Context::open`] and a provider's
//! options, and the same code runs on the `soft` provider (no NIC needed) or real verbs; the
//! providers implement the interface in [`provider`], each in a crate of its own.
//!
//! # Memory safety
//! * Memory reachable by the device is always owned by an [`Mr`] ([`Pd::alloc_mr`]) or lent to
//!   it under an `unsafe` contract ([`Pd::register_raw`]): it cannot be freed or moved while
//!   registered, because the `Mr` owns it or the caller promised it.
//! * Work requests name memory only through keys (lkey/rkey) that the provider checks against
//!   live registrations, so a work request can never reach freed memory: deregistering an `Mr`
//!   waits for the operations that are using it, and later ones fail with an error completion.
//! * Registered memory is shared with the device and remote peers, which may write it at any
//!   time the access flags allow. Safe code therefore never gets a Rust reference to it:
//!   [`Mr::write_at`] and [`Mr::read_at`] copy through raw pointers, and [`Mr::atomic_u64`]
//!   gives an atomic view of one aligned word.

mod access;
mod completion;
mod connect_spec;
mod device;
#[doc(hidden)]
pub mod events;
mod exposure;
mod memory;
mod mr;
mod mw;
mod objects;
#[doc(hidden)]
pub mod private_data;
#[doc(hidden)]
pub use memory::check_range;
pub mod provider;
mod qp;
mod queue_pair;
#[doc(hidden)]
pub mod recorder;
mod wr;

pub use access::AccessFlags;
pub use completion::{Completion, WcOpcode, WcStatus};
pub use connect_spec::ConnectSpec;
pub use device::{AtomicCap, DeviceInfo, PortInfo, ProviderKind, ProviderStatus};
pub use events::QpEvent;
#[doc(hidden)]
pub use exposure::{check_exposure, read_private_file};
pub use exposure::{unauthenticated_allowed_by_env, PreSharedKey, ENV_ALLOW_UNAUTHENTICATED};
pub use memory::{RegisterError, RegisteredMemory};
pub use mr::{Alloc, Mr, Raw, Shared, StableBuf, ViewOwner};
#[doc(hidden)]
pub use mw::WindowTable;
pub use mw::{BoundWindow, Mw, WindowError};
pub use objects::{Context, Cq, Pd};
pub use provider::ContextOptions;
pub use qp::{Endpoint, QpCapacity, QpConfig, QpState};
#[doc(hidden)]
pub use queue_pair::ConnectionState;
pub use queue_pair::Qp;
pub use wr::{RecvWr, RemoteAddr, RemoteRegion, SendWr, Sge, WrOp};

/// Most SGEs one work request may have in this library, on any provider (a device may
/// allow fewer: [`DeviceInfo::max_sge`]).
pub const MAX_SGE: usize = 16;
