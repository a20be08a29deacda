//! `bench ycsb --hit-rate`: hit rates at cache sizes of a percent of the working set
//! (`--cache-sizes`, default 1% and 10%; the working set is `--records` x `--record-size`),
//! on the same request streams, for the store in cache mode, a `redis-server` with
//! `maxmemory` and `allkeys-lru`, a `memcached` with `-m`, and an exact LRU simulated here.
//!
//! - **Streams** (`HitPlan::stream`), each a sequence of gets of record numbers, the same for
//!   every system and both cache sizes:
//!   - `hit-zipf`: the workloads' scrambled Zipfian (constant 0.99) over the records, from a
//!     seed of its own (`--seed`);
//!   - `hit-scan`: the same Zipfian gets, and after every [`SCAN_EVERY`] x K of them a scan:
//!     gets of K consecutive records (record numbers `s .. s + K`, wrapping; `s` uniform),
//!     K = `--records` / 100 (at least 1). Scans are 1 get in 11.
//! - **A get** reads the record's key; on a miss it sets the record (a look-aside cache's miss
//!   fill), its value stamped with the record's number. A hit that returns another record's
//!   value or size stops the bench.
//! - **Warm-up and measure**: the first `--records` gets of the stream fill the cache and are
//!   not counted; the next `--hit-gets` (default 100000) are. Hit rate = hits / gets
//!   measured, of the scans' gets too. One client.
//! - **The store**: three fresh in-process memory servers per run ([`HIT_CHUNK`] chunks), one
//!   `Store` in cache mode (`CacheConfig::new(budget)`: approximate LRU, 5 samples per key
//!   evicted and an eviction pool of 16),
//!   `--replicas` copies. The budget per server makes the three servers hold as many records
//!   as the cache size does: `budget = ceil(C x N x r / 3)`, C the records the cache size
//!   holds (below), r the replicas, N what the cache counts for one copy of a record
//!   (docs/STORE.md section 12: its index slot's length bound, the block's length of 64-byte
//!   header, key and value rounded up by less than 2/15; 1152 bytes for a 1 KiB record). The
//!   memory the store takes is more: each copy's block is a power-of-two size class (2 KiB
//!   for a 1 KiB record), about `2 x r` times the cache size with 1 KiB records.
//! - **Redis**: a fresh `redis-server` per run (`--maxmemory-policy allkeys-lru`, Redis's
//!   default 5 samples), `maxmemory` set (`CONFIG SET`, before the stream) to the cache size
//!   in bytes plus the `used_memory` of the empty server with the bench's connection warmed
//!   (about 1 MB, which Redis counts against `maxmemory` too). Its per-key overhead (about
//!   370 bytes for a 1 KiB value in Redis 7) is not given back: it holds fewer records than
//!   C. A fill it refuses for memory (`OOM`) counts as not stored.
//! - **memcached**: a fresh `memcached` per run with `-m` the cache size in MiB, rounded up,
//!   at least 1 (with `-m 1`, `-I 512k`: memcached wants its item size limit at most half
//!   its memory). It allocates 1 MiB slab pages and items of about 1184 bytes for a 1 KiB
//!   record (slab class of item header, key and value): a page holds 885 of them, so its
//!   records held differ from C by up to a page either way.
//! - **Exact LRU**: the stream run here through an LRU of C records (`lru.rs`), C = the cache
//!   size over the record size, `floor(records x percent / 100)`, at least 1 (keys and
//!   per-item overheads not counted).
//!
//! Rows: one per (stream, cache size, transport, reference), `op` `hit-zipf 1% x1`, metric
//! `hit_rate`, `value` our hit rate, `reference` `redis-server x1`, `memcached x1` or
//! `exact-lru`, `reference_value` its hit rate, ratio ours / theirs (0 if theirs is 0);
//! `iters`, `median_ns`, `p99_ns` and `mops` are our gets measured and their times (a miss's
//! set included). The references are measured once, with the first transport.

