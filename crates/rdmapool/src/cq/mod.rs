//! Completion queues for many QPs ([`CqPool`]) and the progress engine that turns
//! completions into finished futures ([`Engine`], [`AsyncQp`]).
//!
//! Dispatch is by `wr_id`: every in-flight operation owns a slot of a fixed table (taken
//! from a lock-free free list), and the `wr_id` names the slot and its generation, so a
//! completion finds its future without a heap allocation or a global lock. A future that is
//! dropped while its work request is in flight leaves the slot, and the local buffer it
//! holds, to the engine, which releases both when the completion arrives.

mod engine;
#[cfg(not(loom))]
mod event;

pub use engine::{
    Assignment, AsyncQp, Engine, EngineConfig, EngineStats, LocalBuf, OpFuture, Progress,
    WindowBinding,
};

use crate::fabric::{Context, Cq};
use crate::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Several completion queues, handed out round-robin or per thread.
pub struct CqPool {
    cqs: Vec<Cq>,
    next: AtomicUsize,
}

impl CqPool {
    /// The seeds' advice: a quarter to a half of the cores (at least one).
    pub fn default_count() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 4).max(1)
    }

    /// Creates `count` CQs of `depth` entries on `ctx`.
    pub fn new(ctx: &Context, count: usize, depth: u32) -> Result<Self> {
        if count == 0 {
            return Err(Error::InvalidArgument(
                "a CQ pool needs at least one CQ".into(),
            ));
        }
        let cqs = (0..count)
            .map(|_| ctx.create_cq(depth))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cqs,
            next: AtomicUsize::new(0),
        })
    }

    /// The next CQ, round-robin.
    pub fn next(&self) -> &Cq {
        &self.cqs[self.next.fetch_add(1, Ordering::Relaxed) % self.cqs.len()]
    }

    /// The CQ this thread always gets.
    pub fn for_thread(&self) -> &Cq {
        &self.cqs[thread_hash() % self.cqs.len()]
    }

    /// All CQs.
    pub fn cqs(&self) -> &[Cq] {
        &self.cqs
    }
}

/// A number fixed for the calling thread: the per-thread choice of a CQ.
pub(crate) fn thread_hash() -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut h);
    h.finish() as usize
}
