//! The [`RegisteredMemory`] trait (a range and the keys that name it), and the error of a
//! failed registration of an owned buffer ([`RegisterError`]).

use super::{RemoteAddr, RemoteRegion, Sge};
use crate::{Error, Result};
use std::sync::Arc;

/// Memory a device can reach: a range with the keys that name it.
///
/// Every [`Mr`](super::Mr) implements it, whatever its owner, and so do `Arc`s and `Box`es of one; the
/// async API (`rdmapool::cq::AsyncQp`) accepts any of them.
///
/// Offsets are relative to [`RegisteredMemory::addr`]. Implementing the trait is safe: a
/// wrong key or range can only make a work request complete with a protection error, because
/// the provider checks every key against its live registrations.
///
/// ```
/// use rdmapool::fabric::*;
/// # fn main() -> rdmapool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
/// let mr = pd.alloc_mr(4096, AccessFlags::all_remote())?;
/// let sge = mr.sge(64, 32)?;                      // bounds-checked
/// assert_eq!(sge.addr, mr.addr() + 64);
/// assert!(mr.sge(4090, 32).is_err());
/// assert_eq!(mr.remote_at(8)?.rkey, mr.rkey());
/// # Ok(()) }
/// ```
pub trait RegisteredMemory {
    /// Start address.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// The local key of the registration at offset 0.
    fn lkey(&self) -> u32;
    /// The remote key a peer uses for offset 0 (an implementation made of several
    /// registrations answers per range through `sge` and `remote_at`).
    fn rkey(&self) -> u32;

    /// True for a zero-length range (never the case for a registration).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An SGE for `len` bytes at `offset`, checked against the range.
    fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        check_range(self.len(), offset, len as usize)?;
        Ok(Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        })
    }

    /// Where a peer reaches `offset` (at most the length: the end is a valid address).
    fn remote_at(&self, offset: usize) -> Result<RemoteAddr> {
        check_range(self.len(), offset, 0)?;
        Ok(RemoteAddr {
            addr: self.addr() + offset as u64,
            rkey: self.rkey(),
        })
    }

    /// The descriptor a peer needs to access the whole range.
    fn remote_region(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }
}

/// `offset..offset+len` inside a range of `total` bytes, or a typed error saying why not.
#[doc(hidden)]
pub fn check_range(total: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(Error::OutOfRange {
            what: "registered memory",
            offset: offset as u64,
            len: len as u64,
            limit: total as u64,
        }),
    }
}

/// Smart pointers to registered memory are registered memory.
macro_rules! forward_registered_memory {
    ($($ptr:ident),*) => {$(
        impl<T: RegisteredMemory + ?Sized> RegisteredMemory for $ptr<T> {
            fn addr(&self) -> u64 {
                (**self).addr()
            }
            fn len(&self) -> usize {
                (**self).len()
            }
            fn lkey(&self) -> u32 {
                (**self).lkey()
            }
            fn rkey(&self) -> u32 {
                (**self).rkey()
            }
            fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
                (**self).sge(offset, len)
            }
            fn remote_at(&self, offset: usize) -> Result<RemoteAddr> {
                (**self).remote_at(offset)
            }
        }
    )*};
}

forward_registered_memory!(Arc, Box);

/// A registration of an owned buffer failed: the error, and the buffer back, untouched. `E`
/// is the error type of the layer that registered (`rdmapool::Error` for the registrar).
pub struct RegisterError<B, E = Error> {
    /// Why registration failed.
    pub error: E,
    buf: B,
}

impl<B, E> RegisterError<B, E> {
    #[doc(hidden)]
    pub fn new(error: E, buf: B) -> Self {
        Self { error, buf }
    }

    /// The buffer that was to be registered.
    pub fn into_inner(self) -> B {
        self.buf
    }
}

impl<B, E: std::fmt::Debug> std::fmt::Debug for RegisterError<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisterError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<B, E: std::fmt::Display> std::fmt::Display for RegisterError<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<B, E: std::error::Error + 'static> std::error::Error for RegisterError<B, E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B> From<RegisterError<B>> for Error {
    fn from(e: RegisterError<B>) -> Error {
        e.error
    }
}