use super::kv::{hit_request, Kv, RedisKv, Scratch, StoreKv};
use super::lru;
use super::memcached_ref::MemcachedServer;
use super::workload::{key, ZipfKeys};
use crate::bench::pool::{clients_until, Rate, Until};
use crate::bench::report::{fmt_ns, Row};
use crate::bench::store::{self, redis_ref::redis_err, redis_ref::RedisServer};
use crate::device_args::DeviceArgs;
use crate::units::show;
use crate::{Result, ToolError};
use rdmapool::fabric::{ProviderKind, Transport};
use rdmapool::store::format::{block_len, length_bound, length_code};
use rdmapool::store::CacheConfig;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};

/// A scan after every `SCAN_EVERY` x K Zipfian gets, K the scan's length.
pub(super) const SCAN_EVERY: usize = 10;
/// The scan's length K: the records over this, at least 1.
const SCAN_SHARE: usize = 100;
/// The largest record with `--hit-rate`: its block stays whole (values whose block passes
/// the store's part size are striped, which the budget here does not count).
pub(super) const MAX_HIT_RECORD: usize = 64 << 10;
/// The most gets measured per run.
pub(super) const MAX_HIT_GETS: u64 = 10_000_000;
/// The hit-rate servers' chunk size: the library's default (`ServerConfig::default`). The
/// store's index on a server is one chunk, 32768 buckets of 8 slots at 2 MiB; the eviction
/// samples runs of its buckets.
const HIT_CHUNK: u64 = 2 << 20;
/// How far below exact LRU our hit rate may be and meet the goal (2 points).
const GOAL_POINTS: f64 = 0.02;
/// Mixed into `--seed`: the hit-rate streams differ from the workloads'.
const ZIPF_SALT: u64 = 0x6869_745f_7a69_7066;
/// Mixed into `--seed` for the scans' starts.
const SCAN_SALT: u64 = 0x6869_745f_7363_616e;

/// `--cache-sizes`: a percent of the working set, more than 0 and at most 100 (`1`, `10`,
/// `0.5`, `10%`).
pub(super) fn cache_size_arg(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t);
    let bad = || {
        format!(
            "{s:?}: a cache size is a percent of the working set (--records x --record-size), \
             more than 0 and at most 100"
        )
    };
    match t.trim().parse::<f64>() {
        Ok(p) if p.is_finite() && p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(bad()),
    }
}

/// A hit-rate stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mix {
    /// Zipfian gets.
    Zipf,
    /// Zipfian gets with scans.
    Scan,
}

impl Mix {
    /// Both, in the order they run.
    pub(super) const ALL: [Mix; 2] = [Mix::Zipf, Mix::Scan];

    /// The name its rows carry.
    pub(super) fn name(self) -> &'static str {
        match self {
            Mix::Zipf => "hit-zipf",
            Mix::Scan => "hit-scan",
        }
    }
}

/// What the hit-rate runs share.
#[derive(Debug, Clone)]
pub(super) struct HitPlan {
    /// The records (the working set's count).
    pub(super) records: usize,
    /// Bytes per record.
    pub(super) size: usize,
    /// `--seed`.
    pub(super) seed: u64,
    /// The store's copies of each record.
    pub(super) replicas: usize,
    /// Cache sizes, percent of the working set, in the order given.
    pub(super) sizes: Vec<f64>,
    /// Gets that fill the caches before the measurement.
    pub(super) warm: usize,
    /// Gets measured.
    pub(super) gets: usize,
}

impl HitPlan {
    /// The plan of `records` of `size` bytes at cache sizes `sizes` (duplicates dropped).
    /// A record too large is a usage error.
    pub(super) fn new(
        records: usize,
        size: usize,
        seed: u64,
        replicas: usize,
        sizes: &[f64],
        gets: u64,
    ) -> Result<Self> {
        if size > MAX_HIT_RECORD {
            return Err(ToolError::Usage(format!(
                "--record-size {}: with --hit-rate a record is at most {} (a larger value's \
                 block would be striped, which the cache budget here does not count)",
                show(size),
                show(MAX_HIT_RECORD)
            )));
        }
        let mut unique: Vec<f64> = Vec::new();
        for &p in sizes {
            if !unique.contains(&p) {
                unique.push(p);
            }
        }
        Ok(Self {
            records: records.max(1),
            size: size.max(1),
            seed,
            replicas,
            sizes: unique,
            warm: records.max(1),
            gets: usize::try_from(gets).unwrap_or(usize::MAX),
        })
    }

