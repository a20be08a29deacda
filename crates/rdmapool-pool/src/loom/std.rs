//! The primitives outside loom: std's atomics, parking_lot's locks, crossbeam's queue.

pub(crate) mod sync {
    pub(crate) use parking_lot::{Mutex, MutexGuard};

    /// Atomics.
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU8, Ordering};
    }

    /// Locks `m` (parking_lot's locks are never poisoned).
    #[inline]
    pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock()
    }

    /// A bounded multi-producer, multi-consumer queue of `u32`s: lock-free.
    pub(crate) struct BoundedQueue(crossbeam_queue::ArrayQueue<u32>);

    impl BoundedQueue {
        /// A queue of at most `cap` entries.
        pub(crate) fn new(cap: usize) -> Self {
            Self(crossbeam_queue::ArrayQueue::new(cap))
        }
        /// Adds `i` (dropped when full: callers never fill it).
        #[inline]
        pub(crate) fn push(&self, i: u32) {
            let _ = self.0.push(i);
        }
        /// Takes an entry, if any.
        #[inline]
        pub(crate) fn pop(&self) -> Option<u32> {
            self.0.pop()
        }
        /// How many entries it holds.
        pub(crate) fn len(&self) -> usize {
            self.0.len()
        }
    }
}
