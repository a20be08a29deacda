//! The provider-independent RDMA object model (crate `rdmapool-core`), with each provider's
//! options (`SoftConfig` from `rdmapool-soft`, `VerbsConfig` from `rdmapool-verbs`) and the
//! run-time choice between them ([`ProviderOptions`]).
//!
//! One set of types — [`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`], work requests and
//! [`Completion`]s — drives every provider. Pick a device from [`crate::devices`], open it
//! with [`Context::open`], and the same code runs on the `soft` provider (no NIC needed) or
//! real verbs.
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

mod options;

pub use options::ProviderOptions;
pub use rdmapool_core::fabric::*;
pub use rdmapool_soft::{Admission, AllowUsers, SoftConfig, SoftError, Transport};
pub use rdmapool_verbs::{VerbsConfig, VerbsError};