    /// The op of a run's rows: `hit-zipf 1% x1`.
    pub(super) fn op(mix: Mix, percent: f64) -> String {
        format!("{} {percent}% x1", mix.name())
    }

    /// The records a cache of `percent` holds: `floor(records x percent / 100)`, at least 1.
    pub(super) fn capacity(&self, percent: f64) -> usize {
        ((self.records as f64 * percent / 100.0).floor() as usize).clamp(1, self.records)
    }

    /// The cache size in bytes: `percent` of the working set.
    pub(super) fn cache_bytes(&self, percent: f64) -> u64 {
        ((self.records * self.size) as f64 * percent / 100.0).ceil() as u64
    }

    /// The scan's length K.
    pub(super) fn scan_len(&self) -> usize {
        (self.records / SCAN_SHARE).max(1)
    }

    /// The stream of `mix`: the warm-up's gets, then the measured ones.
    pub(super) fn stream(&self, mix: Mix) -> Vec<u32> {
        let n = self.warm.saturating_add(self.gets);
        let records = self.records as u64;
        let mut zipf = ZipfKeys::new(self.seed ^ ZIPF_SALT, records);
        let mut starts = ZipfKeys::new(self.seed ^ SCAN_SALT, records);
        let k = self.scan_len() as u64;
        let every = SCAN_EVERY * self.scan_len();
        let mut out = Vec::with_capacity(n);
        let mut since = 0usize;
        while out.len() < n {
            if mix == Mix::Scan && since == every {
                let s = starts.uniform();
                out.extend((0..k).map(|j| ((s + j) % records) as u32));
                since = 0;
            } else {
                out.push(zipf.next_record() as u32);
                since += 1;
            }
        }
        out.truncate(n);
        out
    }

    /// The mean block of a record in the store: header, key and value, rounded up to its
    /// power-of-two size class (the memory it takes).
    pub(super) fn mean_block(&self) -> f64 {
        self.mean_of(|len| len.next_power_of_two().max(64))
    }

    /// The mean bytes a cache counts for one copy of a record (docs/STORE.md section 12):
    /// its index slot's length bound, the block's length (header, key and value) rounded
    /// up by less than 2/15.
    pub(super) fn mean_counted(&self) -> f64 {
        self.mean_of(|len| length_bound(length_code(len)))
    }

    /// The mean over the records of `f` of each one's block length.
    fn mean_of(&self, f: impl Fn(u64) -> u64) -> f64 {
        let total: u64 = (0..self.records as u64)
            .map(|k| f(block_len(key(k).as_bytes(), self.size as u64)))
            .sum();
        total as f64 / self.records as f64
    }

    /// Our budget per server at `percent`: what the cache counts for the cache size's
    /// records, each `replicas` times, over the servers.
    pub(super) fn budget(&self, percent: f64) -> u64 {
        let bytes = self.capacity(percent) as f64 * self.mean_counted() * self.replicas as f64;
        (bytes / f64::from(store::SERVERS)).ceil().max(1.0) as u64
    }

    /// Each memory server's size at `percent`: twice the budget's blocks, its share of the
    /// blocks a grace period retires, and chunks of [`HIT_CHUNK`] for the index and the
    /// client's size classes.
    fn server_size(&self, percent: f64) -> usize {
        let block = self.mean_block();
        let held = 2.0 * self.budget(percent) as f64 * block / self.mean_counted();
        let retired = store::retired_blocks(self.size) as f64 * block * self.replicas as f64
            / f64::from(store::SERVERS);
        let need = held.ceil() as u64 + retired.ceil() as u64 + 6 * HIT_CHUNK;
        need.next_multiple_of(HIT_CHUNK) as usize
    }

