//! A store in cache mode (docs/STORE.md section 12): a memory budget per server, kept by
//! evicting, with no server CPU.
//!
//! - **Usage.** Each server's store keeps a usage word in its index chunk (bytes 8..16):
//!   the bytes of the blocks its index slots name (each slot word's length bound). Every
//!   swap a client wins changes it by the new word's bytes less the old's; the client adds
//!   its changes with one fetch-and-add once they reach a 64th of the budget (or the
//!   server looks full), and learns the total from the answer.
//! - **Eviction.** A client that finds a server over its budget samples it: random runs of
//!   index buckets, then the header and key of up to [`CacheConfig::samples`] blocks
//!   they name per key to evict, in two steps; the candidates join the client's eviction
//!   pool for that server (the best 16 sampled within a second), which gives up its lowest
//!   ranked (`crate::evict`). Evicting a key swaps each of its replicas' slots from the version's
//!   word to 0 and retires the blocks, when every replica names that version, every member
//!   is up and no keys move; otherwise it writes a tombstone as writer 0, only over that
//!   version (the reclaim of section 11).
//! - **Access.** A get that found a value notes its blocks; the notes go out in a batch, a
//!   WRITE of the time (and, for LFU, a fetch-and-add of the count) on each block, per
//!   server one list, when 64 are waiting or the oldest is a 16th of the grace period old.

use super::{incarnation, Purpose, Store};
use crate::evict::clear::Clear;
use crate::evict::{Candidate, Eviction, EvictionPool, Rules};
use crate::format::{peek, Kind, Slot, ACCESSED_AT, ACCESSES_AT, HEADER_LEN, MAX_KEY_LEN};
use crate::root::Index;
use futures_util::future::join_all;
use rdmapool_pool::remote::regions::{Payload, RegionNode};
use rdmapool_pool::remote::step::{Answer, Io, Op};
use rdmapool_pool::{CoreError, Error, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A cache's settings ([`StoreConfig::cache`](super::StoreConfig::cache)).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// The bytes of store blocks a server may hold (its usage word's bound): past it,
    /// clients evict there. At most the server's chunks' bytes; leave room above it for
    /// what the grace period holds back (replaced and evicted blocks wait a grace period
    /// before they are freed).
    pub budget: u64,
    /// How the candidates are ranked (default [`Eviction::Lru`]).
    pub policy: Eviction,
    /// Candidates sampled per key evicted (default 5, as Redis's `maxmemory-samples`):
    /// each client keeps the best 16 it sampled on each server for a second, as Redis
    /// keeps its eviction pool, and evicts the lowest ranked of those.
    pub samples: usize,
    /// How long a soft-pinned value is kept after it was last read or put, while anything
    /// else is left to evict (default 30 minutes, Mooncake's default).
    pub soft_pin: Duration,
}

impl CacheConfig {
    /// A cache of `budget` bytes per server, with the defaults.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            policy: Eviction::Lru,
            samples: 5,
            soft_pin: Duration::from_secs(30 * 60),
        }
    }
}

/// One server's usage, as [`Store::server_usage`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerUsage {
    /// The server's node id.
    pub node: u32,
    /// Bytes of store blocks allocated there less those freed, as every client has added
    /// them (each holds back up to a 64th of the budget until its next addition).
    pub used: u64,
    /// The cache's budget there (0 for a store not in cache mode).
    pub budget: u64,
}

/// Access notes waiting: this many go out together.
const TOUCHES_AT_ONCE: usize = 16;
/// Keys evicted at most per eviction.
const VICTIMS_AT_ONCE: u64 = 32;
/// Header READs per list of a sample.
const READS_PER_LIST: usize = 32;
/// Buckets read at most per sampled run.
const RUN_MOST: u64 = 1024;
/// How long a sampled candidate stays in a client's eviction pool: past it, its rank may
/// be stale (read since by others, or evicted by another client).
const POOL_FRESH: Duration = Duration::from_secs(1);

