//! The owners an [`Mr`] can have: what the memory is and what keeps it alive.

use super::Mr;
use crate::fabric::RegisteredMemory;
use std::sync::Arc;

/// Memory the provider allocated for the region ([`crate::fabric::Pd::alloc_mr`]): zeroed,
/// page aligned, and freed with the registration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Alloc;

/// Caller memory registered under the `unsafe` contract of
/// [`crate::fabric::Pd::register_raw`]: the caller keeps it mapped while the region lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Raw;

/// The owner of a view made by [`Mr::share`]: keeps the region it was made from (any owner)
/// alive, so views of regions of every origin have one type.
#[derive(Clone)]
pub struct Shared(Arc<dyn RegisteredMemory + Send + Sync>);

impl Shared {
    pub(super) fn new<O: Send + Sync + 'static>(region: Arc<Mr<O>>) -> Self {
        Self(region)
    }

    /// The whole region the view was made from (its range and keys).
    pub fn region(&self) -> &(dyn RegisteredMemory + Send + Sync) {
        &*self.0
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Shared")
            .field(&format_args!("{:#x}+{}", self.0.addr(), self.0.len()))
            .finish()
    }
}

/// An owner that keeps someone else's registration alive for a view ([`Mr::view`]), and
/// may be shown ([`Mr::owner`]).
///
/// # Safety
/// A shared reference to the owner must give no Rust reference to the bytes of the memory
/// it keeps (the device may write them at any time).
pub unsafe trait ViewOwner: Send + Sync + 'static {}

// SAFETY: `Shared` shows only the range and keys of the region it holds.
unsafe impl ViewOwner for Shared {}

/// A buffer whose bytes stay at one address while the value is moved, so it can be
/// registered and handed around by value ([`crate::fabric::Pd::register`]).
///
/// # Safety
/// Implementors promise that `stable_ptr` and `stable_len` describe memory owned by the
/// value, valid for reads and writes, that neither moves nor is freed nor changes size while
/// the value lives and is not accessed through `&mut` (moving the value does not move the
/// bytes), and that both return the same answer every time they are called on it.
pub unsafe trait StableBuf: Send + 'static {
    /// Start of the bytes.
    fn stable_ptr(&mut self) -> *mut u8;
    /// Number of bytes.
    fn stable_len(&self) -> usize;
}

// SAFETY: a Vec's heap buffer does not move when the Vec does; `Mr<Vec<u8>>` never hands out
// `&mut Vec` (which could push and reallocate) while the registration lives.
unsafe impl StableBuf for Vec<u8> {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn stable_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: a boxed slice's heap bytes do not move when the box does, and cannot change size.
unsafe impl StableBuf for Box<[u8]> {
    fn stable_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn stable_len(&self) -> usize {
        self.len()
    }
}