    /// memcached's `-m` at `percent` (MiB, rounded up, at least 1) and any other
    /// argument it needs.
    fn memcached_mb(&self, percent: f64) -> (usize, Vec<&'static str>) {
        let mb = (self.cache_bytes(percent).div_ceil(1 << 20) as usize).max(1);
        if mb == 1 {
            (1, vec!["-I", "512k"])
        } else {
            (mb, Vec::new())
        }
    }

    /// An error if the servers of the largest cache size (and a memcached) do not fit in
    /// this machine's memory.
    pub(super) fn check_memory(&self) -> Result<()> {
        let most = self.sizes.iter().copied().fold(0.0, f64::max);
        let total =
            self.server_size(most) * store::SERVERS as usize + (self.memcached_mb(most).0 << 20);
        crate::units::fits_in_memory("--hit-rate: servers and memcached of", total)
    }
}

/// One system's hit-rate run.
#[derive(Clone)]
pub(super) struct Measured {
    /// Gets measured that hit.
    pub(super) hits: u64,
    /// Gets measured.
    pub(super) gets: u64,
    /// The gets' times (the system's own runs; none for the simulation).
    pub(super) rate: Option<Rate>,
    /// What it held at the end, as its own counters say it.
    pub(super) held: String,
}

impl Measured {
    /// hits / gets.
    pub(super) fn hit_rate(&self) -> f64 {
        if self.gets == 0 {
            0.0
        } else {
            self.hits as f64 / self.gets as f64
        }
    }
}

/// Runs `stream` on one client connected by `connect`: the warm-up's gets, then the
/// measured ones. Returns (hits, gets) measured and their times.
fn replay<K, F>(plan: &HitPlan, stream: &[u32], connect: F) -> Result<(u64, u64, Rate)>
where
    K: Kv,
    F: Fn() -> Result<K> + Sync,
{
    let (hits, gets) = (AtomicU64::new(0), AtomicU64::new(0));
    let warm = plan.warm.min(stream.len());
    let until = Until {
        time: None,
        ops: Some((stream.len() - warm) as u64),
    };
    let warm_calls = u32::try_from(warm).unwrap_or(u32::MAX);
    let rate = clients_until(1, until, warm_calls, |_| {
        let mut kv = connect()?;
        let mut scratch = Scratch::new(plan.size);
        let mut next = 0usize;
        let (hits, gets) = (&hits, &gets);
        Ok(move || -> Result<bool> {
            let Some(&r) = stream.get(next) else {
                return Ok(false);
            };
            let hit = hit_request(&mut kv, u64::from(r), &mut scratch)?;
            if next >= warm {
                gets.fetch_add(1, Ordering::Relaxed);
                hits.fetch_add(u64::from(hit), Ordering::Relaxed);
            }
            next += 1;
            Ok(true)
        })
    })?;
    Ok((hits.into_inner(), gets.into_inner(), rate))
}

/// The store in cache mode, on three fresh memory servers on `transport`, client id `id`.
pub(super) fn ours(
    device: &DeviceArgs,
    transport: Transport,
    ip: IpAddr,
    plan: &HitPlan,
    stream: &[u32],
    percent: f64,
    id: u64,
) -> Result<Measured> {
    let ctx = device.open(transport)?;
    let servers = store::start_servers_chunked(&ctx, ip, plan.server_size(percent), HIT_CHUNK)?;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let budget = plan.budget(percent);
    let client = store::connect_store(
        device,
        transport,
        &addrs,
        id,
        plan.replicas,
        plan.size,
        Some(CacheConfig::new(budget)),
    )?;
    let st = &client.store;
    let (hits, gets, rate) = replay(plan, stream, || {
        Ok(StoreKv {
            store: st,
            replicas: plan.replicas,
        })
    })?;
    let usage = st.block_on(st.server_usage())?;
    let stats = st.stats();
    let used: u64 = usage.iter().map(|u| u.used).sum();
    let (held, copies) = held_records(st, plan.records)?;
    store::check_one_sided(&servers)?;
    Ok(Measured {
        hits,
        gets,
        rate: Some(rate),
        held: format!(
            "ours {held} records in {copies} copies (usage words {used} bytes of budgets 3 \
             x {budget}), {} evictions, {} puts waited for room",
            stats.evictions, stats.waits_for_room
        ),
    })
}