/// What a cache client keeps per server.
#[derive(Debug, Clone)]
struct NodeUsage {
    incarnation: u64,
    /// What this client's swaps changed of the bytes slots name here, not yet added to
    /// the usage word.
    pending: i64,
    /// The usage word after this client's last addition.
    used: u64,
    /// Whether `used` was learnt from the usage word yet (an addition answered): until
    /// then this client cannot tell the server is over its budget.
    learnt: bool,
    /// Occupied slots per slot sampled, lately.
    occupancy: f64,
    /// Bytes per key evicted, lately.
    victim_bytes: u64,
    /// The best candidates sampled here lately.
    pool: EvictionPool,
}

impl NodeUsage {
    fn new(incarnation: u64) -> Self {
        Self {
            incarnation,
            pending: 0,
            used: 0,
            learnt: false,
            occupancy: 0.5,
            victim_bytes: 1024,
            pool: EvictionPool::default(),
        }
    }

    /// The bytes named here, as far as this client knows.
    fn held(&self) -> u64 {
        u64::try_from((self.used as i64).saturating_add(self.pending)).unwrap_or(0)
    }
}

/// A get's note of a block it read ([`Store::touched`]).
#[derive(Debug, Clone, Copy)]
struct Touch {
    node: u32,
    incarnation: u64,
    block: u64,
    seen: Instant,
}

/// What a cache client keeps: per server, and the access notes waiting.
#[derive(Debug, Default)]
pub(super) struct Usage {
    nodes: HashMap<u32, NodeUsage>,
    touches: Vec<Touch>,
}

impl Usage {
    fn node(&mut self, node: u32, incarnation: u64) -> &mut NodeUsage {
        let e = self
            .nodes
            .entry(node)
            .or_insert_with(|| NodeUsage::new(incarnation));
        if e.incarnation != incarnation {
            *e = NodeUsage::new(incarnation);
        }
        e
    }
}

impl Store {
    /// The cache's settings checked against the servers: a budget of 0, or one above a
    /// live server's chunks' bytes, is refused.
    pub(super) fn check_cache(&self) -> Result<()> {
        let Some(c) = &self.cfg.cache else {
            return Ok(());
        };
        let most = self
            .pool
            .regions()
            .up_nodes()
            .iter()
            .map(|n| n.layout.chunk_count * n.layout.chunk_size)
            .min()
            .unwrap_or(u64::MAX);
        if c.budget == 0 || c.budget > most {
            return Err(Error::Core(CoreError::OutOfLimits {
                what: "store cache budget, in bytes per server (a server's chunks hold at most the max)",
                value: c.budget,
                min: 1,
                max: most,
            }));
        }
        if c.samples == 0 {
            return Err(Error::Core(CoreError::OutOfLimits {
                what: "store cache samples per eviction",
                value: 0,
                min: 1,
                max: u64::MAX,
            }));
        }
        Ok(())
    }

    /// Notes what this client's swaps changed of the bytes slots name, by node (a put's
    /// [`PutDone::named_bytes`](crate::put::PutDone), a clear's), for the usage words.
    pub(super) fn charge(&self, deltas: impl IntoIterator<Item = (u32, i64)>) {
        if self.cfg.cache.is_none() {
            return;
        }
        let indexes = self.indexes.lock();
        let mut u = self.usage.lock();
        for (node, delta) in deltas {
            if let Some(&(incarnation, _)) = indexes.get(&node) {
                u.node(node, incarnation).pending += delta;
            }
        }
    }

