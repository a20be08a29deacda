//! rdmapool-core: the provider-independent RDMA object model of rdmapool, and the provider
//! interface.
//!
//! [`fabric`] holds the objects every provider runs ([`fabric::Context`], [`fabric::Pd`],
//! [`fabric::Mr`], [`fabric::Cq`], [`fabric::Qp`], work requests, completions) and, in
//! [`fabric::provider`], the traits a provider implements. The providers are crates of their
//! own (`rdmapool-soft`, `rdmapool-verbs`), and `rdmapool` builds registration, buffers, the
//! progress engine, connections and the remote pool on top. Applications use `rdmapool`, which
//! re-exports all of this; a new provider depends on this crate alone.
//!
//! The modules marked hidden (`os`, `util`, and parts of `fabric`) are shared with the other
//! rdmapool crates and are not a stable interface.

#![warn(missing_docs)]

mod error;
pub mod fabric;
#[doc(hidden)]
pub mod os;
#[doc(hidden)]
pub mod util;

pub use error::{Error, Result};