/// The records `store` holds (`exists` of every one, 256 at a time) and their copies
/// (`locate` of each held: the replicas that hold a value).
fn held_records(store: &rdmapool::store::Store, records: usize) -> Result<(u64, u64)> {
    let names: Vec<String> = (0..records as u64).map(key).collect();
    let (mut held, mut copies) = (0, 0);
    for batch in names.chunks(256) {
        let keys: Vec<&[u8]> = batch.iter().map(|k| k.as_bytes()).collect();
        let found = store.block_on(store.exists_many(&keys));
        for (k, found) in keys.iter().zip(found) {
            if found? {
                held += 1;
                let at = store.block_on(store.locate(k))?;
                copies += at.iter().filter(|l| !l.tombstone).count() as u64;
            }
        }
    }
    Ok((held, copies))
}

/// A Redis connection of a hit-rate run: a SET refused for memory (`OOM`: Redis could not
/// evict enough to stay under `maxmemory`, which happens when the cache size is near the
/// noise of its own memory use) is a fill not stored, counted, as a look-aside cache's
/// client takes it.
struct CacheRedis<'a> {
    inner: RedisKv,
    refused: &'a AtomicU64,
}

impl Kv for CacheRedis<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn get(&mut self, key: &[u8], value: &mut Vec<u8>) -> Result<bool> {
        self.inner.get(key, value)
    }

    fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        match redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query::<()>(&mut self.inner.0)
        {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("OOM") => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(redis_err(e)),
        }
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.inner.delete(key)
    }
}

/// A fresh `redis-server` with `allkeys-lru` and `maxmemory` the cache size (over what
/// the empty server holds). None when it cannot start (said on stderr).
pub(super) fn redis(plan: &HitPlan, stream: &[u32], percent: f64) -> Result<Option<Measured>> {
    let server = match RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]) {
        Ok(s) => s,
        Err(e) => {
            crate::errln!("rdma-tool bench ycsb: {e}; no redis-server hit-rate rows");
            return Ok(None);
        }
    };
    let cache = plan.cache_bytes(percent);
    let (base, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    let (hits, gets, rate) = replay(plan, stream, || {
        let mut conn = server.connect()?;
        // The connection's buffers as a SET and a GET of a record leave them, and what the
        // first INFO allocates (about 24 KB in Redis 7.0), counted in the empty server's
        // memory.
        let warm = vec![0u8; plan.size];
        redis::pipe()
            .set("rdma-tool:warm", &warm[..])
            .ignore()
            .get("rdma-tool:warm")
            .ignore()
            .del("rdma-tool:warm")
            .ignore()
            .query::<()>(&mut conn)
            .map_err(redis_err)?;
        RedisServer::used_memory(&mut conn)?;
        let empty = RedisServer::used_memory(&mut conn)?;
        base.store(empty, Ordering::Relaxed);
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(empty + cache)
            .query::<()>(&mut conn)
            .map_err(redis_err)?;
        Ok(CacheRedis {
            inner: RedisKv(conn),
            refused: &refused,
        })
    })?;
    let mut conn = server.connect()?;
    let keys: u64 = redis::cmd("DBSIZE").query(&mut conn).map_err(redis_err)?;
    Ok(Some(Measured {
        hits,
        gets,
        rate: Some(rate),
        held: format!(
            "redis-server {keys} keys (maxmemory {} + {cache}), {} fills refused (OOM)",
            base.into_inner(),
            refused.into_inner()
        ),
    }))
}

