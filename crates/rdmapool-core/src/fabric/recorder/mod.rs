//! One context's recorder: what the registrations, deregistrations, cache lookups, pool
//! allocations, connections and completions of the objects opened on that context add up
//! to, and [`Snapshot`]s of it. Each [`crate::fabric::Context`] owns one; every object made
//! from the context (PD, MR, CQ, QP, and the registrars, caches, pools and connections built
//! on them) holds it and records into it; the layers above core (the pool's memory servers,
//! the store's clients) report through it as [`Section`]s of their own. Nothing is process-global
//! but the bytes pinned (an OS fact) and the numbering of CQs.
//!
//! Counters are relaxed atomics. The two latency histograms sit behind a mutex each, taken
//! only on the registration and deregistration paths (which make a system call or pin pages
//! anyway); the CQ poll path adds one relaxed atomic add per poll that returned work, plus
//! one per error completion.

use crate::fabric::WcStatus;
use latency::{latency, merged, Latency};
use objects::Objects;
use ops::OpSampler;

mod context_metrics;
mod json;
mod latency;
#[doc(hidden)]
pub mod objects;
mod ops;
mod opt_in;
mod prometheus;
mod sections;

pub use context_metrics::{snapshot_of, ContextMetrics};
pub use latency::{LatencySummary, BUCKETS_SECONDS, PERCENTILES};
pub use objects::{ObjectCompletions, MAX_LISTED};
pub use ops::{opcode_label, DEFAULT_OP_SAMPLE_EVERY};
use parking_lot::Mutex;
pub use prometheus::status_label;
pub use sections::{Section, Series, SeriesKind, Source, Sources};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Counters {
    registrations: AtomicU64,
    registration_errors: AtomicU64,
    deregistrations: AtomicU64,
    registered_bytes: AtomicU64,
    retries: AtomicU64,
    timeouts: AtomicU64,
    cancellations: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    cache_evictions: AtomicU64,
    cache_invalidations: AtomicU64,
    pool_allocations: AtomicU64,
    pool_in_use: AtomicU64,
    pool_empty: AtomicU64,
    pool_chunks: AtomicU64,
    connected_active: AtomicU64,
    connected_passive: AtomicU64,
    connection_errors: AtomicU64,
    sends_posted: AtomicU64,
}

