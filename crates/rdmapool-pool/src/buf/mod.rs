//! Pre-registered buffer pools: 2 MiB huge-page chunks, registered once through the
//! [`crate::mr::Registrar`], carved into size classes. Allocation pops a slot
//! from a per-thread cache (no lock on the common path), then from the pool's shared free
//! list; it never registers memory. When free slots run low the pool asks the registrar for
//! another chunk in the background; [`BufferPool::alloc`] never waits for it, and
//! [`BufferPool::alloc_wait`] waits up to a timeout.

mod buffer;

use crate::fabric::recorder::{MemEvent, Recorder};
use crate::fabric::{AccessFlags, Mr, Pd, RegisteredMemory};
use crate::mr::{HugeOptions, HugeRegion, OwnedRegHandle, Registrar, RegistrarConfig, HUGE_PAGE};
use crate::{Error, Result};
pub use buffer::Pooled;
use parking_lot::{Condvar, Mutex};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The size classes, smallest first (each a power of two dividing 2 MiB).
pub const CLASSES: [usize; 8] = [
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    2 << 20,
];
/// Slots a thread keeps per class before handing frees back to the pool.
const THREAD_CACHE: usize = 64;

/// How a pool is set up. The default pins 4 MiB ([`PoolConfig::default`]), inside an
/// ordinary account's 8 MiB locked-memory limit.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Chunks registered for each served class before `new` returns, so that `alloc` of
    /// every class works at once (0: every class starts empty and grows on first use). The
    /// first of them is shared: the served classes below 2 MiB are carved out of one 2 MiB
    /// chunk (the largest of them gets half of it, the next a quarter, and so on; the
    /// smallest takes what is left), and only the 2 MiB class, if served, has a chunk of its
    /// own. Every further chunk, and every chunk a class grows by, is a whole 2 MiB chunk of
    /// one class.
    pub chunks_per_class: usize,
    /// The largest buffer the pool serves (rounded up to a class); the classes above it get
    /// no chunk, and asking for them is an error. 2 MiB (all classes) by default.
    pub largest: usize,
    /// Most chunks the pool may ever register.
    pub max_chunks: usize,
    /// When a class has fewer free slots than this, another chunk is requested.
    pub low_watermark: usize,
    /// Access rights of the registered chunks. Local only (plus [`AccessFlags::MW_BIND`])
    /// by default: a chunk-wide remote key would let a peer reach every buffer of the chunk,
    /// not just the one it was given. Export one buffer with a memory window bound to exactly
    /// it ([`crate::fabric::Qp::post_bind_mw`]).
    pub access: AccessFlags,
}

impl Default for PoolConfig {
    /// Every class served (up to 2 MiB), each with memory from `new` (`chunks_per_class` 1:
    /// the classes below 2 MiB share one 2 MiB chunk, the 2 MiB class has its own): two
    /// chunks, **4 MiB pinned**, which leaves room for a program's other regions inside the
    /// 8 MiB locked-memory limit (`ulimit -l` 8192) of an ordinary account. Growth (a class running low) pins 2 MiB more per chunk, up to
    /// `max_chunks` (256: 512 MiB); local-only access plus `MW_BIND`; a low watermark of 4.
    fn default() -> Self {
        Self {
            chunks_per_class: 1,
            largest: CLASSES[CLASSES.len() - 1],
            max_chunks: 256,
            low_watermark: 4,
            access: AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND),
        }
    }
}

/// Pool counters (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Chunks registered.
    pub chunks: u64,
    /// Bytes registered (and pinned): 2 MiB per chunk.
    pub bytes_registered: u64,
    /// Buffers handed out over the pool's life.
    pub allocations: u64,
    /// Buffers currently handed out.
    pub in_use: u64,
    /// Allocations that found no free slot.
    pub empty: u64,
    /// Chunk registrations requested after `new` because a class ran low or out.
    pub growths: u64,
}

/// A chunk being registered, and how it is to be carved.
type Growing = (Carve, OwnedRegHandle<HugeRegion>);

#[derive(Debug, Clone, Copy)]
struct Slot {
    addr: usize,
    lkey: u32,
    rkey: u32,
}

