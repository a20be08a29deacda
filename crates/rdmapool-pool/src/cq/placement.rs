//! Placement: which of several CQs a QP goes on. One concept serves both [`CqPool`] on its
//! own (`next`, `for_thread`) and the engine's `create_qp`, which also keeps count of the
//! entries promised to each CQ so none can overrun.

use crate::fabric::{Context, Cq};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How QPs are spread over the CQs of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Each new QP takes the next CQ (with room).
    RoundRobin,
    /// QPs created on the same thread share a CQ (with room).
    PerThread,
}

/// Several completion queues, handed out round-robin or per thread ([`Assignment`]).
pub struct CqPool {
    cqs: Vec<Cq>,
    next: AtomicUsize,
    /// Entries promised to QPs, per CQ (engine placement: never more than its depth).
    reserved: Vec<AtomicU64>,
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
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "CQs in a CQ pool",
                value: 0,
                min: 1,
                max: u32::MAX.into(),
            }));
        }
        let cqs = (0..count)
            .map(|_| ctx.create_cq(depth))
            .collect::<rdmapool_core::Result<Vec<_>>>()?;
        Self::from_cqs(cqs)
    }

    /// A pool of CQs made elsewhere (at least one).
    pub fn from_cqs(cqs: Vec<Cq>) -> Result<Self> {
        if cqs.is_empty() {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "CQs in a CQ pool",
                value: 0,
                min: 1,
                max: u32::MAX.into(),
            }));
        }
        Ok(Self {
            reserved: cqs.iter().map(|_| AtomicU64::new(0)).collect(),
            cqs,
            next: AtomicUsize::new(0),
        })
    }

    /// Where `assignment` starts looking (taken modulo the number of CQs).
    fn start(&self, assignment: Assignment) -> usize {
        match assignment {
            Assignment::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed),
            Assignment::PerThread => thread_hash(),
        }
    }

    /// The CQ `assignment` picks, without regard to room.
    pub fn pick(&self, assignment: Assignment) -> &Cq {
        &self.cqs[self.start(assignment) % self.cqs.len()]
    }

    /// The next CQ, round-robin.
    pub fn next(&self) -> &Cq {
        self.pick(Assignment::RoundRobin)
    }

    /// The CQ this thread always gets.
    pub fn for_thread(&self) -> &Cq {
        self.pick(Assignment::PerThread)
    }

    /// All CQs.
    pub fn cqs(&self) -> &[Cq] {
        &self.cqs
    }

    /// Places a QP that needs `need` entries: the first CQ from where `assignment` starts
    /// that has that much room left, which is then promised to it. Give it back with
    /// [`Self::unreserve`].
    pub(crate) fn reserve(&self, assignment: Assignment, need: u64) -> Result<usize> {
        let n = self.cqs.len();
        let start = self.start(assignment);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| {
                let depth = self.cqs[i].depth() as u64;
                self.reserved[i]
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                        (r + need <= depth).then_some(r + need)
                    })
                    .is_ok()
            })
            .ok_or_else(|| {
                Error::Core(crate::CoreError::OutOfLimits {
                    what: "CQ entries a QP needs, send + receive depth (use deeper or more CQs)",
                    value: need,
                    min: 0,
                    // The most room any CQ has left now.
                    max: (0..n)
                        .map(|i| {
                            let depth = self.cqs[i].depth() as u64;
                            depth.saturating_sub(self.reserved[i].load(Ordering::Acquire))
                        })
                        .max()
                        .unwrap_or(0),
                })
            })
    }

    /// Gives back what [`Self::reserve`] promised on CQ `cq`.
    pub(crate) fn unreserve(&self, cq: usize, need: u64) {
        self.reserved[cq].fetch_sub(need, Ordering::AcqRel);
    }
}

/// A number fixed for the calling thread: the per-thread choice of a CQ.
fn thread_hash() -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut h);
    h.finish() as usize
}
