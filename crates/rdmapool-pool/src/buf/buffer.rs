//! [`Pooled`]: the owner of one pre-registered buffer of a pool, and how it goes back (to this
//! thread's cache first, to the pool when the cache is full).

use super::{Shared, Slot, CACHE, CLASSES, THREAD_CACHE};
use crate::fabric::recorder::MemEvent;
use crate::fabric::{Mr, ViewOwner};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The owner of a pooled buffer ([`super::BufferPool::alloc`] gives `Mr<Pooled>`): its slot
/// of a registered pool chunk, which goes back to the pool when the buffer drops.
pub struct Pooled {
    slot: Slot,
    class: usize,
    pool: Arc<Shared>,
}

// SAFETY: a `Pooled` shows nothing of the slot's bytes (only its size class).
unsafe impl ViewOwner for Pooled {}

impl std::fmt::Debug for Pooled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pooled")
            .field("class", &self.class_len())
            .finish()
    }
}

impl Pooled {
    /// The buffer of `len` bytes in `slot` (of size class `class`) of `pool`.
    pub(super) fn buffer(slot: Slot, len: usize, class: usize, pool: &Arc<Shared>) -> Mr<Pooled> {
        let access = pool.cfg.access;
        let owner = Pooled {
            slot,
            class,
            pool: pool.clone(),
        };
        // SAFETY: the slot is `CLASSES[class] >= len` bytes of a chunk the pool keeps
        // registered under these keys (and mapped) while any owner holds the pool; the slot
        // is this owner's alone until it drops.
        unsafe { Mr::view(slot.addr as u64, len, slot.lkey, slot.rkey, access, owner) }
    }

    /// Bytes of the slot (its size class; the buffer uses the length asked for).
    pub fn class_len(&self) -> usize {
        CLASSES[self.class]
    }
}

impl Drop for Pooled {
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
