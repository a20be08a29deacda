//! `stress --mix reg,cache,pool`: every thread runs the listed kinds of work interleaved, one
//! operation of each kind per round, as a loaded service would:
//!
//! - `reg`: registers its own region (`--size` / `--threads` bytes) through the asynchronous
//!   registrar and deregisters it again (timed apart);
//! - `cache`: looks buffers up in a registration cache: a working set of `--cache-buffers`
//!   buffers of `--cache-size` bytes shared by all threads (hits once registered), and every
//!   `--cache-miss-every`th lookup a buffer allocated for it (a miss that registers; its
//!   entry is invalidated and the buffer freed afterwards);
//! - `pool`: allocates `--pool-size` bytes from a pre-registered buffer pool, keeps the last
//!   few buffers (a service holds buffers while requests are in flight) and frees the oldest.

use super::histogram;
use super::memory::{Buffers, MemoryMode};
use crate::{Result, ToolError};
use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::{AccessFlags, Pd};
use rdmapool::mr::{CacheConfig, RegCache, Registrar, RegistrarConfig};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One kind of work in a mixed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Register and deregister a region through the asynchronous registrar.
    Reg,
    /// Registration-cache lookups: hits on a shared working set, some misses that register.
    Cache,
    /// Buffer-pool allocations and frees from a pre-registered pool.
    Pool,
}

impl Kind {
    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Reg => "reg",
            Kind::Cache => "cache",
            Kind::Pool => "pool",
        }
    }
}

/// Buffers a pool thread keeps allocated before freeing the oldest.
const POOL_HELD: usize = 4;

/// The mixed run's settings, sizes resolved.
pub struct Plan {
    /// The kinds, in the order each round runs them.
    pub kinds: Vec<Kind>,
    /// Threads, each running every kind.
    pub threads: usize,
    /// Rounds per thread.
    pub count: u64,
    /// `reg`: bytes per region.
    pub region_bytes: usize,
    /// `reg`: 2 MiB pages.
    pub hugepages: bool,
    /// `cache`: bytes of each buffer looked up.
    pub cache_size: usize,
    /// `cache`: buffers in the shared working set.
    pub cache_buffers: usize,
    /// `cache`: one lookup in this many misses.
    pub cache_miss_every: u64,
    /// `pool`: bytes per allocation.
    pub pool_size: usize,
}

impl Plan {
    /// Bytes the run may keep pinned at once, for the memlock check.
    pub fn pinned_bytes(&self) -> usize {
        let mut b = 0;
        if self.kinds.contains(&Kind::Reg) {
            let page = if self.hugepages { 2 << 20 } else { 4096 };
            b += self.threads * self.region_bytes.next_multiple_of(page);
        }
        if self.kinds.contains(&Kind::Cache) {
            b += (self.cache_buffers + self.threads) * (self.cache_size + 8192);
        }
        if self.kinds.contains(&Kind::Pool) {
            b += self.pool_max_chunks() * (2 << 20);
        }
        b
    }

    fn pool_max_chunks(&self) -> usize {
        // One chunk per served class up front, and room to grow for the held buffers and the
        // per-thread slot caches.
        let per_chunk = ((2usize << 20) / self.pool_size.next_power_of_two()).max(1);
        rdmapool::buf::CLASSES.len() + (self.threads * (POOL_HELD + 64)).div_ceil(per_chunk)
    }
}

/// What one kind measured.
pub struct KindStats {
    /// The kind.
    pub kind: Kind,
    /// Operations that succeeded.
    pub ops: u64,
    /// Operations that failed.
    pub failures: u64,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Latency of each operation, ns.
    pub latency: hdrhistogram::Histogram<u64>,
    /// `reg` only: deregistration latency, ns.
    pub dereg: hdrhistogram::Histogram<u64>,
    /// `cache` only: latency of the lookups on new buffers (misses that register), ns;
    /// they are in `latency` too.
    pub misses: hdrhistogram::Histogram<u64>,
}

impl KindStats {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            ops: 0,
            failures: 0,
            first_error: None,
            latency: histogram(),
            dereg: histogram(),
            misses: histogram(),
        }
    }

    fn fail(&mut self, e: impl std::fmt::Display) {
        self.failures += 1;
        self.first_error.get_or_insert_with(|| e.to_string());
    }

    fn merge(&mut self, o: KindStats) {
        self.ops += o.ops;
        self.failures += o.failures;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        let _ = self.latency.add(&o.latency);
        let _ = self.dereg.add(&o.dereg);
        let _ = self.misses.add(&o.misses);
    }
}

/// The whole mixed run's result.
pub struct MixResult {
    /// One entry per kind, in the plan's order.
    pub kinds: Vec<KindStats>,
    /// Wall time of the run, s.
    pub wall: f64,
    /// The cache's counters at the end (when `cache` ran).
    pub cache: Option<rdmapool::mr::CacheStats>,
    /// The pool's counters at the end (when `pool` ran).
    pub pool: Option<rdmapool::buf::PoolStats>,
    /// Set when SIGINT or SIGTERM ended the run early: the most rounds a thread finished.
    pub interrupted_after: Option<u64>,
}

fn ns(since: Instant) -> u64 {
    since.elapsed().as_nanos().max(1) as u64
}

