//! Operating-system helpers shared by the providers and the registration layer: page pinning
//! and its accounting, the memlock limit, memfd-backed shared mappings.

#[doc(hidden)]
pub mod mapping;
#[doc(hidden)]
pub mod pin;

pub use pin::pinned_bytes;
