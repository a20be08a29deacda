//! Page-aligned memory from a memfd, mapped shared: memory a peer process on this host can
//! map too (the soft provider's regions, control pages and QP state pages).

use crate::util::page_size;
use crate::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

/// Page-aligned memory from a memfd, mapped shared, owned by one memory region.
///
/// Backing it with a memfd lets a peer process on this host map the same pages.
#[derive(Debug)]
#[doc(hidden)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; it is only accessed through raw pointers under
// the owning region's rules, so moving or sharing the handle across threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above; the handle itself has no interior state.
unsafe impl Sync for Mapping {}

// A mapping is never empty (mmap refuses zero bytes).
#[allow(clippy::len_without_is_empty)]
impl Mapping {
    /// Creates and maps `len` bytes (rounded up to a page), zero-filled.
    #[doc(hidden)]
    pub fn new(len: usize) -> Result<Self> {
        let page = page_size();
        let len = len.checked_add(page - 1).ok_or(Error::OutOfLimits {
            what: "mapping length",
            value: len as u64,
            min: 1,
            max: (usize::MAX - (page - 1)) as u64,
        })? & !(page - 1);
        // SAFETY: the name is a valid NUL-terminated string; flags are valid.
        let raw = unsafe { libc::memfd_create(c"rdmapool-mr".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::last_os("memfd_create"));
        }
        // SAFETY: memfd_create returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Error::last_os("ftruncate"));
        }
        Self::map(fd, len)
    }

    /// Maps `len` bytes of `fd` shared, read-write.
    fn map(fd: OwnedFd, len: usize) -> Result<Self> {
        // SAFETY: mapping a descriptor we own with a length it has; the kernel picks the
        // address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os("mmap"));
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
            fd,
        })
    }

    /// Start of the mapping.
    #[doc(hidden)]
    #[inline]
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Mapped length (a whole number of pages).
    #[doc(hidden)]
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The memfd behind the mapping.
    #[doc(hidden)]
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Maps all of a memfd received from a peer process on this host.
    #[doc(hidden)]
    pub fn from_fd(fd: OwnedFd) -> Result<Self> {
        // SAFETY: fstat writes into the struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on a descriptor we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::last_os("fstat"));
        }
        let len = st.st_size as usize;
        if len == 0 || !len.is_multiple_of(page_size()) {
            return Err(Error::Malformed {
                what: "shared region",
                reason: format!("memfd of {len} bytes"),
            });
        }
        Self::map(fd, len)
    }

    /// The aligned 8-byte word at byte `offset`, as an atomic shared with other processes.
    #[doc(hidden)]
    #[inline]
    pub fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "word {offset} outside mapping"
        );
        // SAFETY: in bounds and aligned (checked above; the mapping is page aligned), and
        // the mapping lives as long as the borrow of `self`.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU64) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mmap gave us; nobody uses it after the owning
        // region is gone (regions hold the mapping until their last user drops).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
