//! [`Store`]: the store's machines (`lookup`, `get`, `put`, `root`) run on a [`PoolClient`]:
//! each step's operations are posted at once, on every node they name, and their answers fed
//! back. The blocks a put replaced are freed once the grace period has passed (docs/STORE.md
//! section 8), by this client's later calls or [`Store::flush_retired`].
//!
//! A file per concept of the client (issue #42): this file, the type, its configuration and
//! counters; `put.rs` put and remove, from bytes or from the caller's memory, fenced;
//! `get.rs` get and every lookup (exists, locate, list, the zero-copy get); `into.rs` the
//! zero-copy gets in one round from hints; `hints.rs` what
//! it keeps to save round trips (where keys were, blocks allocated ahead); `many.rs` batches; `stripe.rs` values above a block, in parts;
//! `replicas.rs` where a key lives (its replicas under the view, their indexes); `view.rs`
//! the numbered view and its fence; `gc.rs` space (retired blocks, gone writers' chunks);
//! `repair.rs` the repair; `repairer.rs` the repair that runs by itself; `cache.rs` cache
//! mode; `counts.rs` the per-server counters in the servers' index chunks.

use super::format::{check_sizes, Version};
use super::root::Index;
use rdmapool_pool::metrics::{Section, Series, SeriesKind};
use rdmapool_pool::remote::{PoolClient, RemotePtr};
use rdmapool_pool::{Error, Result};

mod cache;
mod counts;
mod gc;
mod get;
mod hints;
mod into;
mod many;
mod put;
mod put_many;
mod repair;
mod repairer;
mod replicas;
mod stripe;
mod view;
pub use cache::{CacheConfig, ServerUsage};
pub use counts::ServerStats;
use gc::Retired;
use parking_lot::Mutex;
pub use put::PutOptions;
use put::{digest_of, Source, Writing};
pub use repair::RepairReport;
#[cfg(feature = "etcd")]
pub use repairer::VIEW_KEY;
pub use repairer::{Repairer, RepairerStats};
use replicas::{incarnation, Purpose};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a [`Store`] runs.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Replicas of every object, on distinct servers (default 2).
    pub replicas: usize,
    /// How long a replaced or removed block stays untouched before its space is reused
    /// (default 1 s): a get that started before the replacement and reads it within this
    /// time reads it whole. A slower get detects the reuse by checksum and reads again.
    pub grace: Duration,
    /// The most bytes one block may have (default 256 KiB): a value whose block would be
    /// larger is **striped**, cut into parts of this size less 100 bytes, each a block of
    /// its own placed on its own servers, so a get reads them from several servers at once
    /// (docs/STORE.md section 9). Lowered to the largest block a live server's chunks hold.
    /// The default keeps each part within the 256 KiB allocation class of 1 MiB chunks.
    pub part_size: u64,
    /// How long a removed key's tombstone stays after a repair first found it on each of
    /// the key's replicas and nowhere else (default 60 s): a later repair of this client
    /// that finds it so again clears it, freeing its index slots (docs/STORE.md section 8).
    pub tombstone_hold: Duration,
    /// How far apart the clients' wall clocks may be (default 50 ms): a value put with a
    /// time to live ([`Store::put_with_ttl`]) is taken as expired this long before its end
    /// by the reader's clock, so no client whose clock is within this of the writer's
    /// returns it after its end (docs/STORE.md section 11). A time to live must be longer.
    pub clock_skew: Duration,
    /// Cache mode (default none: a durable store, whose puts fail when a server is full):
    /// a memory budget per server, kept by evicting values as Redis's `allkeys-lru` or
    /// `allkeys-lfu` does, sampled by the clients (docs/STORE.md section 12).
    pub cache: Option<CacheConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            replicas: 2,
            grace: Duration::from_secs(1),
            part_size: 256 << 10,
            tombstone_hold: Duration::from_secs(60),
            clock_skew: Duration::from_millis(50),
            cache: None,
        }
    }
}