/// What one context's objects did (see the module documentation).
#[doc(hidden)]
pub struct Recorder {
    started: Instant,
    reg: Mutex<Latency>,
    dereg: Mutex<Latency>,
    c: Counters,
    /// Completions per status.
    completions: [AtomicU64; WcStatus::ALL.len()],
    /// Completions per CQ and per QP (opt-in).
    #[doc(hidden)]
    pub objects: Objects,
    /// Sampled work-request latency (opt-in).
    #[doc(hidden)]
    pub ops: OpSampler,
    /// What the layers above core report on the context ([`Sources::register`]).
    #[doc(hidden)]
    pub sources: Sources,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// What the registrar did besides registering.
#[derive(Clone, Copy)]
#[doc(hidden)]
pub enum RegistrarEvent {
    Retry,
    TimedOut,
    Cancelled,
}

/// What a registration cache or buffer pool did.
#[derive(Clone, Copy)]
#[doc(hidden)]
pub enum MemEvent {
    CacheHit,
    CacheMiss,
    CacheEviction,
    CacheInvalidation,
    PoolAlloc,
    PoolFree,
    PoolEmpty,
    PoolChunk,
}

impl Recorder {
    /// A recorder with nothing recorded yet.
    #[doc(hidden)]
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            started: Instant::now(),
            reg: latency(),
            dereg: latency(),
            c: Counters::default(),
            completions: [const { AtomicU64::new(0) }; WcStatus::ALL.len()],
            objects: Objects::default(),
            ops: OpSampler::default(),
            sources: Sources::default(),
        })
    }

    /// One registration call (any provider, any path) returned after `took`.
    #[doc(hidden)]
    pub fn record_registration(&self, ok: bool, took: Duration) {
        let g = self;
        if ok {
            add(&g.c.registrations, 1);
            g.reg.lock().record(took);
        } else {
            add(&g.c.registration_errors, 1);
        }
    }

    /// A region of `len` bytes became registered.
    #[doc(hidden)]
    pub fn region_added(&self, len: usize) {
        add(&self.c.registered_bytes, len as u64);
    }

    /// A region of `len` bytes was deregistered; it took `took`.
    #[doc(hidden)]
    pub fn record_deregistration(&self, len: usize, took: Duration) {
        let g = self;
        add(&g.c.deregistrations, 1);
        g.c.registered_bytes
            .fetch_sub(len as u64, Ordering::Relaxed);
        g.dereg.lock().record(took);
    }

    /// The registrar retried, timed out or cancelled a request.
    #[doc(hidden)]
    pub fn registrar_event(&self, e: RegistrarEvent) {
        let c = &self.c;
        add(
            match e {
                RegistrarEvent::Retry => &c.retries,
                RegistrarEvent::TimedOut => &c.timeouts,
                RegistrarEvent::Cancelled => &c.cancellations,
            },
            1,
        );
    }

    /// A cache or pool event.
    #[doc(hidden)]
    pub fn mem_event(&self, e: MemEvent) {
        let c = &self.c;
        match e {
            MemEvent::CacheHit => add(&c.cache_hits, 1),
            MemEvent::CacheMiss => add(&c.cache_misses, 1),
            MemEvent::CacheEviction => add(&c.cache_evictions, 1),
            MemEvent::CacheInvalidation => add(&c.cache_invalidations, 1),
            MemEvent::PoolAlloc => {
                add(&c.pool_allocations, 1);
                add(&c.pool_in_use, 1);
            }
            MemEvent::PoolFree => {
                c.pool_in_use.fetch_sub(1, Ordering::Relaxed);
            }
            MemEvent::PoolEmpty => add(&c.pool_empty, 1),
            MemEvent::PoolChunk => add(&c.pool_chunks, 1),
        }
    }

    /// A connection attempt ended (`conn::connect` is the active side, `accept` the passive).
    #[doc(hidden)]
    pub fn record_connection(&self, active: bool, ok: bool) {
        let c = &self.c;
        add(
            match (ok, active) {
                (false, _) => &c.connection_errors,
                (true, true) => &c.connected_active,
                (true, false) => &c.connected_passive,
            },
            1,
        );
    }

    /// Counts `n` send work requests posted (RDMA READ, WRITE, atomics, SEND).
    #[doc(hidden)]
    pub fn record_sends(&self, n: usize) {
        add(&self.c.sends_posted, n as u64);
    }

    /// Counts the statuses of `done` (one atomic add for the successes, one per error).
    #[doc(hidden)]
    pub fn record_completions(&self, done: &[crate::fabric::Completion]) {
        if done.is_empty() {
            return;
        }
        let c = &self.completions;
        let mut ok = 0;
        for d in done {
            if d.status == WcStatus::Success {
                ok += 1;
            } else {
                add(&c[d.status as usize], 1);
            }
        }
        if ok > 0 {
            add(&c[WcStatus::Success as usize], ok);
        }
    }

    /// What this recorder holds, at one moment.
    #[doc(hidden)]
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of_recorders(&[self])
    }
}

/// What several recorders hold together, at one moment (the sum of their counters, their
/// histograms merged, their objects and sections listed together): what an endpoint serving
/// several contexts shows.
#[doc(hidden)]
pub fn snapshot_of_recorders(recorders: &[&Recorder]) -> Snapshot {
    let sum = |f: &dyn Fn(&Counters) -> &AtomicU64| -> u64 {
        recorders
            .iter()
            .map(|r| f(&r.c).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    };
    // Latencies first, counters after: a counter is never below its histogram's count.
    let registration_latency = merged(recorders.iter().map(|r| &r.reg));
    let deregistration_latency = merged(recorders.iter().map(|r| &r.dereg));
    let (cqs, cqs_live) = objects::cqs(recorders.iter().map(|r| &r.objects));
    let (qps, qps_live) = objects::qps(recorders.iter().map(|r| &r.objects));
    let started = recorders.iter().map(|r| r.started).min();
    Snapshot {
        pid: std::process::id(),
        uptime_seconds: started.map_or(0.0, |s| s.elapsed().as_secs_f64()),
        registrations: sum(&|c| &c.registrations).max(registration_latency.count),
        registration_errors: sum(&|c| &c.registration_errors),
        registration_latency,
        deregistrations: sum(&|c| &c.deregistrations).max(deregistration_latency.count),
        deregistration_latency,
        registered_bytes: sum(&|c| &c.registered_bytes),
        pinned_bytes: crate::os::pinned_bytes(),
        retries: sum(&|c| &c.retries),
        timeouts: sum(&|c| &c.timeouts),
        cancellations: sum(&|c| &c.cancellations),
        cache_hits: sum(&|c| &c.cache_hits),
        cache_misses: sum(&|c| &c.cache_misses),
        cache_evictions: sum(&|c| &c.cache_evictions),
        cache_invalidations: sum(&|c| &c.cache_invalidations),
        pool_allocations: sum(&|c| &c.pool_allocations),
        pool_in_use: sum(&|c| &c.pool_in_use),
        pool_empty: sum(&|c| &c.pool_empty),
        pool_chunks: sum(&|c| &c.pool_chunks),
        completions: WcStatus::ALL
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let n = recorders
                    .iter()
                    .map(|r| r.completions[i].load(Ordering::Relaxed))
                    .fold(0, u64::wrapping_add);
                (s, n)
            })
            .filter(|&(_, n)| n > 0)
            .collect(),
        sends_posted: sum(&|c| &c.sends_posted),
        connections_active: sum(&|c| &c.connected_active),
        connections_passive: sum(&|c| &c.connected_passive),
        connection_errors: sum(&|c| &c.connection_errors),
        op_latency: ops::summaries(recorders.iter().map(|r| &r.ops)),
        op_sample_every: recorders.iter().map(|r| r.ops.every()).max().unwrap_or(0),
        objects_tracked: recorders.iter().any(|r| r.objects.tracked()),
        cqs,
        cqs_live,
        qps,
        qps_live,
        sections: sections::snapshot(recorders.iter().map(|r| &r.sources)),
    }
}