/// A fresh `memcached` with `-m` the cache size in MiB. None when it cannot start (said on
/// stderr).
pub(super) fn memcached(plan: &HitPlan, stream: &[u32], percent: f64) -> Result<Option<Measured>> {
    let (mb, extra) = plan.memcached_mb(percent);
    let server = match MemcachedServer::start_with(mb, &extra) {
        Ok(s) => s,
        Err(e) => {
            crate::errln!("rdma-tool bench ycsb: {e}; no memcached hit-rate rows");
            return Ok(None);
        }
    };
    let (hits, gets, rate) = replay(plan, stream, || server.connect())?;
    let items = server.connect()?.stat("curr_items")?;
    Ok(Some(Measured {
        hits,
        gets,
        rate: Some(rate),
        held: format!(
            "memcached {} items (-m {mb})",
            items.map_or_else(|| "?".into(), |n| n.to_string())
        ),
    }))
}

/// The exact LRU of the cache size's records, simulated.
pub(super) fn exact_lru(plan: &HitPlan, stream: &[u32], percent: f64) -> Measured {
    let cap = plan.capacity(percent);
    let (hits, gets) = lru::hits(stream, plan.warm, plan.records, cap);
    Measured {
        hits,
        gets,
        rate: None,
        held: format!("exact-lru {cap} records"),
    }
}

/// A row of `bench ycsb --hit-rate`: the rows' shared fields, and our hit rate.
#[derive(Debug, Clone, Serialize)]
pub(super) struct HitRow {
    /// As every `bench ycsb` row; metric `hit_rate`, the reference's hit rate in
    /// `reference_value`.
    #[serde(flatten)]
    pub(super) row: Row,
    /// Our hit rate: hits / gets measured, 0 to 1.
    pub(super) value: f64,
}

/// Our run `ours` against `theirs` (named `reference`).
pub(super) fn row(
    provider: ProviderKind,
    transport: &str,
    op: &str,
    size: usize,
    ours: &Measured,
    (reference, theirs): (&str, &Measured),
) -> HitRow {
    let (value, them) = (ours.hit_rate(), theirs.hit_rate());
    let (median_ns, p99_ns, mops) = ours.rate.as_ref().map_or((0.0, 0.0, 0.0), |r| {
        (r.pair.median_ns, r.pair.p99_ns, r.mops())
    });
    HitRow {
        row: Row {
            provider: provider.name().into(),
            transport: transport.into(),
            op: op.into(),
            metric: "hit_rate".into(),
            size,
            iters: ours.gets,
            median_ns,
            p99_ns,
            gbps: 0.0,
            mops,
            reference: reference.into(),
            reference_value: them,
            ratio: if them > 0.0 { value / them } else { 0.0 },
        },
        value,
    }
}

/// Prints the rows as JSON, one object per line.
pub(super) fn print_json(rows: &[HitRow]) {
    for r in rows {
        crate::outln!(
            "{}",
            serde_json::to_string(r).expect("JSON of plain values")
        );
    }
}

/// Prints the rows as a table.
pub(super) fn print_table(rows: &[HitRow]) {
    crate::outln!(
        "{:<9} {:<18} {:<9} {:>6} {:>7} {:>11} {:>11} {:>9}  {:<18} {:>9} {:>7}",
        "transport",
        "op",
        "metric",
        "size",
        "gets",
        "median",
        "p99",
        "hit rate",
        "reference",
        "theirs",
        "ratio"
    );
    for h in rows {
        let r = &h.row;
        let ratio = if r.ratio > 0.0 {
            format!("{:.2}", r.ratio)
        } else {
            "-".into()
        };
        crate::outln!(
            "{:<9} {:<18} {:<9} {:>6} {:>7} {:>11} {:>11} {:>9.3}  {:<18} {:>9.3} {:>7}",
            r.transport,
            r.op,
            r.metric,
            show(r.size),
            r.iters,
            fmt_ns(r.median_ns),
            fmt_ns(r.p99_ns),
            h.value,
            r.reference,
            r.reference_value,
            ratio
        );
    }
}

