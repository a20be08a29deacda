//! The registration cache: looks registrations up by address range (a cached registration
//! serves any sub-range it covers), hands out reference-counted handles, evicts the least
//! recently used under count and byte caps, counts what it does, and never returns a stale
//! registration: a userfaultfd monitor ([`super::monitor`]) drops entries whose memory is
//! unmapped, remapped or discarded, before the address can be reused. Where the monitor
//! cannot watch a range, the registration is handed out uncached instead.

use super::monitor::Shared as SharedMonitor;
use crate::fabric::recorder::{MemEvent, Recorder};
use crate::fabric::{AccessFlags, Mr, Pd, Raw, RegisteredMemory, ViewOwner};
use crate::util::page_size;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Limits and rights of a cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Most cached registrations.
    pub max_entries: usize,
    /// Most bytes kept registered by the cache.
    pub max_bytes: usize,
    /// Access rights of every registration the cache makes.
    pub access: AccessFlags,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_entries: 1024,
            max_bytes: 1 << 30,
            access: AccessFlags::all_remote(),
        }
    }
}

/// Counters and sizes (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served by a cached registration.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Entries dropped to stay under the caps.
    pub evictions: u64,
    /// Entries dropped because their memory changed (monitor) or on request.
    pub invalidations: u64,
    /// Registrations handed out uncached because their range could not be watched.
    pub uncached: u64,
    /// Bytes the cache keeps registered.
    pub bytes_pinned: u64,
    /// Entries in the cache.
    pub live_entries: u64,
}

#[derive(Debug)]
struct Entry {
    start: usize,
    end: usize,
    mr: Mr<Raw>,
    last_use: AtomicU64,
}

/// The owner of a cached registration's handle ([`RegCache::get`] gives `Mr<Cached>`):
/// keeps the registration alive while any handle lives, even after eviction or invalidation.
///
/// As registered memory the handle is the range asked for: offset 0 is the address passed
/// to [`RegCache::get`]. [`Cached::registration`] is the whole registration (pages rounded
/// out, maybe shared with other ranges).
#[derive(Debug, Clone)]
pub struct Cached {
    entry: Arc<Entry>,
}

impl Cached {
    /// The whole registration.
    pub fn registration(&self) -> &Mr<Raw> {
        &self.entry.mr
    }
}

// SAFETY: a `Cached` shows only its registration's handle, which gives no Rust reference to
// the bytes.
unsafe impl ViewOwner for Cached {}

/// A handle to `[a, a+len)` inside `entry`'s registration.
///
/// # Safety
/// `[a, a+len)` lies inside the entry's range, and is mapped while the handle lives (the
/// [`RegCache::get`] contract).
unsafe fn handle(entry: &Arc<Entry>, a: usize, len: usize) -> Mr<Cached> {
    let mr = &entry.mr;
    let owner = Cached {
        entry: entry.clone(),
    };
    // SAFETY: the entry's registration covers the range and lives as long as the owner
    // (contract above).
    unsafe { Mr::view(a as u64, len, mr.lkey(), mr.rkey(), mr.access(), owner) }
}

#[derive(Default)]
struct State {
    entries: BTreeMap<(usize, u64), Arc<Entry>>,
    bytes: usize,
    next_id: u64,
}

struct Counters {
    /// The context's recorder, which the cache's events are added to as well.
    recorder: Arc<Recorder>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    uncached: AtomicU64,
    tick: AtomicU64,
}

fn drop_overlapping(state: &Mutex<State>, counters: &Counters, start: usize, len: usize) {
    let end = start.saturating_add(len);
    let mut s = state.lock();
    let doomed: Vec<_> = s
        .entries
        .iter()
        .filter(|(_, e)| e.start < end && e.end > start)
        .map(|(k, _)| *k)
        .collect();
    for k in doomed {
        if let Some(e) = s.entries.remove(&k) {
            s.bytes -= e.end - e.start;
            counters.invalidations.fetch_add(1, Ordering::Relaxed);
            counters.recorder.mem_event(MemEvent::CacheInvalidation);
        }
    }
}