struct Shared {
    id: u64,
    cfg: PoolConfig,
    free: [Mutex<Vec<Slot>>; CLASSES.len()],
    arrived: Condvar,
    arrived_lock: Mutex<()>,
    /// The registered chunks (each registration drops before its memory).
    chunks: Mutex<Vec<Mr<HugeRegion>>>,
    growing: Mutex<Vec<Growing>>,
    /// The first failed chunk registration (reported by `new`).
    first_error: Mutex<Option<Error>>,
    registrar: Registrar,
    /// The context's recorder (pool events).
    recorder: Arc<Recorder>,
    /// Classes `0..served` are served.
    served: usize,
    allocations: AtomicU64,
    in_use: AtomicU64,
    empty: AtomicU64,
    growths: AtomicU64,
    chunk_count: AtomicUsize,
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Per-thread free slots: pool id -> one list per class.
    static CACHE: RefCell<HashMap<u64, Vec<Vec<Slot>>>> = RefCell::new(HashMap::new());
}

/// A pool of pre-registered buffers.
///
/// ```
/// use rdmapool_pool::buf::{BufferPool, PoolConfig};
/// use rdmapool_pool::fabric::{Context, RegisteredMemory, SoftConfig};
/// # fn main() -> rdmapool_pool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
/// let pool = BufferPool::new(pd, PoolConfig::default())?;
/// let small = pool.alloc(200)?;          // every class has memory from `new`: no registration
/// let buf = pool.alloc(4096)?;
/// buf.write_at(0, b"ready for RDMA")?;
/// let _sge = buf.sge(0, 14)?;            // carries the pool chunk's lkey
/// // When a class runs out, `alloc` says PoolExhausted and more is registered in the
/// // background; `alloc_wait` waits for it.
/// let _more = pool.alloc_wait(4096, std::time::Duration::from_secs(10))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

fn class_of(len: usize) -> Option<usize> {
    CLASSES.iter().position(|&c| c >= len)
}

/// What a chunk is carved into: `(class, bytes)` in order from its start, `HUGE_PAGE` bytes
/// in all, each part a multiple of its class.
type Carve = Vec<(usize, usize)>;

const _: () = assert!(CLASSES[CLASSES.len() - 1] == HUGE_PAGE);

/// A whole chunk of one class.
fn whole(class: usize) -> Carve {
    vec![(class, HUGE_PAGE)]
}

/// One chunk shared by the `served` classes below 2 MiB (at least one): the largest gets
/// half, the next a quarter, ..., the smallest what is left (as much as the second
/// smallest). Class `i` is `256 << 2i` bytes and its part `2 MiB >> (k - i)` (`i >= 1`,
/// `k <= 7` classes), so every part holds at least one buffer of its class.
fn shared_chunk(served: usize) -> Carve {
    let k = served.min(CLASSES.len() - 1);
    (0..k).map(|i| (i, HUGE_PAGE >> (k - i.max(1)))).collect()
}

