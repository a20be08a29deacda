//! [`Buffer`]: one pre-registered buffer of a pool, and how it goes back (to this thread's
//! cache first, to the pool when the cache is full).

use super::{Shared, Slot, CACHE, CLASSES, THREAD_CACHE};
use crate::fabric::recorder::MemEvent;
use crate::fabric::RegisteredMemory;
use crate::Result;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A pre-registered buffer; returns to its pool when dropped.
pub struct Buffer {
    pub(super) slot: Slot,
    pub(super) len: usize,
    pub(super) class: usize,
    pub(super) pool: Arc<Shared>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("addr", &format_args!("{:#x}", self.slot.addr))
            .field("len", &self.len)
            .field("class", &CLASSES[self.class])
            .finish()
    }
}

impl RegisteredMemory for Buffer {
    fn addr(&self) -> u64 {
        self.slot.addr as u64
    }
    /// Usable length (what was asked for).
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.slot.lkey
    }
    fn rkey(&self) -> u32 {
        self.slot.rkey
    }
}

impl Buffer {
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        crate::fabric::check_range(self.len, offset, len)
    }
    /// Copies `data` in at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: inside this buffer's slot of a registered chunk the pool keeps mapped.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.slot.addr + offset) as *mut u8,
                data.len(),
            )
        };
        Ok(())
    }
    /// Copies `out.len()` bytes out from `offset`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as in write_at.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.slot.addr + offset) as *const u8,
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let s = &self.pool;
        s.in_use.fetch_sub(1, Ordering::Relaxed);
        s.recorder.mem_event(MemEvent::PoolFree);
        let spill = CACHE
            .try_with(|c| {
                let mut c = c.borrow_mut();
                let lists = c
                    .entry(s.id)
                    .or_insert_with(|| vec![Vec::new(); CLASSES.len()]);
                let list = &mut lists[self.class];
                list.push(self.slot);
                (list.len() > THREAD_CACHE).then(|| list.split_off(THREAD_CACHE / 2))
            })
            .unwrap_or(Some(vec![self.slot]));
        if let Some(extra) = spill {
            s.free[self.class].lock().extend(extra);
        }
    }
}
