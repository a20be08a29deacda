//! `Mr`: a registered memory region, the handle over a provider's registration.

use super::memory::RegisteredMemory;
use super::provider::MrOps;
use super::recorder::Recorder;
use super::AccessFlags;
use crate::{Error, Result};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// A registered memory region. Dropping it deregisters (and frees memory it owns); work
/// requests that still name it complete with an error instead of touching freed memory.
pub struct Mr {
    /// Dropped only in `Drop`, where the deregistration is timed.
    inner: std::mem::ManuallyDrop<Box<dyn MrOps>>,
    /// Its context's recorder (registered bytes, deregistrations).
    recorder: Arc<Recorder>,
}

impl Drop for Mr {
    fn drop(&mut self) {
        let len = self.inner.len();
        let t = std::time::Instant::now();
        // SAFETY: `inner` is dropped exactly once, here, and not touched afterwards.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.inner) };
        self.recorder.record_deregistration(len, t.elapsed());
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access())
            .finish()
    }
}

impl RegisteredMemory for Mr {
    fn addr(&self) -> u64 {
        self.inner.addr()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn lkey(&self) -> u32 {
        self.inner.lkey()
    }
    fn rkey(&self) -> u32 {
        self.inner.rkey()
    }
}

impl Mr {
    #[doc(hidden)]
    pub fn from_ops(inner: Box<dyn MrOps>, recorder: &Arc<Recorder>) -> Self {
        recorder.region_added(inner.len());
        Self {
            inner: std::mem::ManuallyDrop::new(inner),
            recorder: recorder.clone(),
        }
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.inner.access()
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        super::memory::check_range(self.len(), offset, len)
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: the range is inside the registered region, which is mapped while `self`
        // lives; raw copies make no Rust reference to device-shared memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr() as *mut u8).add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: as in `write_at`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr() as *const u8).add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Reads the native-endian u64 at `offset` (the format RDMA atomics use).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_at(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// An atomic view of the aligned word at `offset`, atomic with respect to RDMA atomics.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        self.check_range(offset, 8)?;
        let addr = self.addr() + offset as u64;
        if !addr.is_multiple_of(8) {
            return Err(Error::Misaligned {
                what: "atomic word",
                addr,
            });
        }
        // SAFETY: aligned, in bounds, and mapped for as long as the borrow of `self`.
        Ok(unsafe { &*(addr as *const AtomicU64) })
    }
}
