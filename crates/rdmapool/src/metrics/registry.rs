//! The process-global registry: what every registration, deregistration, cache lookup, pool
//! allocation and completion in this process adds up to, and [`snapshot`] of it.
//!
//! Counters are relaxed atomics. The two latency histograms sit behind a mutex each, taken
//! only on the registration and deregistration paths (which make a system call or pin pages
//! anyway); the CQ poll path adds one relaxed atomic add per poll that returned work, plus
//! one per error completion.

use super::latency::{latency, Latency, LatencySummary};
use crate::fabric::WcStatus;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
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
}

struct Registry {
    started: Instant,
    reg: Mutex<Latency>,
    dereg: Mutex<Latency>,
    c: Counters,
}

fn global() -> &'static Registry {
    static G: OnceLock<Registry> = OnceLock::new();
    G.get_or_init(|| Registry {
        started: Instant::now(),
        reg: latency(),
        dereg: latency(),
        c: Counters::default(),
    })
}

/// Completions per status: a plain static (not in the lazily built registry), so the poll
/// path never allocates or initialises anything.
static COMPLETIONS: [AtomicU64; WcStatus::ALL.len()] =
    [const { AtomicU64::new(0) }; WcStatus::ALL.len()];

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One registration call (any provider, any path) returned after `took`.
pub(crate) fn record_registration(ok: bool, took: Duration) {
    let g = global();
    if ok {
        add(&g.c.registrations, 1);
        g.reg.lock().record(took);
    } else {
        add(&g.c.registration_errors, 1);
    }
}

/// A region of `len` bytes became registered.
pub(crate) fn region_added(len: usize) {
    add(&global().c.registered_bytes, len as u64);
}

/// A region of `len` bytes was deregistered; it took `took`.
pub(crate) fn record_deregistration(len: usize, took: Duration) {
    let g = global();
    add(&g.c.deregistrations, 1);
    g.c.registered_bytes
        .fetch_sub(len as u64, Ordering::Relaxed);
    g.dereg.lock().record(took);
}

/// What the registrar did besides registering.
#[derive(Clone, Copy)]
pub(crate) enum RegistrarEvent {
    Retry,
    TimedOut,
    Cancelled,
}

/// The registrar retried, timed out or cancelled a request.
pub(crate) fn registrar_event(e: RegistrarEvent) {
    let c = &global().c;
    add(
        match e {
            RegistrarEvent::Retry => &c.retries,
            RegistrarEvent::TimedOut => &c.timeouts,
            RegistrarEvent::Cancelled => &c.cancellations,
        },
        1,
    );
}

/// What a registration cache or buffer pool did.
#[derive(Clone, Copy)]
pub(crate) enum MemEvent {
    CacheHit,
    CacheMiss,
    CacheEviction,
    CacheInvalidation,
    PoolAlloc,
    PoolFree,
    PoolEmpty,
    PoolChunk,
}

/// A cache or pool event.
pub(crate) fn mem_event(e: MemEvent) {
    let c = &global().c;
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
pub(crate) fn record_connection(active: bool, ok: bool) {
    let c = &global().c;
    add(
        match (ok, active) {
            (false, _) => &c.connection_errors,
            (true, true) => &c.connected_active,
            (true, false) => &c.connected_passive,
        },
        1,
    );
}

/// Counts the statuses of `done` (one atomic add for the successes, one per error).
pub(crate) fn record_completions(done: &[crate::fabric::Completion]) {
    if done.is_empty() {
        return;
    }
    let c = &COMPLETIONS;
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

/// Everything the registry holds, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// This process's id.
    pub pid: u32,
    /// Seconds since the registry was first used.
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
    /// Connections established by `conn::connect` (active side).
    pub connections_active: u64,
    /// Connections established by accepting a request (passive side).
    pub connections_passive: u64,
    /// `conn::connect` or accept calls that failed (rejections included).
    pub connection_errors: u64,
    /// Sampled post-to-poll latency of successful work requests, per opcode (only opcodes
    /// with samples; see [`super::sample_op_latency`]).
    pub op_latency: Vec<(crate::fabric::WcOpcode, LatencySummary)>,
    /// One signalled work request in this many is timed (0: op latency is off).
    pub op_sample_every: u32,
    /// Whether completions are counted per CQ and per QP ([`super::track_objects`]).
    pub objects_tracked: bool,
    /// Completions per live CQ (`id`: [`crate::fabric::Cq::metrics_id`]), at most
    /// [`super::MAX_LISTED`], lowest ids first; counted while tracking was on.
    pub cqs: Vec<super::ObjectCompletions>,
    /// CQs alive now (may exceed `cqs.len()`).
    pub cqs_live: usize,
    /// Completions per live QP (`id`: its QP number), at most [`super::MAX_LISTED`], by
    /// device then number; counted while tracking was on.
    pub qps: Vec<super::ObjectCompletions>,
    /// QPs alive now (may exceed `qps.len()`).
    pub qps_live: usize,
    /// The memory servers (`remote::MemoryServer`) alive in the process, by node id, with
    /// their counters.
    pub pool_servers: Vec<(u32, crate::metrics::ServerStats)>,
}

/// A snapshot of the process-global registry.
pub fn snapshot() -> Snapshot {
    let g = global();
    let c = &g.c;
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    // Latencies first, counters after: a counter is never below its histogram's count.
    let registration_latency = g.reg.lock().summary();
    let deregistration_latency = g.dereg.lock().summary();
    let (cqs, cqs_live) = super::objects::cqs();
    let (qps, qps_live) = super::objects::qps();
    Snapshot {
        pid: std::process::id(),
        uptime_seconds: g.started.elapsed().as_secs_f64(),
        registrations: l(&c.registrations).max(registration_latency.count),
        registration_errors: l(&c.registration_errors),
        registration_latency,
        deregistrations: l(&c.deregistrations).max(deregistration_latency.count),
        deregistration_latency,
        registered_bytes: l(&c.registered_bytes),
        pinned_bytes: crate::os::pinned_bytes(),
        retries: l(&c.retries),
        timeouts: l(&c.timeouts),
        cancellations: l(&c.cancellations),
        cache_hits: l(&c.cache_hits),
        cache_misses: l(&c.cache_misses),
        cache_evictions: l(&c.cache_evictions),
        cache_invalidations: l(&c.cache_invalidations),
        pool_allocations: l(&c.pool_allocations),
        pool_in_use: l(&c.pool_in_use),
        pool_empty: l(&c.pool_empty),
        pool_chunks: l(&c.pool_chunks),
        completions: WcStatus::ALL
            .iter()
            .zip(COMPLETIONS.iter())
            .map(|(&s, n)| (s, l(n)))
            .filter(|&(_, n)| n > 0)
            .collect(),
        connections_active: l(&c.connected_active),
        connections_passive: l(&c.connected_passive),
        connection_errors: l(&c.connection_errors),
        op_latency: super::ops::summaries(),
        op_sample_every: super::ops::op_sample_every(),
        objects_tracked: super::objects_tracked(),
        cqs,
        cqs_live,
        qps,
        qps_live,
        pool_servers: super::pool_servers::snapshot(),
    }
}
