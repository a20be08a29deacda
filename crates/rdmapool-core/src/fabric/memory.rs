//! One memory model: the [`RegisteredMemory`] trait every registered-memory handle implements,
//! and safe registration of buffers the caller owns ([`StableBuf`], [`Registered`]).

use super::{Mr, RemoteAddr, RemoteRegion, Sge};
use crate::{Error, Result};
use std::sync::Arc;

/// Memory a device can reach: a range with the keys that name it.
///
/// Every handle to registered memory implements it: [`Mr`], [`Registered`],
/// `rdmapool::buf::Buffer`, `rdmapool::mr::SharedMr`, `rdmapool::mr::CachedMr`,
/// `rdmapool::mr::ChunkedMr` and `rdmapool::cq::LocalBuf`; the async API
/// (`rdmapool::cq::AsyncQp`) accepts any of them.
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
    /// The remote key a peer uses for offset 0 (memory made of several registrations, such
    /// as `rdmapool::mr::ChunkedMr`, answers per range through `sge` and `remote_at`).
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

/// A buffer whose bytes stay at one address while the value is moved, so it can be
/// registered and handed around by value ([`super::Pd::register`]).
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

// SAFETY: a Vec's heap buffer does not move when the Vec does; `Registered` never hands out
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

/// A caller-owned buffer registered with a PD. The device and peers (as the access flags
/// allow) may write it at any time, so it is read and written by copies
/// ([`Registered::read_at`], [`Registered::write_at`]); [`Registered::into_inner`]
/// deregisters and gives the buffer back.
///
/// ```
/// use rdmapool::fabric::*;
/// # fn main() -> rdmapool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
/// let reg = pd.register(vec![7u8; 4096], AccessFlags::all_remote())?;
/// reg.write_at(0, b"hi")?;
/// let _sge = reg.sge(0, 2)?;
/// let back: Vec<u8> = reg.into_inner();      // deregistered: plain memory again
/// assert_eq!(&back[..3], b"hi\x07");
/// # Ok(()) }
/// ```
pub struct Registered<B: StableBuf> {
    // Field order matters: the registration is dropped before the buffer.
    mr: Mr,
    buf: B,
}

impl<B: StableBuf> std::fmt::Debug for Registered<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered").field("mr", &self.mr).finish()
    }
}

impl<B: StableBuf> Registered<B> {
    /// Pairs a registration with the buffer it covers (the caller checked they match).
    #[doc(hidden)]
    pub fn from_parts(mr: Mr, buf: B) -> Self {
        Self { mr, buf }
    }

    /// The registration.
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// Deregisters (waiting for operations that use the memory, as dropping an [`Mr`] does)
    /// and returns the buffer with whatever the device and peers wrote into it.
    pub fn into_inner(self) -> B {
        let Registered { mr, buf } = self;
        drop(mr);
        buf
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.mr.write_at(offset, data)
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.mr.read_at(offset, out)
    }
}

impl<B: StableBuf> RegisteredMemory for Registered<B> {
    fn addr(&self) -> u64 {
        self.mr.addr()
    }
    fn len(&self) -> usize {
        self.mr.len()
    }
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

/// A registration of an owned buffer failed: the error, and the buffer back, untouched.
pub struct RegisterError<B> {
    /// Why registration failed.
    pub error: Error,
    buf: B,
}

impl<B> RegisterError<B> {
    #[doc(hidden)]
    pub fn new(error: Error, buf: B) -> Self {
        Self { error, buf }
    }

    /// The buffer that was to be registered.
    pub fn into_inner(self) -> B {
        self.buf
    }
}

impl<B> std::fmt::Debug for RegisterError<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisterError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<B> std::fmt::Display for RegisterError<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<B> std::error::Error for RegisterError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B> From<RegisterError<B>> for Error {
    fn from(e: RegisterError<B>) -> Error {
        e.error
    }
}