/// Everything one or several recorders hold, at one moment (from
/// [`ContextMetrics::snapshot`] or `rdmapool::metrics::snapshot_of`).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// This process's id.
    pub pid: u32,
    /// Seconds since the (first) context was opened.
    pub uptime_seconds: f64,
    /// Successful registrations (`Pd::alloc_mr`, `Pd::register_raw`, and all that use them).
    pub registrations: u64,
    /// Registration calls that failed.
    pub registration_errors: u64,
    /// Registration latency (the registration call itself, not time queued).
    pub registration_latency: LatencySummary,
    /// Regions deregistered.
    pub deregistrations: u64,
    /// Deregistration latency.
    pub deregistration_latency: LatencySummary,
    /// Bytes in live registered regions (all providers).
    pub registered_bytes: u64,
    /// Bytes pinned by soft-provider registrations.
    pub pinned_bytes: u64,
    /// Registrar retries after ENOMEM/EAGAIN.
    pub retries: u64,
    /// Registrar requests past their timeout.
    pub timeouts: u64,
    /// Registrar requests cancelled.
    pub cancellations: u64,
    /// Registration cache hits.
    pub cache_hits: u64,
    /// Registration cache misses.
    pub cache_misses: u64,
    /// Registration cache evictions.
    pub cache_evictions: u64,
    /// Cache entries dropped because the memory changed.
    pub cache_invalidations: u64,
    /// Pool buffers handed out over time.
    pub pool_allocations: u64,
    /// Pool buffers handed out and not yet returned.
    pub pool_in_use: u64,
    /// Pool allocations that found no free slot.
    pub pool_empty: u64,
    /// Pool chunks registered.
    pub pool_chunks: u64,
    /// Work completions polled, per status (only statuses seen, in numeric order).
    pub completions: Vec<(WcStatus, u64)>,
    /// Send work requests posted (RDMA READ, WRITE, atomics, SEND): the operations the NIC
    /// was asked for (a list of them takes one doorbell and, signalled last, one
    /// completion).
    pub sends_posted: u64,
    /// Connections established by `conn::connect` (active side).
    pub connections_active: u64,
    /// Connections established by accepting a request (passive side).
    pub connections_passive: u64,
    /// `conn::connect` or accept calls that failed (rejections included).
    pub connection_errors: u64,
    /// Sampled post-to-poll latency of successful work requests, per opcode (only opcodes
    /// with samples; see [`ContextMetrics::sample_op_latency`]).
    pub op_latency: Vec<(crate::fabric::WcOpcode, LatencySummary)>,
    /// One signalled work request in this many is timed (0: op latency is off).
    pub op_sample_every: u32,
    /// Whether completions are counted per CQ and per QP
    /// ([`ContextMetrics::track_objects`]).
    pub objects_tracked: bool,
    /// Completions per live CQ (`id`: [`crate::fabric::Cq::metrics_id`]), at most
    /// [`objects::MAX_LISTED`], lowest ids first; counted while tracking was on.
    pub cqs: Vec<ObjectCompletions>,
    /// CQs alive now (may exceed `cqs.len()`).
    pub cqs_live: usize,
    /// Completions per live QP (`id`: its QP number), at most [`objects::MAX_LISTED`], by
    /// device then number; counted while tracking was on.
    pub qps: Vec<ObjectCompletions>,
    /// QPs alive now (may exceed `qps.len()`).
    pub qps_live: usize,
    /// What the layers above core report (the pool's memory servers, `pool_servers`; the
    /// store's clients, `store_clients`), by family then label.
    pub sections: Vec<Section>,
}