/// What a store client did (counters since it started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Puts acknowledged.
    pub puts: u64,
    /// Gets that found a value.
    pub hits: u64,
    /// Gets that found none.
    pub misses: u64,
    /// Removes that removed a value.
    pub removes: u64,
    /// Blocks waiting for their grace period before they are freed.
    pub retired: u64,
    /// Replaced blocks this client freed after their grace period (the frees start beside
    /// a put and finish beside later ones, or in [`Store::flush_retired`]).
    pub freed: u64,
    /// Puts that found no room and waited for the blocks this client replaced to come free
    /// (backpressure: [`Store::put`]).
    pub waits_for_room: u64,
    /// Puts, removes and gets that found a newer view in force on a replica's fence word
    /// and were made again under it (a put so made under the old view was not
    /// acknowledged; docs/STORE.md section 4).
    pub fenced: u64,
    /// Round trips the puts and removes took: each list of one-sided operations sent to
    /// the replicas at once and waited for (the fence reads a put makes beside its swaps
    /// cost none of their own). Whatever `r`, a put takes 1 from a current hint, 2 for a
    /// fresh key or with an older hint, 3 without a hint (docs/STORE.md section 6). The
    /// puts of a [`Store::put_many`] count together: the rounds of the longest.
    pub put_round_trips: u64,
    /// Round trips the gets took (the fence reads beside the first cost none of their
    /// own): 1 with a current hint, 2 without (docs/STORE.md section 5).
    pub get_round_trips: u64,
    /// Gets (and exists) whose key's newest value had expired: counted as misses too
    /// (docs/STORE.md section 11).
    pub expired: u64,
    /// Expired values this client replaced with a tombstone on finding them, so that their
    /// space is freed after the grace period (docs/STORE.md section 11).
    pub reclaimed: u64,
    /// Keys this client evicted to keep a cache's servers within their budget
    /// (docs/STORE.md section 12).
    pub evictions: u64,
    /// Blocks whose access time (and count) this client's gets updated, in batches
    /// (cache mode).
    pub access_updates: u64,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    removes: AtomicU64,
    waits_for_room: AtomicU64,
    freed: AtomicU64,
    fenced: AtomicU64,
    put_round_trips: AtomicU64,
    get_round_trips: AtomicU64,
    expired: AtomicU64,
    reclaimed: AtomicU64,
    evictions: AtomicU64,
    access_updates: AtomicU64,
}

impl Counters {
    /// The section of client `client`'s store in its context's metrics (`store_clients` in
    /// JSON, `rdmapool_store_*` in Prometheus, labelled by `client`; docs/METRICS.md).
    fn section(&self, client: u64) -> Section {
        let series = |key, metric, help, value: &AtomicU64| Series {
            key,
            metric,
            kind: SeriesKind::Counter,
            help,
            value: value.load(Ordering::Relaxed),
        };
        Section {
            family: "store_clients",
            label: ("client", client),
            series: vec![
                series("puts", "store_puts_total", "Store puts acknowledged.", &self.puts),
                series("hits", "store_hits_total", "Store gets that found a value.", &self.hits),
                series("misses", "store_misses_total", "Store gets that found none.", &self.misses),
                series("removes", "store_removes_total", "Store removes that removed a value.", &self.removes),
                series(
                    "waits_for_room",
                    "store_waits_for_room_total",
                    "Store puts that found no room and waited for replaced blocks to come free.",
                    &self.waits_for_room,
                ),
                series(
                    "freed",
                    "store_freed_total",
                    "Replaced blocks a store client freed after their grace period.",
                    &self.freed,
                ),
                series(
                    "expired",
                    "store_expired_total",
                    "Store gets whose key's newest value had expired (counted as misses too).",
                    &self.expired,
                ),
                series(
                    "reclaimed",
                    "store_reclaimed_total",
                    "Expired store values replaced with a tombstone when found, their space freed after the grace period.",
                    &self.reclaimed,
                ),
                series(
                    "evictions",
                    "store_evictions_total",
                    "Keys a store client evicted to keep a cache's servers within their budget.",
                    &self.evictions,
                ),
                series(
                    "access_updates",
                    "store_access_updates_total",
                    "Blocks whose access time a cache's gets updated, in batches.",
                    &self.access_updates,
                ),
                series(
                    "fenced",
                    "store_fenced_total",
                    "Store operations that met a newer view on a fence word and were made again under it.",
                    &self.fenced,
                ),
                series(
                    "put_round_trips",
                    "store_put_round_trips_total",
                    "Round trips store puts and removes took (lists of one-sided operations waited for).",
                    &self.put_round_trips,
                ),
                series(
                    "get_round_trips",
                    "store_get_round_trips_total",
                    "Round trips store gets took (lists of one-sided operations waited for).",
                    &self.get_round_trips,
                ),
            ],
        }
    }
}

/// Where one replica of a key holds its newest block ([`Store::locate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    /// The block, as a pool pointer (its `len` is the block's: header, key and value).
    pub block: RemotePtr,
    /// The version the block holds.
    pub version: Version,
    /// It is a removal's tombstone.
    pub tombstone: bool,
}

