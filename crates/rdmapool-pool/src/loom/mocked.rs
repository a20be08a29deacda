//! The primitives under `--cfg loom`: loom's atomics and locks, and a queue behind a loom
//! lock (a lock-free queue's own atomics are not loom's, so the checker could not see them).

pub(crate) mod sync {
    pub(crate) use loom::sync::{Mutex, MutexGuard};

    /// Atomics.
    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU8, Ordering};
    }

    /// Locks `m` (a poisoned lock's data is taken as it is).
    pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A bounded queue of `u32`s, behind a loom lock.
    pub(crate) struct BoundedQueue(Mutex<Vec<u32>>);

    impl BoundedQueue {
        /// A queue of at most `cap` entries.
        pub(crate) fn new(cap: usize) -> Self {
            Self(Mutex::new(Vec::with_capacity(cap)))
        }
        /// Adds `i`.
        pub(crate) fn push(&self, i: u32) {
            lock(&self.0).push(i);
        }
        /// Takes an entry, if any.
        pub(crate) fn pop(&self) -> Option<u32> {
            lock(&self.0).pop()
        }
        /// How many entries it holds.
        pub(crate) fn len(&self) -> usize {
            lock(&self.0).len()
        }
    }
}