impl BufferPool {
    /// Registers the chunks [`PoolConfig::chunks_per_class`] asks for (through a registrar of
    /// its own) and returns once they are registered. A registration the locked-memory limit
    /// refuses is [`CoreError::MemlockLimit`](crate::CoreError::MemlockLimit), whose message says how to raise the limit.
    pub fn new(pd: Pd, cfg: PoolConfig) -> Result<Self> {
        cfg.access.validate()?;
        let served =
            class_of(cfg.largest.max(1)).ok_or(Error::Core(crate::CoreError::OutOfLimits {
                what: "PoolConfig::largest (bytes)",
                value: cfg.largest as u64,
                min: 1,
                max: CLASSES[CLASSES.len() - 1] as u64,
            }))? + 1;
        // The first round: one chunk shared by the classes below 2 MiB, one for 2 MiB.
        let first = 1 + usize::from(served == CLASSES.len());
        let initial = match cfg.chunks_per_class {
            0 => 0,
            n => (n - 1).saturating_mul(served).saturating_add(first),
        };
        if cfg.max_chunks == 0 || initial > cfg.max_chunks {
            // max_chunks must be positive and hold the chunks_per_class the classes start with.
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "PoolConfig::max_chunks (chunks_per_class x classes served)",
                value: cfg.max_chunks as u64,
                min: initial.max(1) as u64,
                max: usize::MAX as u64,
            }));
        }
        let recorder = pd.recorder().clone();
        let registrar = Registrar::new(
            pd,
            RegistrarConfig {
                workers: 1,
                ..RegistrarConfig::default()
            },
        )?;
        let shared = Arc::new(Shared {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            cfg: cfg.clone(),
            free: std::array::from_fn(|_| Mutex::new(Vec::new())),
            arrived: Condvar::new(),
            arrived_lock: Mutex::new(()),
            chunks: Mutex::new(Vec::new()),
            growing: Mutex::new(Vec::new()),
            first_error: Mutex::new(None),
            registrar,
            recorder,
            served,
            allocations: AtomicU64::new(0),
            in_use: AtomicU64::new(0),
            empty: AtomicU64::new(0),
            growths: AtomicU64::new(0),
            chunk_count: AtomicUsize::new(0),
        });
        let pool = Self { shared };
        for round in 0..cfg.chunks_per_class {
            if round == 0 {
                pool.grow(shared_chunk(served), false)?;
                if served == CLASSES.len() {
                    pool.grow(whole(served - 1), false)?;
                }
            } else {
                for class in 0..served {
                    pool.grow(whole(class), false)?;
                }
            }
        }
        pool.collect(Some(Instant::now() + Duration::from_secs(60)));
        if let Some(class) = (0..served)
            .filter(|_| cfg.chunks_per_class > 0)
            .find(|&c| pool.shared.free[c].lock().is_empty())
        {
            return Err(pool.shared.first_error.lock().take().unwrap_or_else(|| {
                Error::PoolChunkFailed {
                    class: CLASSES[class],
                }
            }));
        }
        Ok(pool)
    }

    /// Requests one more chunk carved as `carve` from the registrar (does not wait);
    /// `growth` says whether it counts as growth (not the chunks `new` registers).
    fn grow(&self, carve: Carve, growth: bool) -> Result<()> {
        let s = &self.shared;
        if s.chunk_count.fetch_add(1, Ordering::AcqRel) >= s.cfg.max_chunks {
            s.chunk_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "chunks of the pool",
                value: s.cfg.max_chunks as u64 + 1,
                min: 1,
                max: s.cfg.max_chunks as u64,
            }));
        }
        let memory = HugeRegion::alloc(HUGE_PAGE, HugeOptions::default())?;
        let handle = s.registrar.submit_owned(memory, s.cfg.access);
        if growth {
            s.growths.fetch_add(1, Ordering::Relaxed);
        }
        s.growing.lock().push((carve, handle));
        Ok(())
    }

    /// Moves finished chunk registrations into the free lists; waits for them until
    /// `deadline` when given.
    fn collect(&self, deadline: Option<Instant>) {
        let s = &self.shared;
        let pending: Vec<_> = std::mem::take(&mut *s.growing.lock());
        let mut still = Vec::new();
        for (carve, handle) in pending {
            let done = deadline.is_some() || handle.state().is_final();
            if !done {
                still.push((carve, handle));
                continue;
            }
            match handle.wait() {
                Ok(mr) => {
                    let mut at = mr.addr() as usize;
                    for (class, bytes) in carve {
                        let size = CLASSES[class];
                        let slots = (0..bytes / size).map(|i| Slot {
                            addr: at + i * size,
                            lkey: mr.lkey(),
                            rkey: mr.rkey(),
                        });
                        s.free[class].lock().extend(slots);
                        at += bytes;
                    }
                    s.recorder.mem_event(MemEvent::PoolChunk);
                    s.chunks.lock().push(mr);
                }
                Err(e) => {
                    tracing::warn!("pool growth failed: {e}");
                    s.chunk_count.fetch_sub(1, Ordering::AcqRel);
                    s.first_error.lock().get_or_insert(e.error);
                }
            }
        }
        s.growing.lock().extend(still);
        s.arrived.notify_all();
    }

    /// A buffer of at least `len` bytes (up to the largest class served), or
    /// [`Error::PoolExhausted`] when its class has no free slot right now (more is
    /// registered in the background unless the pool is at `max_chunks`). Never registers
    /// memory.
    pub fn alloc(&self, len: usize) -> Result<Mr<Pooled>> {
        self.take(len, true)
    }

    /// [`BufferPool::alloc`]; `count_empty`: whether finding no slot counts in the pool's
    /// and the registry's `empty` counters (once per allocation, not per retry).
    fn take(&self, len: usize, count_empty: bool) -> Result<Mr<Pooled>> {
        let served = self.shared.served;
        let class = class_of(len)
            .filter(|&c| len > 0 && c < served)
            .ok_or(Error::Core(crate::CoreError::OutOfLimits {
                what: "buffer length",
                value: len as u64,
                min: 1,
                max: CLASSES[served - 1] as u64,
            }))?;
        let s = &self.shared;
        let slot = CACHE
            .with(|c| c.borrow_mut().get_mut(&s.id).and_then(|v| v[class].pop()))
            .or_else(|| self.refill(class));
        let Some(slot) = slot else {
            if count_empty {
                s.empty.fetch_add(1, Ordering::Relaxed);
                s.recorder.mem_event(MemEvent::PoolEmpty);
            }
            self.collect(None);
            if !growing(&s.growing.lock(), class) {
                let _ = self.grow(whole(class), true);
            }
            return Err(Error::PoolExhausted {
                class: CLASSES[class],
                chunks: s.chunk_count.load(Ordering::Acquire),
                max_chunks: s.cfg.max_chunks,
            });
        };
        s.allocations.fetch_add(1, Ordering::Relaxed);
        s.in_use.fetch_add(1, Ordering::Relaxed);
        s.recorder.mem_event(MemEvent::PoolAlloc);
        Ok(Pooled::buffer(slot, len, class, &self.shared))
    }

    /// Like [`BufferPool::alloc`], waiting up to `timeout` for a chunk being registered.
    pub fn alloc_wait(&self, len: usize, timeout: Duration) -> Result<Mr<Pooled>> {
        let deadline = Instant::now() + timeout;
        let mut first = true;
        loop {
            let r = self.take(len, first);
            first = false;
            match r {
                Err(Error::PoolExhausted { .. }) if Instant::now() < deadline => {
                    self.collect(None);
                    let mut g = self.shared.arrived_lock.lock();
                    self.shared
                        .arrived
                        .wait_for(&mut g, Duration::from_millis(1));
                }
                Err(Error::PoolExhausted { .. }) => {
                    return Err(Error::TimedOut("buffer allocation".into()))
                }
                other => return other,
            }
        }
    }

    /// Takes a batch of slots from the shared list into this thread's cache: half of them
    /// (at least one), at most `THREAD_CACHE / 2`, so that a class with few slots (a part
    /// of the shared first chunk) is not emptied, and grown, by its first allocation. Asks
    /// for more memory when the class runs low.
    fn refill(&self, class: usize) -> Option<Slot> {
        let s = &self.shared;
        let (got, left) = {
            let mut free = s.free[class].lock();
            let take = free.len().div_ceil(2).min(THREAD_CACHE / 2);
            let at = free.len() - take;
            (free.split_off(at), free.len())
        };
        if left < s.cfg.low_watermark {
            self.collect(None);
            if !growing(&s.growing.lock(), class) {
                let _ = self.grow(whole(class), true);
            }
        }
        let mut got = got;
        let first = got.pop()?;
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            let lists = c
                .entry(s.id)
                .or_insert_with(|| vec![Vec::new(); CLASSES.len()]);
            lists[class].extend(got);
        });
        Some(first)
    }

    /// Counters now.
    pub fn stats(&self) -> PoolStats {
        let s = &self.shared;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let chunks = s.chunks.lock().len() as u64;
        PoolStats {
            chunks,
            bytes_registered: chunks * HUGE_PAGE as u64,
            allocations: g(&s.allocations),
            in_use: g(&s.in_use),
            empty: g(&s.empty),
            growths: g(&s.growths),
        }
    }
}

/// Whether a chunk with slots of `class` is being registered.
fn growing(pending: &[Growing], class: usize) -> bool {
    pending
        .iter()
        .any(|(carve, ..)| carve.iter().any(|&(c, _)| c == class))
}