/// Whether one run (transport, op) met the goal: at least Redis's hit rate (when Redis
/// ran) and at most 2 points below exact LRU's. None without an exact-LRU row.
fn judge(rows: &[&HitRow]) -> Option<(bool, String)> {
    let first = rows.first()?;
    let ours = first.value;
    let of = |name: &str| {
        rows.iter()
            .find(|r| r.row.reference.starts_with(name))
            .map(|r| r.row.reference_value)
    };
    let exact = of("exact-lru")?;
    let redis = of("redis-server");
    let met = ours + 1e-12 >= exact - GOAL_POINTS && redis.is_none_or(|r| ours >= r);
    let redis_text = redis.map_or_else(|| "no Redis row".into(), |r| format!("Redis {r:.3}"));
    Some((
        met,
        format!(
            "{} {} {ours:.3} ({redis_text}, exact LRU {exact:.3})",
            first.row.transport, first.row.op
        ),
    ))
}

/// The goal, under the table: which runs met it.
pub(super) fn summary(rows: &[HitRow]) {
    let mut runs: Vec<Vec<&HitRow>> = Vec::new();
    for r in rows {
        match runs
            .iter_mut()
            .find(|g| g[0].row.transport == r.row.transport && g[0].row.op == r.row.op)
        {
            Some(g) => g.push(r),
            None => runs.push(vec![r]),
        }
    }
    let judged: Vec<(bool, String)> = runs.iter().filter_map(|g| judge(g)).collect();
    let (met, missed): (Vec<_>, Vec<_>) = judged.iter().partition(|(m, _)| *m);
    crate::outln!(
        "\ngoal (hit rate >= Redis allkeys-lru and within 2 points of exact LRU): {} of {} \
         runs met",
        met.len(),
        judged.len()
    );
    for (what, list) in [("met", &met), ("missed", &missed)] {
        if !list.is_empty() {
            let text: Vec<&str> = list.iter().map(|(_, t)| t.as_str()).collect();
            crate::outln!("{what}: {}", text.join(", "));
        }
    }
}

