//! Real page pinning (mlock with overlap-aware unpinning) and memfd-backed mappings.

use crate::util::page_size;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Live pinned ranges of the whole process: (start, id) -> end, page aligned.
///
/// mlock does not count: unlocking a page unlocks it for every registration that covers it.
/// So a range is unpinned only where no other live registration still covers it.
static PINNED: Mutex<BTreeMap<(usize, u64), usize>> = Mutex::new(BTreeMap::new());
static NEXT_PIN_ID: AtomicU64 = AtomicU64::new(1);
static PINNED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes currently pinned by registrations of this process (counting overlaps once each).
pub fn pinned_bytes() -> u64 {
    PINNED_BYTES.load(Ordering::Relaxed)
}

/// A pinned, page-aligned range; unpinned on drop where nothing else covers it.
#[derive(Debug)]
pub(crate) struct Pin {
    start: usize,
    end: usize,
    id: u64,
    /// Whether the pin succeeded and was added to the pinned-bytes counter.
    counted: bool,
}

fn page_bounds(addr: usize, len: usize) -> Result<(usize, usize)> {
    let page = page_size();
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_add(page - 1))
        .ok_or_else(|| Error::InvalidArgument(format!("range {addr:#x}+{len} overflows")))?;
    Ok((addr & !(page - 1), end & !(page - 1)))
}

/// The locked-memory soft limit as text, for error messages.
pub(crate) fn memlock_limit_text() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "unknown".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} bytes", lim.rlim_cur)
    }
}

impl Pin {
    /// Pins `len` bytes at `addr` (rounded out to pages) with mlock.
    ///
    /// # Safety
    /// The range must be mapped memory of this process.
    pub(crate) unsafe fn new(addr: usize, len: usize) -> Result<Self> {
        let (start, end) = page_bounds(addr, len)?;
        let id = NEXT_PIN_ID.fetch_add(1, Ordering::Relaxed);
        // Record first so a concurrent unpin of an overlapping range keeps our pages locked.
        PINNED.lock().insert((start, id), end);
        // SAFETY: the caller promises the range is mapped; mlock only changes page state.
        if unsafe { libc::mlock(start as *const libc::c_void, end - start) } != 0 {
            let err = std::io::Error::last_os_error();
            let pin = Pin {
                start,
                end,
                id,
                counted: false,
            };
            drop(pin); // unlocks whatever part mlock managed to lock and nobody else covers
            let errno = err.raw_os_error().unwrap_or(0);
            return Err(match errno {
                libc::ENOMEM | libc::EAGAIN | libc::EPERM => Error::MemlockLimit {
                    requested: end - start,
                    limit: memlock_limit_text(),
                    errno,
                },
                _ => Error::Sys {
                    call: "mlock",
                    source: err,
                },
            });
        }
        PINNED_BYTES.fetch_add((end - start) as u64, Ordering::Relaxed);
        Ok(Pin {
            start,
            end,
            id,
            counted: true,
        })
    }

    /// Bytes this pin covers.
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut live = PINNED.lock();
        live.remove(&(self.start, self.id));
        // Parts of [start, end) still covered by other live pins.
        let mut covered: Vec<(usize, usize)> = live
            .range(..(self.end, 0))
            .filter(|(_, &e)| e > self.start)
            .map(|(&(s, _), &e)| (s.max(self.start), e.min(self.end)))
            .collect();
        covered.sort_unstable();
        let mut cursor = self.start;
        let unlock = |from: usize, to: usize| {
            if to > from {
                // SAFETY: munlock on a range we locked; it only changes page state and
                // tolerates ranges that are no longer locked.
                unsafe { libc::munlock(from as *const libc::c_void, to - from) };
            }
        };
        for (s, e) in covered {
            unlock(cursor, s);
            cursor = cursor.max(e);
        }
        unlock(cursor, self.end);
        drop(live);
        if self.counted {
            PINNED_BYTES.fetch_sub(self.len() as u64, Ordering::Relaxed);
        }
    }
}

/// Page-aligned memory from a memfd, mapped shared, owned by one memory region.
///
/// Backing it with a memfd lets a peer process on this host map the same pages.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; it is only accessed through raw pointers under
// the owning region's rules, so moving or sharing the handle across threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above; the handle itself has no interior state.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates and maps `len` bytes (rounded up to a page), zero-filled.
    pub(crate) fn new(len: usize) -> Result<Self> {
        let page = page_size();
        let len = len
            .checked_add(page - 1)
            .ok_or_else(|| Error::InvalidArgument(format!("length {len} too large")))?
            & !(page - 1);
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
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Mapped length (a whole number of pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd behind the mapping.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Maps all of a memfd received from a peer process on this host.
    pub(crate) fn from_fd(fd: OwnedFd) -> Result<Self> {
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
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
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