/// A registration cache for one PD.
///
/// ```
/// use rdmapool_pool::fabric::{Context, RegisteredMemory, SoftConfig};
/// use rdmapool_pool::mr::{CacheConfig, RegCache};
/// # fn main() -> rdmapool_pool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;
/// let cache = RegCache::new(pd, CacheConfig::default())?;
/// let buf = vec![0u8; 1 << 16];
/// // SAFETY: `buf` outlives every use of the handles below.
/// let a = unsafe { cache.get(buf.as_ptr(), buf.len())? };
/// let b = unsafe { cache.get(buf[100..].as_ptr(), 64)? };   // a sub-range: a hit
/// assert_eq!(a.lkey(), b.lkey());
/// assert_eq!(cache.stats().hits, 1);
/// # Ok(()) }
/// ```
pub struct RegCache {
    pd: Pd,
    cfg: CacheConfig,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
    /// The process-wide monitor and our subscription, or why there is none.
    monitor: std::result::Result<(&'static SharedMonitor, u64), String>,
}

impl RegCache {
    /// A cache over `pd`. Starts the memory monitor; where userfaultfd is not allowed the
    /// cache still works but hands registrations out uncached ([`RegCache::monitoring`]).
    pub fn new(pd: Pd, cfg: CacheConfig) -> Result<Self> {
        cfg.access.validate()?;
        if cfg.max_entries == 0 || cfg.max_bytes == 0 {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: if cfg.max_entries == 0 {
                    "CacheConfig::max_entries"
                } else {
                    "CacheConfig::max_bytes"
                },
                value: 0,
                min: 1,
                max: usize::MAX as u64,
            }));
        }
        let state = Arc::new(Mutex::new(State::default()));
        let counters = Arc::new(Counters {
            recorder: pd.recorder().clone(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            uncached: AtomicU64::new(0),
            tick: AtomicU64::new(0),
        });
        let (st, co) = (state.clone(), counters.clone());
        let monitor = SharedMonitor::get().map(|m| {
            let id = m.subscribe(Arc::new(move |start, len| {
                drop_overlapping(&st, &co, start, len)
            }));
            (m, id)
        });
        Ok(Self {
            pd,
            cfg,
            state,
            counters,
            monitor,
        })
    }

    /// Whether stale-memory detection is active; the reason when it is not.
    pub fn monitoring(&self) -> std::result::Result<(), String> {
        self.monitor.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// A registration covering `[addr, addr+len)`: cached, or registered now (pages rounded
    /// out) and cached.
    ///
    /// # Safety
    /// The range must be mapped memory of this process while the returned handle lives
    /// (the [`Pd::register_raw`] contract); unmapping it after that is fine — the cache
    /// notices and never hands the stale registration out again.
    pub unsafe fn get(&self, addr: *const u8, len: usize) -> Result<Mr<Cached>> {
        super::check_raw(addr, len, "memory to cache", "bytes to cache")?;
        let a = addr as usize;
        let want_end = a
            .checked_add(len)
            .ok_or(Error::Core(crate::CoreError::OutOfLimits {
                what: "bytes to cache at this address",
                value: len as u64,
                min: 1,
                max: (usize::MAX - a) as u64,
            }))?;
        let tick = self.counters.tick.fetch_add(1, Ordering::Relaxed);
        // No lookup while the monitor applies an unmap it has just read (see monitor::gate).
        let _gate = self.monitor.is_ok().then(super::monitor::gate);
        {
            let s = self.state.lock();
            // Entries are keyed by start; any that covers us starts at or before `a`.
            if let Some(e) = s
                .entries
                .range(..=(a, u64::MAX))
                .rev()
                .map(|(_, e)| e)
                .find(|e| e.end >= want_end)
            {
                e.last_use.store(tick, Ordering::Relaxed);
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.counters.recorder.mem_event(MemEvent::CacheHit);
                // SAFETY: the entry covers [a, want_end); the caller keeps it mapped.
                return Ok(unsafe { handle(e, a, len) });
            }
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.counters.recorder.mem_event(MemEvent::CacheMiss);
        let page = page_size();
        let start = a & !(page - 1);
        let end = want_end.div_ceil(page) * page;
        // SAFETY: the caller's contract covers [addr, addr+len); the rounded-out pages are
        // part of the same mappings (mappings are page granular).
        let mr = unsafe {
            self.pd
                .register_raw(start as *mut u8, end - start, self.cfg.access)?
        };
        let entry = Arc::new(Entry {
            start,
            end,
            mr,
            last_use: AtomicU64::new(tick),
        });
        let watched = self
            .monitor
            .as_ref()
            .is_ok_and(|(m, _)| m.watch(start, end - start).is_ok());
        if !watched {
            self.counters.uncached.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the entry was made for [a, want_end); the caller keeps it mapped.
            return Ok(unsafe { handle(&entry, a, len) });
        }
        let mut s = self.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.entries.insert((start, id), entry.clone());
        s.bytes += end - start;
        while s.entries.len() > self.cfg.max_entries || s.bytes > self.cfg.max_bytes {
            let victim = s
                .entries
                .iter()
                .filter(|(k, _)| **k != (start, id))
                .min_by_key(|(_, e)| e.last_use.load(Ordering::Relaxed))
                .map(|(k, _)| *k);
            let Some(k) = victim else { break };
            if let Some(e) = s.entries.remove(&k) {
                s.bytes -= e.end - e.start;
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                self.counters.recorder.mem_event(MemEvent::CacheEviction);
            }
        }
        // SAFETY: as above.
        Ok(unsafe { handle(&entry, a, len) })
    }

    /// Drops every cached registration overlapping `[addr, addr+len)` (handles still in use
    /// keep theirs alive until dropped).
    pub fn invalidate(&self, addr: *const u8, len: usize) {
        drop_overlapping(&self.state, &self.counters, addr as usize, len);
    }

    /// Counters and sizes now.
    pub fn stats(&self) -> CacheStats {
        let s = self.state.lock();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counters;
        CacheStats {
            hits: g(&c.hits),
            misses: g(&c.misses),
            evictions: g(&c.evictions),
            invalidations: g(&c.invalidations),
            uncached: g(&c.uncached),
            bytes_pinned: s.bytes as u64,
            live_entries: s.entries.len() as u64,
        }
    }
}

impl Drop for RegCache {
    fn drop(&mut self) {
        // Ranges stay registered with the shared monitor (another cache may watch them too);
        // their events simply find no entry any more.
        if let Ok((m, id)) = &self.monitor {
            m.unsubscribe(*id);
        }
    }
}