/// A keyed object store on a pool (docs/STORE.md): get, put and remove are one-sided
/// operations on the servers' memory, and every object has [`StoreConfig::replicas`]
/// copies on distinct servers.
///
/// ```
/// use rdmapool_pool::fabric::*;
/// use rdmapool_pool::remote::*;
/// use rdmapool_store::{Store, StoreConfig};
/// # fn main() -> rdmapool_pool::Result<()> {
/// let ctx = Context::open(SoftConfig::default())?;
/// let cfg = || ServerConfig { size: 8 << 20, chunk_size: 1 << 20, ..ServerConfig::default() };
/// let a = MemoryServer::start(&ctx, ServerConfig { node: 1, ..cfg() })?;
/// let b = MemoryServer::start(&ctx, ServerConfig { node: 2, ..cfg() })?;
/// let members = StaticMembership::new(vec![a.addr(), b.addr()]);
/// let pd = ctx.alloc_pd()?;
/// let pool = PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(42))?;
/// let store = Store::new(pool, StoreConfig::default())?;
/// store.block_on(store.put(b"greeting", b"hello, store"))?;
/// let got = store.block_on(store.get(b"greeting"))?;
/// assert_eq!(got.as_deref(), Some(&b"hello, store"[..]));
/// assert!(store.block_on(store.remove(b"greeting"))?);
/// assert_eq!(store.block_on(store.get(b"greeting"))?, None);
/// assert_eq!(a.stats().requests_handled + b.stats().requests_handled, 0); // one-sided
/// # Ok(()) }
/// ```
pub struct Store {
    pool: Arc<PoolClient>,
    cfg: StoreConfig,
    /// Each node's index, by node id, with the incarnation it was found in.
    indexes: Mutex<HashMap<u32, (u64, Index)>>,
    /// The view this client places keys by, once read (docs/STORE.md section 4).
    view: Mutex<Option<super::view::View>>,
    /// Held while an index is found or made (a tenant's own on an isolated node): one at a
    /// time, so no two indexes of one tenant are made at once (`rdmapool-store/src/root.rs`),
    /// and the keys of a batch do not each claim a chunk of a fresh server to make one.
    making_index: tokio::sync::Mutex<()>,
    /// Replaced blocks, oldest first, with when they may be freed.
    retired: Mutex<VecDeque<Retired>>,
    /// The frees of retired blocks under way (`gc.rs`).
    freeing: Mutex<gc::Freeing>,
    /// Part keys of replaced striped values, oldest first, with when they may be cleared.
    retired_parts: Mutex<VecDeque<(Instant, Vec<u8>)>>,
    /// Blocks the last repair found unnamed in gone writers' chunks (section 8).
    reclaim: Mutex<gc::Pending>,
    /// Removed keys the last repair found clean, not yet cleared (section 8).
    tombstones: Mutex<repair::Tombstones>,
    /// Where this client last saw each key's blocks, read beside the buckets next time
    /// (`hints.rs`).
    hints: Mutex<HashMap<Vec<u8>, hints::Hint>>,
    /// Blocks allocated ahead for this client's next puts, by node, incarnation and size
    /// class (`hints.rs`).
    spares: Mutex<HashMap<(u32, u64, u64), Vec<u64>>>,
    /// One put of a key at a time from this client (`hints.rs`).
    put_locks: Box<[tokio::sync::Mutex<()>]>,
    /// In cache mode: each server's usage as this client knows it, and the access notes
    /// waiting (`cache.rs`).
    usage: Mutex<cache::Usage>,
    /// Per server, the counts this client has not yet added to its counter words
    /// (`counts.rs`).
    tally: Mutex<counts::Tally>,
    counters: Arc<Counters>,
}

