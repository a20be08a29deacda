//! [`Store`]: the store's machines (`lookup`, `get`, `put`, `root`) run on a [`PoolClient`]:
//! each step's operations are posted at once, on every node they name, and their answers fed
//! back. The blocks a put replaced are freed once the grace period has passed (docs/STORE.md
//! section 8), by this client's later calls or [`Store::flush_retired`].

use super::format::{check_sizes, KeyHash, Kind, Version};
use super::get::{Get, GetStep};
use super::lookup::{Looked, Lookup, Read, Replica, Src};
use super::placement;
use super::root::{FindRoot, Index, RootStep};
use futures_util::future::join_all;
use rdmapool_pool::remote::regions::RegionNode;
use rdmapool_pool::remote::{PoolClient, RemotePtr};
use rdmapool_pool::{Error, Result};

mod many;
mod reclaim;
mod repair;
mod repairer;
mod retire;
mod source;
mod stripe;
mod view;
mod write;
mod zero_copy;
use parking_lot::Mutex;
pub use repair::RepairReport;
#[cfg(feature = "etcd")]
pub use repairer::VIEW_KEY;
pub use repairer::{Repairer, RepairerStats};
use retire::Retired;
use source::{digest_of, Source};
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
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            replicas: 2,
            grace: Duration::from_secs(1),
            part_size: 256 << 10,
            tombstone_hold: Duration::from_secs(60),
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
    /// Puts that found no room and waited for the blocks this client replaced to come free
    /// (backpressure: [`Store::put`]).
    pub waits_for_room: u64,
    /// Puts, removes and gets that found a newer view in force on a replica's fence word
    /// and were made again under it (a put so made under the old view was not
    /// acknowledged; docs/STORE.md section 4).
    pub fenced: u64,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    removes: AtomicU64,
    waits_for_room: AtomicU64,
    fenced: AtomicU64,
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
    /// Held while a tenant's index is found or made on an isolated node: one at a time,
    /// so no two indexes of one tenant are made at once (`rdmapool-store/src/root.rs`).
    making_index: tokio::sync::Mutex<()>,
    /// Replaced blocks, oldest first, with when they may be freed.
    retired: Mutex<VecDeque<Retired>>,
    /// Part keys of replaced striped values, oldest first, with when they may be cleared.
    retired_parts: Mutex<VecDeque<(Instant, Vec<u8>)>>,
    /// Blocks the last repair found unnamed in gone writers' chunks (section 8).
    reclaim: Mutex<reclaim::Pending>,
    /// Removed keys the last repair found clean, not yet cleared (section 8).
    tombstones: Mutex<repair::Tombstones>,
    /// Where this client last saw each key's blocks, read beside the buckets next time.
    hints: Mutex<HashMap<Vec<u8>, Hints>>,
    counters: Counters,
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
        Ok(Self {
            pool: pool.into(),
            cfg,
            indexes: Mutex::new(HashMap::new()),
            view: Mutex::new(None),
            making_index: tokio::sync::Mutex::new(()),
            retired: Mutex::new(VecDeque::new()),
            retired_parts: Mutex::new(VecDeque::new()),
            reclaim: Mutex::new(reclaim::Pending::default()),
            tombstones: Mutex::new(HashMap::new()),
            hints: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        })
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
            fenced: c.fenced.load(Ordering::Relaxed),
        }
    }

    /// Stores `value` under `key` (a new version; replicas on the key's servers). Returns
    /// the version written.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for an empty or too long
    /// key or value (nothing is written), [`Error::NotEnoughReplicas`] when fewer servers are
    /// live than replicas are asked for, [`Error::NodeDown`] when a replica failed (the
    /// version may then be visible on the key's first replica), [`Error::IndexFull`],
    /// [`Error::Contended`], [`Error::RemoteExhausted`] when a replica has no room, even
    /// after waiting (once, at most a grace period) for the blocks this client replaced to
    /// come free.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<Version> {
        self.put_with(key, value, self.cfg.replicas).await
    }

    /// [`Store::put`] with `replicas` copies of this version instead of the store's
    /// [`StoreConfig::replicas`] (a get reads as many replicas as the store is configured
    /// for, so a version put with fewer survives fewer failures).
    ///
    /// # Errors
    /// As [`Store::put`]; [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for 0
    /// replicas.
    pub async fn put_with(&self, key: &[u8], value: &[u8], replicas: usize) -> Result<Version> {
        self.put_source(key, Source::Bytes(value), replicas).await
    }

    /// Removes `key`; `false` if no replica held it.
    ///
    /// # Errors
    /// As [`Store::put`].
    pub async fn remove(&self, key: &[u8]) -> Result<bool> {
        check_user_key(key, 1)?;
        let done = self
            .write(key, Source::Bytes(b""), Kind::Tombstone, self.cfg.replicas)
            .await?;
        let removed = done.version.is_some();
        if removed {
            self.counters.removes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(removed)
    }

    /// The value stored under `key`, if any.
    ///
    /// # Errors
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for an empty or too long
    /// key, [`Error::NodeDown`] when no replica could answer, or the only copy that answered
    /// was damaged while another replica did not answer; [`Error::Damaged`] when every
    /// replica answered and every copy of the key found fails its checksum (never
    /// `Ok(None)` for damaged data).
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_user_key(key, 1)?;
        let out = self.get_value(key).await?;
        let counter = if out.is_some() {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// The newest verified block of `key` on its replicas, read whole, if any (a
    /// tombstone too).
    async fn get_block(&self, key: &[u8]) -> Result<Option<stripe::BlockRead>> {
        // One future, the lookups in a loop (not a future per lookup, which a retry wrapper
        // would move into place on every get).
        let mut attempt = 1;
        let mut views = 0;
        'lookup: loop {
            let number = self.placing_view().await?.number;
            let (replicas, missing) = self.replicas(key, self.cfg.replicas, Purpose::Read).await?;
            let mut g = Get::hinted(key, &replicas, &self.hints_of(key)).missing(missing);
            let mut bytes: Vec<Option<Vec<u8>>> = Vec::new();
            let mut first = true;
            loop {
                let replies: Vec<Option<&[u8]>> = bytes.iter().map(Option::as_deref).collect();
                match g.advance(&replies) {
                    // A reader slower than the grace period finds its block reused under it
                    // (section 8): look again before calling the key damaged.
                    Err(Error::Damaged { .. }) if attempt < DAMAGED_LOOKS => {
                        attempt += 1;
                        continue 'lookup;
                    }
                    Err(e) => return Err(e),
                    Ok(GetStep::Read(reads)) if first => {
                        // The fence words beside the first round: a newer view in force
                        // means this placement may be stale (docs/STORE.md section 4).
                        first = false;
                        let (b, fences) = futures_util::future::join(
                            self.reads(&replicas, &reads),
                            self.fences(&replicas),
                        )
                        .await;
                        if Self::fenced_out(&fences, number) {
                            self.counters.fenced.fetch_add(1, Ordering::Relaxed);
                            views += 1;
                            if views >= write::VIEW_ROUNDS {
                                return Err(Error::Contended {
                                    what: "store get across view changes",
                                    rounds: views,
                                });
                            }
                            self.reload_view().await?;
                            continue 'lookup;
                        }
                        bytes = b;
                    }
                    Ok(GetStep::Read(reads)) => bytes = self.reads(&replicas, &reads).await,
                    Ok(GetStep::Done(Some((at, f)))) => {
                        self.remember_found(key, &g, f.block.version);
                        let b = match at {
                            Src::Read(i) => bytes.swap_remove(i).unwrap_or_default(),
                            Src::Early(e) => g.take_early(e),
                        };
                        return Ok(Some((b, f.block)));
                    }
                    Ok(GetStep::Done(None)) => return Ok(None),
                }
            }
        }
    }

    /// Where this client last saw `key`'s blocks: `(node, slot word)`.
    pub(super) fn hints_of(&self, key: &[u8]) -> Vec<(u32, u64)> {
        self.hints.lock().get(key).cloned().unwrap_or_default()
    }

    /// Notes where a finished get found `key`'s blocks of `version` (the current ones).
    pub(super) fn remember_found(&self, key: &[u8], get: &Get, version: Version) {
        let current: Vec<(u32, u64)> = get
            .found()
            .iter()
            .filter(|x| x.block.version == version)
            .map(|x| (x.node, x.word))
            .collect();
        self.remember(key, current);
    }

    /// Notes where `key`'s current blocks are (a bounded memory: it starts afresh when
    /// full).
    pub(super) fn remember(&self, key: &[u8], at: Vec<(u32, u64)>) {
        let mut h = self.hints.lock();
        if h.len() >= HINTS && !h.contains_key(key) {
            h.clear();
        }
        h.insert(key.to_vec(), at);
    }

    /// Whether `key` holds a value (a striped value's parts are not read).
    ///
    /// # Errors
    /// As [`Store::get`].
    pub async fn exists(&self, key: &[u8]) -> Result<bool> {
        check_user_key(key, 1)?;
        let found = self.get_block(key).await?;
        Ok(found.is_some_and(|(_, b)| matches!(b.kind, Kind::Value | Kind::Manifest)))
    }

    /// Where each of `key`'s replicas holds it now: the newest block of the key on each
    /// replica that has one (for operators and tests; a get reads the newest of these).
    ///
    /// # Errors
    /// As [`Store::get`].
    pub async fn locate(&self, key: &[u8]) -> Result<Vec<Located>> {
        check_user_key(key, 1)?;
        self.locate_any(key).await
    }

    /// [`Store::locate`] of any key, a striped value's part keys among them (a put's
    /// lookup over the previous placement while keys move).
    pub(super) async fn locate_any(&self, key: &[u8]) -> Result<Vec<Located>> {
        let (replicas, looked, _) = self.look_everywhere(key).await?;
        let mut out = Vec::new();
        for (r, held) in replicas.iter().zip(&looked.held) {
            let Some((slot, _, version)) = held.current else {
                continue;
            };
            let Some(f) = looked
                .found
                .iter()
                .find(|f| f.node == r.node && f.slot == slot)
            else {
                continue;
            };
            let offset = super::format::Slot::from_word(f.word).map_or(0, |s| s.offset);
            out.push(Located {
                block: RemotePtr {
                    node: r.node,
                    offset,
                    len: f.block.value.end as u64,
                    incarnation: r.incarnation,
                },
                version,
                tombstone: f.block.tombstone,
            });
        }
        Ok(out)
    }

    /// The newest version of `key` on every replica a get reads (both placements while
    /// keys move), and whether it is a removal's tombstone: the floor of a put made while
    /// keys move (docs/STORE.md section 4). Unlike a get, it never reads around: a put's
    /// version must beat what every one of them holds.
    ///
    /// # Errors
    /// [`Error::NodeDown`] when one of them is down or did not answer, or a block could not
    /// be read; [`Error::Damaged`] when a copy failed its checksum (its version could be the
    /// newest: the repair sorts it out first).
    pub(super) async fn newest_anywhere(&self, key: &[u8]) -> Result<Option<(Version, bool)>> {
        let (replicas, looked, whole) = self.look_everywhere(key).await?;
        if !whole {
            return Err(Error::NodeDown {
                node: replicas.first().map_or(0, |r| r.node),
                reason: "a replica of this key under the view or the previous one did not \
                         answer: a put waits while keys move"
                    .into(),
            });
        }
        if looked.damaged {
            return Err(Error::Damaged {
                key: String::from_utf8_lossy(key).into_owned(),
                reason: "a copy under the view or the previous one fails its checksum: a put \
                         waits for the repair while keys move"
                    .into(),
            });
        }
        let newest = looked.newest();
        let tombstone = looked
            .found
            .iter()
            .any(|f| Some(f.block.version) == newest && f.block.tombstone);
        Ok(newest.map(|v| (v, tombstone)))
    }

    /// A lookup of `key` on every replica a get reads: the replicas that answered, what
    /// they hold, and whether every one answered in full (none down, every bucket and
    /// candidate block read).
    async fn look_everywhere(&self, key: &[u8]) -> Result<(Vec<Replica>, Looked, bool)> {
        let (replicas, missing) = self.replicas(key, self.cfg.replicas, Purpose::Read).await?;
        let mut lookup = Lookup::new(key, &replicas);
        let buckets = self.reads(&replicas, &lookup.bucket_reads()).await;
        let replies: Vec<Option<&[u8]>> = buckets.iter().map(Option::as_deref).collect();
        let buckets_whole = replies.iter().take(replicas.len()).all(Option::is_some);
        let reads = lookup.on_buckets(&replies);
        let blocks = self.reads(&replicas, &reads).await;
        let replies: Vec<Option<&[u8]>> = blocks.iter().map(Option::as_deref).collect();
        let looked = lookup.on_blocks(&replies);
        let whole = missing == 0 && buckets_whole && !looked.unread;
        Ok((replicas, looked, whole))
    }

    /// The keys that start with `prefix`, sorted, as the servers' indexes hold them now.
    ///
    /// Slower than a get, and not a snapshot: it READs every live node's whole index (in
    /// pieces of 1 MiB), then the header and key of every block the index names (not the
    /// values, so without their checksums), and keeps for each key the newest version any
    /// node holds, leaving out removed keys. A key put or removed meanwhile may or may not
    /// be listed.
    ///
    /// # Errors
    /// [`Error::NodeDown`] when a live node could not be read; the other errors of the
    /// pool's operations.
    pub async fn list(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut newest: HashMap<Vec<u8>, (Version, bool)> = HashMap::new();
        for n in self.pool.regions().up_nodes() {
            for e in self.scan(&n).await?.0 {
                if !e.key.starts_with(prefix) || e.kind == Kind::Part {
                    continue;
                }
                let gone = e.kind == Kind::Tombstone;
                let v = newest.entry(e.key).or_insert((e.version, gone));
                if e.version > v.0 {
                    *v = (e.version, gone);
                }
            }
        }
        let mut keys: Vec<Vec<u8>> = newest
            .into_iter()
            .filter(|(_, (_, tombstone))| !tombstone)
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// The key's replicas, best first, with their indexes (found or made on first use),
    /// placed over every member this client knows, up or down (docs/STORE.md section 4):
    /// for [`Purpose::Read`] those of them that are up, and how many are not; for
    /// [`Purpose::Write`] all of them, or an error naming the one that is down (a put must
    /// reach every replica a later get may read).
    async fn replicas(
        &self,
        key: &[u8],
        count: usize,
        purpose: Purpose,
    ) -> Result<(Vec<Replica>, usize)> {
        let placing = self.placing_view().await?;
        let view = self.pool.regions().members();
        let h = KeyHash::of(key);
        // While keys move: the placements under the view and the previous one, a get
        // reading both (see below).
        let mut moving: Option<(Vec<u32>, Vec<u32>)> = None;
        let chosen = if placing.number == 0 {
            // No view set: the membership this client knows.
            let ids: Vec<u32> = view.nodes.iter().map(|n| n.node).collect();
            placement::replicas(h, &ids, count)
        } else {
            let mut chosen = placement::replicas(h, &placing.members, count);
            if purpose == Purpose::Read && placing.moving() {
                // While data moves, gets read the previous placement too.
                let previous = placement::replicas(h, &placing.previous, count);
                moving = Some((chosen.clone(), previous.clone()));
                for id in previous {
                    if !chosen.contains(&id) {
                        chosen.push(id);
                    }
                }
            }
            chosen
        };
        let member = |id: u32| view.nodes.iter().find(|n| n.node == id);
        match purpose {
            Purpose::Read if chosen.is_empty() => {
                return Err(Error::NotEnoughReplicas { live: 0, wanted: 1 })
            }
            Purpose::Read => {}
            Purpose::Write => {
                if let Some((addr, why)) = view.unreached.first().filter(|_| placing.number == 0) {
                    return Err(Error::MemberUnreached {
                        addr: addr.to_string(),
                        reason: why.clone(),
                    });
                }
                if chosen.len() < count {
                    return Err(Error::NotEnoughReplicas {
                        live: chosen.len(),
                        wanted: count,
                    });
                }
                if let Some(id) = chosen.iter().find(|&&id| member(id).is_none()) {
                    return Err(Error::MemberUnreached {
                        addr: format!("node {id}"),
                        reason: format!(
                            "a member of store view {} that this client has not joined",
                            placing.number
                        ),
                    });
                }
                if let Some(down) = chosen.iter().find(|&&id| member(id).is_some_and(|n| !n.up)) {
                    return Err(Error::NodeDown {
                        node: *down,
                        reason: "a replica of this key is down: a put waits until it answers \
                                 again or leaves the membership"
                            .into(),
                    });
                }
            }
        }
        let mut out = Vec::with_capacity(chosen.len());
        let mut missing = 0;
        for id in &chosen {
            match member(*id) {
                Some(n) if n.up => match self.replica(n).await {
                    Ok(r) => out.push(r),
                    Err(e) if purpose == Purpose::Write => return Err(e),
                    Err(_) => missing += 1,
                },
                _ => missing += 1,
            }
        }
        if out.is_empty() {
            return Err(Error::NodeDown {
                node: chosen[0],
                reason: "no replica of this key answers".into(),
            });
        }
        if let Some((current, previous)) = &moving {
            // Every put acknowledged under the previous view is on all of its placement's
            // replicas, and every one since on all of the new: a get reads around a down
            // replica only while it reads one of each (else the newest may be on those
            // that do not answer, not yet moved).
            for ids in [current, previous] {
                if !ids.iter().any(|id| out.iter().any(|r| r.node == *id)) {
                    return Err(Error::NodeDown {
                        node: ids.first().copied().unwrap_or(0),
                        reason: "while keys move to a new view, no replica of this key under \
                                 one of the two placements answers"
                            .into(),
                    });
                }
            }
        }
        Ok((out, missing))
    }

    /// `n` as a replica, with its index (found or made on first use).
    async fn replica(&self, n: &RegionNode) -> Result<Replica> {
        Ok(Replica {
            node: n.node,
            incarnation: n.incarnation,
            layout: n.layout,
            index: self.index(n).await?,
        })
    }

    async fn index(&self, n: &RegionNode) -> Result<Index> {
        let known = || {
            self.indexes
                .lock()
                .get(&n.node)
                .filter(|&&(inc, _)| inc == n.incarnation)
                .map(|&(_, ix)| ix)
        };
        if let Some(ix) = known() {
            return Ok(ix);
        }
        let _making = match n.isolated {
            true => Some(self.making_index.lock().await),
            false => None,
        };
        if let Some(ix) = known() {
            return Ok(ix); // made meanwhile
        }
        let mut m = match n.isolated {
            true => FindRoot::tenant(n.layout, self.pool.client_id()),
            false => FindRoot::new(n.layout, self.pool.client_id()),
        };
        let mut answer = None;
        let ix = loop {
            match m.advance(answer.take())? {
                RootStep::Io(io) => {
                    answer = Some(self.pool.regions().io(n.node, n.incarnation, io).await?)
                }
                RootStep::Done(ix) => break ix,
            }
        };
        self.indexes.lock().insert(n.node, (n.incarnation, ix));
        Ok(ix)
    }

    async fn reads(&self, replicas: &[Replica], reads: &[Read]) -> Vec<Option<Vec<u8>>> {
        join_all(reads.iter().map(|r| async move {
            let inc = incarnation(replicas, r.node);
            self.pool
                .regions()
                .read(r.node, inc, r.at, r.len)
                .await
                .ok()
        }))
        .await
    }
}

/// Where a key's blocks were last seen: `(node, slot word)` per replica.
type Hints = Vec<(u32, u64)>;

/// Keys whose last-seen blocks a client remembers.
const HINTS: usize = 1 << 16;

/// What a key's replicas are looked up for ([`Store::replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A get, a lookup: read around replicas that are down.
    Read,
    /// A put, a remove, a copy: every replica must be up.
    Write,
}
/// How many lookups a get makes before it reports a key whose copies all fail their
/// checksum as damaged (the first may have raced a reuse after the grace period).
const DAMAGED_LOOKS: u32 = 3;

/// [`check_sizes`], and the part keys' prefix refused ([`Error::ReservedKey`]).
fn check_user_key(key: &[u8], value_len: u64) -> Result<()> {
    check_sizes(key, value_len)?;
    if super::stripe::is_part_key(key) {
        return Err(Error::ReservedKey);
    }
    Ok(())
}

fn incarnation(replicas: &[Replica], node: u32) -> u64 {
    replicas
        .iter()
        .find(|r| r.node == node)
        .map_or(0, |r| r.incarnation)
}