    /// After a put or a remove in cache mode: adds what this client changed to the usage
    /// words where it reached a 64th of the budget, where the server looks full, or where
    /// this client has not learnt the usage word yet (its first write there: a short-lived
    /// client, such as a one-shot `rdma-tool store put`, would otherwise never add what it
    /// wrote nor see the server over its budget), and evicts on every server found over its
    /// budget.
    pub(super) async fn after_write(&self) {
        let Some(cache) = &self.cfg.cache else {
            return;
        };
        let step = (cache.budget / 64).max(1) as i64;
        let nodes = self.pool.regions().up_nodes();
        let due: Vec<RegionNode> = {
            let mut u = self.usage.lock();
            nodes
                .into_iter()
                .filter(|n| {
                    let e = u.node(n.node, n.incarnation);
                    let first = !e.learnt && e.pending != 0;
                    first || e.pending.abs() >= step || e.held() > cache.budget
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        // Beside the frees under way, as a put runs: they go on while it waits.
        let evictions = async {
            for (n, bytes) in self.add_usage(&due).await {
                self.evict_on(&n, bytes + cache.budget / 32).await;
            }
        };
        self.beside_frees(evictions).await;
    }

    /// For a put into a full cache (a replica had no room): adds every server's pending
    /// bytes to its usage word, evicts where a server is over its budget (or, if none is,
    /// a 16th of the budget on every server: their regions filled before their budgets),
    /// then waits for the blocks this client evicted or replaced to come free (at most a
    /// grace period) and frees them.
    pub(super) async fn make_room(&self) {
        let Some(cache) = &self.cfg.cache else {
            return;
        };
        let nodes = self.pool.regions().up_nodes();
        let mut over = self.add_usage(&nodes).await;
        if over.is_empty() {
            over = nodes.into_iter().map(|n| (n, 0)).collect();
        }
        let evictions = async {
            for (n, bytes) in over {
                self.evict_on(&n, bytes + cache.budget / 16).await;
            }
        };
        self.beside_frees(evictions).await;
        if let Some(due) = self.retired_due() {
            self.pool.regions().sleep_until(due).await;
        }
        self.flush_retired().await;
    }

    /// In cache mode: adds the bytes this client's writes changed, on every server where
    /// some wait, to the usage words now ([`Store::flush_counters`]); evicts nothing.
    pub(super) async fn flush_usage(&self) {
        if self.cfg.cache.is_none() {
            return;
        }
        let waiting: Vec<RegionNode> = {
            let mut u = self.usage.lock();
            self.pool
                .regions()
                .up_nodes()
                .into_iter()
                .filter(|n| u.node(n.node, n.incarnation).pending != 0)
                .collect()
        };
        if !waiting.is_empty() {
            self.add_usage(&waiting).await;
        }
    }

    /// Adds each of `nodes`' pending bytes to its usage word, in one step: the servers
    /// over the budget, by how much.
    async fn add_usage(&self, nodes: &[RegionNode]) -> Vec<(RegionNode, u64)> {
        let Some(cache) = &self.cfg.cache else {
            return Vec::new();
        };
        let indexes = join_all(nodes.iter().map(|n| self.index(n))).await;
        let mut ops = Vec::new();
        let mut asked = Vec::new();
        {
            let mut u = self.usage.lock();
            for (n, ix) in nodes.iter().zip(indexes) {
                let Ok(ix) = ix else { continue };
                let e = u.node(n.node, n.incarnation);
                ops.push(Op {
                    node: n.node,
                    io: Io::FetchAdd {
                        at: ix.usage_word(),
                        add: e.pending as u64,
                    },
                });
                asked.push((*n, e.pending));
                e.pending = 0;
            }
        }
        let answers = self
            .pool
            .regions()
            .perform(
                &ops,
                |node| {
                    nodes
                        .iter()
                        .find(|n| n.node == node)
                        .map_or(0, |n| n.incarnation)
                },
                Payload::None,
            )
            .await
            .unwrap_or_else(|_| vec![Answer::Failed; ops.len()]);
        let mut u = self.usage.lock();
        let mut over = Vec::new();
        for ((n, added), answer) in asked.into_iter().zip(answers) {
            let e = u.node(n.node, n.incarnation);
            match answer {
                Answer::Word(old) => {
                    e.used = (old as i64).wrapping_add(added).max(0) as u64;
                    e.learnt = true;
                    let now = e.held();
                    if now > cache.budget {
                        over.push((n, now - cache.budget));
                    }
                }
                // Not added: again next time.
                _ => e.pending += added,
            }
        }
        over
    }

    /// Evicts about `bytes` from `n`: samples it, and evicts the lowest ranked of its
    /// eviction pool.
    async fn evict_on(&self, n: &RegionNode, bytes: u64) {
        let Some(cache) = &self.cfg.cache else {
            return;
        };
        let Ok(replica) = self.replica(n).await else {
            return;
        };
        let (occupancy, per_key) = {
            let mut u = self.usage.lock();
            let e = u.node(n.node, n.incarnation);
            (e.occupancy, e.victim_bytes.max(64))
        };
        let groups = bytes.div_ceil(per_key).clamp(1, VICTIMS_AT_ONCE);
        let samples = cache.samples as u64;
        let run = ((samples as f64 / (8.0 * occupancy.max(1e-3))).ceil() as u64)
            .clamp(1, RUN_MOST.min(replica.index.buckets));
        // One random run of buckets per group, in one step.
        let starts: Vec<u64> = (0..groups)
            .map(|_| fastrand::u64(0..=replica.index.buckets - run))
            .collect();
        let ops: Vec<Op> = starts
            .iter()
            .map(|&b| Op {
                node: n.node,
                io: Io::Read {
                    at: replica.index.bucket(b),
                    len: run * 64,
                },
            })
            .collect();
        let Ok(answers) = self.perform(&[replica], &ops).await else {
            return;
        };
        // Each run's occupied slots, up to the samples.
        let mut slots: Vec<Slot> = Vec::new();
        let mut occupied = 0u64;
        for a in &answers {
            let words = a.words();
            let found: Vec<Slot> = words.iter().filter_map(|&w| Slot::from_word(w)).collect();
            occupied += found.len() as u64;
            slots.extend(found.into_iter().take(cache.samples));
        }
        let reads: Vec<Op> = slots
            .iter()
            .map(|s| Op {
                node: n.node,
                io: Io::Read {
                    at: s.offset,
                    len: s
                        .read_len()
                        .min((HEADER_LEN + MAX_KEY_LEN + 1) as u64)
                        .min(self.room(n, s)),
                },
            })
            .collect();
        // In lists of a few dozen, at once: a step never needs the whole send queue.
        let replicas = [replica];
        let lists = join_all(
            reads
                .chunks(READS_PER_LIST)
                .map(|list| self.perform(&replicas, list)),
        )
        .await;
        let mut heads = Vec::with_capacity(reads.len());
        for list in lists {
            let Ok(answers) = list else { return };
            heads.extend(answers);
        }
        let rules = Rules {
            policy: cache.policy,
            now_us: super::wall_clock_us()
                .saturating_add(u64::try_from(self.cfg.clock_skew.as_micros()).unwrap_or(u64::MAX)),
            soft_pin_us: u64::try_from(cache.soft_pin.as_micros()).unwrap_or(u64::MAX),
        };
        let mut sampled = Vec::with_capacity(slots.len());
        for (s, head) in slots.iter().zip(&heads) {
            let Some(p) = head.bytes().and_then(peek) else {
                continue;
            };
            let bound = crate::format::length_bound(s.length_code);
            sampled.extend(rules.candidate(p, bound));
        }
        let victims = {
            let mut u = self.usage.lock();
            let e = u.node(n.node, n.incarnation);
            let looked = (groups * run * 8) as f64;
            e.occupancy = 0.5 * e.occupancy + 0.5 * (occupied as f64 / looked);
            let victims = e
                .pool
                .take(sampled, Instant::now(), POOL_FRESH, groups as usize);
            if !victims.is_empty() {
                let avg = victims.iter().map(|v| v.bytes).sum::<u64>() / victims.len() as u64;
                e.victim_bytes = (e.victim_bytes + avg) / 2;
            }
            victims
        };
        self.evict(n.node, &victims).await;
    }

    /// Evicts `victims`, sampled on `node`, each only at the version sampled (see the
    /// module's text).
    async fn evict(&self, node: u32, victims: &[Candidate]) {
        let direct =
            self.pool.regions().all_up() && self.placing_view().await.is_ok_and(|v| !v.moving());
        let (clear, tombstone): (Vec<&Candidate>, Vec<&Candidate>) = victims
            .iter()
            .partition(|v| direct && v.kind != Kind::Manifest);
        let cleared = join_all(clear.into_iter().map(|v| self.clear_victim(v))).await;
        let mut evicted = cleared.iter().filter(|&&d| d).count() as u64;
        // One at a time: each is a put of its own, with its own lookup and spares.
        for v in tombstone {
            evicted += u64::from(self.tombstone_victim(v).await);
        }
        self.counters
            .evictions
            .fetch_add(evicted, Ordering::Relaxed);
        self.count_on(node, super::counts::Counted::Eviction, evicted);
    }

    /// Evicts `v` by swapping each replica's slot from its version's word to 0, if every
    /// replica names that version (`crate::evict::clear`); retires the blocks of the slots
    /// it cleared. Whether it cleared any.
    async fn clear_victim(&self, v: &Candidate) -> bool {
        let Ok((replicas, _)) = self
            .replicas(&v.key, self.cfg.replicas, Purpose::Write)
            .await
        else {
            return false;
        };
        let mut clear =
            Clear::new(&v.key, v.version, &replicas).unless_read_since(v.accessed_us, v.accesses);
        let Ok(cleared) = self
            .pool
            .regions()
            .drive(
                &mut clear,
                |node| incarnation(&replicas, node),
                Payload::None,
            )
            .await
        else {
            return false;
        };
        let any = !cleared.is_empty();
        self.charge(
            cleared
                .iter()
                .map(|&(node, _, _, bytes)| (node, -(bytes as i64))),
        );
        self.retire(
            &v.key,
            cleared
                .into_iter()
                .map(|(node, inc, at, _)| (node, inc, at, v.version)),
        );
        any
    }

    /// Evicts `v` with a tombstone as writer 0, only over its version (as the reclaim of
    /// an expired value, docs/STORE.md section 11). Whether it wrote one.
    async fn tombstone_victim(&self, v: &Candidate) -> bool {
        let what = super::put::Writing {
            only_over: Some(v.version),
            ..super::put::Writing::kind(Kind::Tombstone)
        };
        let done = Box::pin(self.write(
            &v.key,
            super::put::Source::Bytes(b""),
            what,
            self.cfg.replicas,
        ))
        .await;
        done.is_ok_and(|d| d.version.is_some())
    }

    /// After gets of `keys` in cache mode: notes the blocks of those that `found` a value,
    /// and sends the notes waiting if they are due ([`Store::flush_touches`]).
    pub(super) async fn touched_all(&self, keys: &[&[u8]], found: impl IntoIterator<Item = bool>) {
        if self.cfg.cache.is_none() {
            return;
        }
        for (key, found) in keys.iter().zip(found) {
            if found {
                self.touched(key);
            }
        }
        self.flush_touches(false).await;
    }

    /// Notes that a get read `key` (the blocks its hint names, seen within a quarter of
    /// the grace period), for the next batch of access updates.
    fn touched(&self, key: &[u8]) {
        if self.cfg.cache.is_none() {
            return;
        }
        let Some((since, slots)) = self.hint_with_time(key) else {
            return;
        };
        let indexes = self.indexes.lock();
        let mut u = self.usage.lock();
        for s in slots {
            let (Some(slot), Some(&(incarnation, _))) =
                (Slot::from_word(s.word), indexes.get(&s.node))
            else {
                continue;
            };
            u.touches.push(Touch {
                node: s.node,
                incarnation,
                block: slot.offset,
                seen: since,
            });
        }
    }

    /// Sends the access notes waiting, when 64 are or the oldest is a 16th of the grace
    /// period old (or at once, `now`): per block a WRITE of this client's time and, for
    /// LFU, a fetch-and-add of the reads counted; per server one list. Notes older than a
    /// quarter of the grace period are dropped (their block may be free by the time the
    /// WRITE lands).
    pub(super) async fn flush_touches(&self, now: bool) {
        let Some(cache) = &self.cfg.cache else {
            return;
        };
        let touches = {
            let mut u = self.usage.lock();
            let due = u.touches.len() >= TOUCHES_AT_ONCE
                || u.touches
                    .first()
                    .is_some_and(|t| t.seen.elapsed() >= self.cfg.grace / 16);
            if !(due || now) || u.touches.is_empty() {
                return;
            }
            std::mem::take(&mut u.touches)
        };
        let young = self.cfg.grace / 4;
        let mut counts: HashMap<(u32, u64, u64), u64> = HashMap::new();
        for t in touches.iter().filter(|t| t.seen.elapsed() < young) {
            *counts.entry((t.node, t.incarnation, t.block)).or_default() += 1;
        }
        let us = super::wall_clock_us().to_le_bytes().to_vec();
        let mut ops = Vec::with_capacity(counts.len() * 2);
        let mut nodes: Vec<(u32, u64)> = Vec::new();
        for (&(node, incarnation, block), &count) in &counts {
            if !nodes.contains(&(node, incarnation)) {
                nodes.push((node, incarnation));
            }
            ops.push(Op {
                node,
                io: Io::Write {
                    at: block + ACCESSED_AT,
                    bytes: us.clone(),
                },
            });
            if cache.policy == Eviction::Lfu {
                ops.push(Op {
                    node,
                    io: Io::FetchAdd {
                        at: block + ACCESSES_AT,
                        add: count,
                    },
                });
            }
        }
        if ops.is_empty() {
            return;
        }
        let incarnation = |node: u32| {
            nodes
                .iter()
                .find(|&&(n, _)| n == node)
                .map_or(0, |&(_, inc)| inc)
        };
        let sent = self
            .pool
            .regions()
            .perform(&ops, incarnation, Payload::None)
            .await;
        if sent.is_ok() {
            self.counters
                .access_updates
                .fetch_add(counts.len() as u64, Ordering::Relaxed);
        }
    }

    /// Each live server's usage word and the cache's budget there (a store not in cache
    /// mode keeps no usage word up to date: its `used` stays 0).
    ///
    /// # Errors
    /// [`Error::NodeDown`] when a live server could not be read.
    pub async fn server_usage(&self) -> Result<Vec<ServerUsage>> {
        let budget = self.cfg.cache.as_ref().map_or(0, |c| c.budget);
        let mut out = Vec::new();
        for n in self.pool.regions().up_nodes() {
            let ix = self.index(&n).await?;
            let word = self
                .pool
                .regions()
                .read(n.node, n.incarnation, ix.usage_word(), 8)
                .await?;
            let used = u64::from_le_bytes(word[..8].try_into().unwrap_or([0; 8]));
            out.push(ServerUsage {
                node: n.node,
                // A sum of signed additions: below 0 only while frees were added before
                // the allocations they free.
                used: if (used as i64) < 0 { 0 } else { used },
                budget,
            });
        }
        Ok(out)
    }
}

impl Index {
    /// Region offset of the usage word of a cache (index chunk bytes 8..16).
    pub(crate) fn usage_word(&self) -> u64 {
        self.start - crate::root::INDEX_START + 8
    }
}