impl Store {
    /// A store on `pool`'s servers. `pool` may be shared (an `Arc<PoolClient>`), e.g. with
    /// an etcd membership follower that adds and removes servers as they come and go: the
    /// store uses the servers live at each call.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for 0 replicas.
    pub fn new(pool: impl Into<Arc<PoolClient>>, cfg: StoreConfig) -> Result<Self> {
        if cfg.replicas == 0 {
            return Err(Error::Core(rdmapool_pool::CoreError::OutOfLimits {
                what: "store replicas",
                value: 0,
                min: 1,
                max: u64::MAX,
            }));
        }
        let pool: Arc<PoolClient> = pool.into();
        // The store's counters in its context's metrics (`store_clients`), while it lives.
        let counters = Arc::new(Counters::default());
        let (weak, client) = (Arc::downgrade(&counters), pool.client_id());
        pool.pd()
            .recorder()
            .sources
            .register(Box::new(move || weak.upgrade().map(|c| c.section(client))));
        let store = Self {
            pool,
            cfg,
            indexes: Mutex::new(HashMap::new()),
            view: Mutex::new(None),
            making_index: tokio::sync::Mutex::new(()),
            retired: Mutex::new(VecDeque::new()),
            freeing: Mutex::new(gc::Freeing::new()),
            retired_parts: Mutex::new(VecDeque::new()),
            reclaim: Mutex::new(gc::Pending::default()),
            tombstones: Mutex::new(HashMap::new()),
            hints: Mutex::new(HashMap::new()),
            spares: Mutex::new(HashMap::new()),
            put_locks: (0..hints::PUT_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            usage: Mutex::new(cache::Usage::default()),
            tally: Mutex::new(counts::Tally::default()),
            counters,
        };
        store.check_cache()?;
        Ok(store)
    }

    /// The pool client underneath.
    pub fn pool(&self) -> &PoolClient {
        &self.pool
    }

    /// Runs `fut` to completion, driving the pool's completions (as
    /// [`PoolClient::block_on`]).
    pub fn block_on<F: std::future::Future>(&self, fut: F) -> F::Output {
        self.pool.block_on(fut)
    }

    /// The counters.
    pub fn stats(&self) -> StoreStats {
        let c = &self.counters;
        StoreStats {
            puts: c.puts.load(Ordering::Relaxed),
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            removes: c.removes.load(Ordering::Relaxed),
            retired: self.retired.lock().len() as u64,
            waits_for_room: c.waits_for_room.load(Ordering::Relaxed),
            freed: c.freed.load(Ordering::Relaxed),
            fenced: c.fenced.load(Ordering::Relaxed),
            put_round_trips: c.put_round_trips.load(Ordering::Relaxed),
            get_round_trips: c.get_round_trips.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            reclaimed: c.reclaimed.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            access_updates: c.access_updates.load(Ordering::Relaxed),
        }
    }

    /// Whether a value expiring at `expiry` is to be taken as expired now: past its end by
    /// this client's wall clock plus [`StoreConfig::clock_skew`].
    pub(super) fn is_expired(&self, expiry: crate::format::Expiry) -> bool {
        if expiry == crate::format::Expiry::NEVER {
            return false;
        }
        let skew = u64::try_from(self.cfg.clock_skew.as_millis()).unwrap_or(u64::MAX);
        expiry.is_past(wall_clock_ms().saturating_add(skew))
    }

    /// [`Store::is_expired`] for a get's answer of `key`, counted ([`StoreStats::expired`],
    /// and on the key's first replica's counters) when it is.
    pub(super) fn expired_for_get(&self, key: &[u8], expiry: crate::format::Expiry) -> bool {
        let past = self.is_expired(expiry);
        if past {
            self.counters.expired.fetch_add(1, Ordering::Relaxed);
            self.count_for_key(key, counts::Counted::Expiration);
        }
        past
    }

    /// The expiry of a value put now with time to live `ttl`.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for a `ttl` not
    /// longer than [`StoreConfig::clock_skew`] (0 among them: it would never be read), or
    /// one whose end is past what the header's 64-bit milliseconds hold.
    pub(super) fn expiry_after(&self, ttl: Duration) -> Result<crate::format::Expiry> {
        let now = wall_clock_ms();
        let skew = u64::try_from(self.cfg.clock_skew.as_millis()).unwrap_or(u64::MAX);
        let max = u64::MAX - now;
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms <= skew || ms > max {
            return Err(Error::Core(rdmapool_pool::CoreError::OutOfLimits {
                what: "store time to live, in milliseconds (longer than the clock skew)",
                value: ms,
                min: skew.saturating_add(1),
                max,
            }));
        }
        Ok(crate::format::Expiry(now + ms))
    }
}

/// Milliseconds since the Unix epoch by this host's wall clock (0 if it reads before it).
fn wall_clock_ms() -> u64 {
    wall_clock_us() / 1000
}

/// Microseconds since the Unix epoch by this host's wall clock (0 if it reads before it):
/// a cache's access times.
fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// [`check_sizes`], and the part keys' prefix refused ([`Error::ReservedKey`]).
fn check_user_key(key: &[u8], value_len: u64) -> Result<()> {
    check_sizes(key, value_len)?;
    if super::stripe::is_part_key(key) {
        return Err(Error::ReservedKey);
    }
    Ok(())
}