/// Runs the plan on `pd`.
pub fn run(plan: &Plan, pd: &Pd) -> Result<MixResult> {
    let has = |k| plan.kinds.contains(&k);
    let reg = Registrar::new(
        pd.clone(),
        RegistrarConfig {
            workers: plan.threads,
            ..RegistrarConfig::default()
        },
    )?;
    // The working set outlives the cache: `cache` is dropped at the end of this function,
    // before `working` (declared first, dropped last).
    let working: Vec<Vec<u8>> = if has(Kind::Cache) {
        (0..plan.cache_buffers)
            .map(|_| vec![1u8; plan.cache_size])
            .collect()
    } else {
        Vec::new()
    };
    let cache = if has(Kind::Cache) {
        Some(RegCache::new(
            pd.clone(),
            CacheConfig {
                max_entries: plan.cache_buffers + 2 * plan.threads + 16,
                max_bytes: (plan.cache_buffers + 2 * plan.threads) * (plan.cache_size + 8192),
                access: AccessFlags::all_remote(),
            },
        )?)
    } else {
        None
    };
    let pool = if has(Kind::Pool) {
        Some(BufferPool::new(
            pd.clone(),
            PoolConfig {
                largest: plan.pool_size,
                max_chunks: plan.pool_max_chunks(),
                ..PoolConfig::default()
            },
        )?)
    } else {
        None
    };
    let started = Instant::now();
    let per_thread: Vec<Result<(u64, Vec<KindStats>)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..plan.threads)
            .map(|t| {
                let (reg, cache, pool, working) = (&reg, cache.as_ref(), pool.as_ref(), &working);
                s.spawn(move || worker(plan, t, reg, cache, pool, working))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(ToolError::Msg("a stress thread panicked".into())))
            })
            .collect()
    });
    let wall = started.elapsed().as_secs_f64();
    let mut kinds: Vec<KindStats> = plan.kinds.iter().map(|&k| KindStats::new(k)).collect();
    // (fewest, most) rounds a thread did: fewer than asked anywhere means interrupted.
    let (mut fewest, mut most) = (plan.count, 0);
    for r in per_thread {
        let (rounds, stats) = r?;
        (fewest, most) = (fewest.min(rounds), most.max(rounds));
        for (all, mine) in kinds.iter_mut().zip(stats) {
            all.merge(mine);
        }
    }
    let result = MixResult {
        kinds,
        wall,
        cache: cache.as_ref().map(RegCache::stats),
        pool: pool.as_ref().map(BufferPool::stats),
        interrupted_after: (fewest < plan.count).then_some(most),
    };
    drop(cache); // its registrations go before the working set they cover
    drop(working);
    Ok(result)
}

/// One thread's rounds (fewer when SIGINT or SIGTERM comes): how many it did, and what it
/// measured.
fn worker(
    plan: &Plan,
    t: usize,
    reg: &Registrar,
    cache: Option<&RegCache>,
    pool: Option<&BufferPool>,
    working: &[Vec<u8>],
) -> Result<(u64, Vec<KindStats>)> {
    let mut stats: Vec<KindStats> = plan.kinds.iter().map(|&k| KindStats::new(k)).collect();
    let mut alloc = histogram();
    let mut mine = Buffers::new(MemoryMode::Pooled, plan.hugepages, plan.region_bytes, 1);
    let mut held = VecDeque::with_capacity(POOL_HELD + 1);
    for round in 0..plan.count {
        if crate::signals::stopped() {
            return Ok((round, stats));
        }
        for st in stats.iter_mut() {
            match st.kind {
                Kind::Reg => {
                    let buf = mine.take(&mut alloc)?;
                    let buf = buf.into_iter().next().expect("one buffer per thread");
                    let t0 = Instant::now();
                    match reg.submit_owned(buf, AccessFlags::all_remote()).wait() {
                        Ok(mr) => {
                            st.latency.saturating_record(ns(t0));
                            let t1 = Instant::now();
                            let buf = mr.into_inner(); // deregisters
                            st.dereg.saturating_record(ns(t1));
                            st.ops += 1;
                            mine.give_back(vec![buf]);
                        }
                        Err(e) => {
                            st.fail(&e.error);
                            mine.give_back(vec![e.into_inner()]);
                        }
                    }
                }
                Kind::Cache => {
                    let cache = cache.expect("made when cache is listed");
                    let i = round * plan.threads as u64 + t as u64;
                    if round % plan.cache_miss_every == plan.cache_miss_every - 1 {
                        // A buffer the cache has not seen: a miss that registers.
                        let cold = vec![2u8; plan.cache_size];
                        let t0 = Instant::now();
                        // SAFETY: `cold` lives until after the handle is dropped and its
                        // entry invalidated, below.
                        let got = unsafe { cache.get(cold.as_ptr(), cold.len()) };
                        if got.is_ok() {
                            st.misses.saturating_record(ns(t0));
                        }
                        record(st, t0, got.map(drop));
                        cache.invalidate(cold.as_ptr(), cold.len());
                        drop(cold);
                    } else {
                        let b = &working[i as usize % working.len()];
                        let t0 = Instant::now();
                        // SAFETY: the working set outlives the cache (see `run`).
                        let got = unsafe { cache.get(b.as_ptr(), b.len()) };
                        record(st, t0, got.map(drop));
                    }
                }
                Kind::Pool => {
                    let pool = pool.expect("made when pool is listed");
                    let t0 = Instant::now();
                    let got = pool.alloc_wait(plan.pool_size, Duration::from_secs(10));
                    match got {
                        Ok(b) => {
                            st.latency.saturating_record(ns(t0));
                            st.ops += 1;
                            held.push_back(b);
                            if held.len() > POOL_HELD {
                                held.pop_front(); // frees
                            }
                        }
                        Err(e) => st.fail(e),
                    }
                }
            }
        }
    }
    Ok((plan.count, stats))
}

fn record(st: &mut KindStats, t0: Instant, r: rdmapool::Result<()>) {
    match r {
        Ok(()) => {
            st.latency.saturating_record(ns(t0));
            st.ops += 1;
        }
        Err(e) => st.fail(e),
    }
}