/// The runs' notes of what each system held at its end, under the table.
pub(super) fn print_notes(notes: &[String]) {
    if notes.is_empty() {
        return;
    }
    crate::outln!("\nheld at the end of each hit-rate run:");
    for n in notes {
        crate::outln!("  {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(records: usize, gets: u64) -> HitPlan {
        HitPlan::new(records, 1024, 44, 2, &[1.0, 10.0, 1.0], gets).unwrap()
    }

    #[test]
    fn cache_sizes_are_percents_above_0_up_to_100() {
        assert_eq!(cache_size_arg("1"), Ok(1.0));
        assert_eq!(cache_size_arg(" 10% "), Ok(10.0));
        assert_eq!(cache_size_arg("0.5"), Ok(0.5));
        assert_eq!(cache_size_arg("100"), Ok(100.0));
        for bad in ["0", "0%", "-1", "100.5", "1000", "NaN", "inf", "x", "", "%"] {
            let e = cache_size_arg(bad).unwrap_err();
            assert!(e.contains("more than 0 and at most 100"), "{bad}: {e}");
        }
        assert_eq!(HitPlan::op(Mix::Scan, 0.5), "hit-scan 0.5% x1");
        assert_eq!(HitPlan::op(Mix::Zipf, 10.0), "hit-zipf 10% x1");
    }

    #[test]
    fn the_budget_holds_the_cache_sizes_records_as_the_store_counts_them() {
        let p = plan(20_000, 1000);
        assert_eq!(p.sizes, [1.0, 10.0]);
        assert_eq!(p.capacity(1.0), 200);
        assert_eq!(p.capacity(10.0), 2000);
        assert_eq!(p.cache_bytes(10.0), 2_048_000);
        // 1 KiB records take 2 KiB blocks, and count as their length (64-byte header,
        // key, value: 1102 to 1112 bytes) rounded up to a bound, 1152; 2 replicas over 3
        // servers.
        assert_eq!(p.mean_block(), 2048.0);
        assert_eq!(p.mean_counted(), 1152.0);
        assert_eq!(p.budget(10.0), (2000u64 * 1152 * 2).div_ceil(3));
        assert_eq!(p.memcached_mb(10.0), (2, vec![]));
        assert_eq!(p.memcached_mb(1.0), (1, vec!["-I", "512k"]));
        assert!(p.server_size(10.0) as u64 > p.budget(10.0));
        assert_eq!(plan(50, 10).capacity(1.0), 1, "at least one record");
        let e = HitPlan::new(10, 65 << 10, 1, 2, &[1.0], 10).unwrap_err();
        assert!(matches!(e, ToolError::Usage(_)), "{e}");
    }

    #[test]
    fn the_scan_stream_is_the_zipf_stream_with_scans_between() {
        let p = plan(2000, 30_000);
        let zipf = p.stream(Mix::Zipf);
        let scan = p.stream(Mix::Scan);
        assert_eq!(zipf.len(), 32_000);
        assert_eq!(scan.len(), 32_000);
        assert_eq!(zipf, p.stream(Mix::Zipf), "seeded");
        assert!(zipf.iter().chain(&scan).all(|&r| r < 2000));
        let (k, every) = (p.scan_len(), SCAN_EVERY * p.scan_len());
        assert_eq!(k, 20);
        // Every (every + k) gets: `every` Zipfian ones (the Zipf stream's, in order), then
        // k consecutive records.
        let mut z = zipf.iter();
        for chunk in scan.chunks(every + k) {
            let (head, tail) = chunk.split_at(every.min(chunk.len()));
            for r in head {
                assert_eq!(Some(r), z.next());
            }
            for w in tail.windows(2) {
                assert_eq!(w[1], (w[0] + 1) % 2000);
            }
        }
        // Skewed: the hottest record far above the mean.
        let mut counts = vec![0usize; 2000];
        for &r in &zipf {
            counts[r as usize] += 1;
        }
        assert!(counts.iter().max().copied().unwrap_or(0) > 50 * 32_000 / 2000);
    }

    #[test]
    fn exact_lru_hits_more_with_more_room_and_scans_cost_it() {
        let p = plan(2000, 40_000);
        let rate = |mix, pct| exact_lru(&p, &p.stream(mix), pct).hit_rate();
        let (z1, z10, s1, s10) = (
            rate(Mix::Zipf, 1.0),
            rate(Mix::Zipf, 10.0),
            rate(Mix::Scan, 1.0),
            rate(Mix::Scan, 10.0),
        );
        assert!(0.0 < z1 && z1 < z10 && z10 < 1.0, "{z1} {z10}");
        assert!(s1 < z1 && s10 < z10, "{s1} {z1} {s10} {z10}");
    }

    fn hit(transport: &str, op: &str, reference: &str, ours: f64, theirs: f64) -> HitRow {
        let m = |h: f64| Measured {
            hits: (h * 1000.0).round() as u64,
            gets: 1000,
            rate: None,
            held: String::new(),
        };
        row(
            ProviderKind::Soft,
            transport,
            op,
            1024,
            &m(ours),
            (reference, &m(theirs)),
        )
    }

    #[test]
    fn a_run_meets_the_goal_at_or_above_redis_and_within_two_points_of_exact_lru() {
        let rows = [
            hit("local", "hit-zipf 1% x1", "redis-server x1", 0.5, 0.45),
            hit("local", "hit-zipf 1% x1", "exact-lru", 0.5, 0.515),
            hit("local", "hit-zipf 10% x1", "redis-server x1", 0.7, 0.71),
            hit("local", "hit-zipf 10% x1", "exact-lru", 0.7, 0.7),
            hit("local", "hit-scan 1% x1", "exact-lru", 0.4, 0.43),
        ];
        let refs = |op: &str| -> Vec<&HitRow> { rows.iter().filter(|r| r.row.op == op).collect() };
        assert!(judge(&refs("hit-zipf 1% x1")).unwrap().0);
        assert!(!judge(&refs("hit-zipf 10% x1")).unwrap().0, "below Redis");
        assert!(!judge(&refs("hit-scan 1% x1")).unwrap().0, "3 points below");
        assert!((rows[0].row.ratio - 0.5 / 0.45).abs() < 1e-9);
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(json["metric"], "hit_rate");
        assert_eq!(json["value"], 0.5);
        assert_eq!(json["reference_value"], 0.45);
    }
}
