//! Per-server counters (docs/STORE.md section 2): hits, misses, evictions and expirations,
//! kept in each server's index chunk (bytes 16..48) as 64-bit little-endian words that
//! every client adds to with fetch-and-add, and read with the usage word by
//! [`Store::server_stats`].
//!
//! - **Attribution.** A get's hit or miss, and an expired value a read found, count on the
//!   key's **first replica**: the first of its replicas under the view this client places
//!   keys by that is up (its primary, or the next one while the primary is down); the
//!   server every get of the key reads first. An eviction counts on the server it was
//!   sampled on (the one found over its budget).
//! - **No round trip per get.** The counts wait in the client, per server, and go out in
//!   one step of fetch-and-adds (per server one list, a word per counter that changed) once
//!   64 operations wait or the oldest is a 16th of the grace period old, checked after
//!   gets, puts and removes (an idle client holds its counts until its next call);
//!   [`Store::flush_counters`] sends them at once. Counts of a server that is down wait
//!   until it is up again.

use super::Store;
use crate::format::KeyHash;
use crate::root::{Index, INDEX_START};
use futures_util::future::join_all;
use rdmapool_pool::remote::regions::{Payload, RegionNode};
use rdmapool_pool::remote::step::{Answer, Io, Op};
use rdmapool_pool::{Error, Result};
use std::collections::HashMap;
use std::time::Instant;

/// One server's store counters and usage, as [`Store::server_stats`] read them from its
/// index chunk (docs/STORE.md section 2). The counters are the sums of what every client
/// added; a client holds back what it counted since its last addition (fewer than 64
/// operations) until they are a 16th of the grace period old and it makes another call,
/// or until [`Store::flush_counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// The server's node id.
    pub node: u32,
    /// The bytes of store blocks its index names, as the clients of a cache added them
    /// (its usage word, as [`Store::server_usage`] reads it; 0 for a durable store).
    pub used: u64,
    /// The cache's budget there, as this client is configured (0 for a store not in cache
    /// mode).
    pub budget: u64,
    /// Gets that found a value, of keys whose first replica is this server.
    pub hits: u64,
    /// Gets that found none, of keys whose first replica is this server (evicted, removed,
    /// expired or never put).
    pub misses: u64,
    /// Keys evicted from this server to keep it within its budget (cache mode).
    pub evictions: u64,
    /// Reads (gets and exists) that found the newest value of a key whose first replica is
    /// this server expired; an expired get counts as a miss too.
    pub expirations: u64,
}

impl ServerStats {
    /// `hits / (hits + misses)`; `None` before any get was counted.
    pub fn hit_rate(&self) -> Option<f64> {
        let gets = self.hits + self.misses;
        (gets > 0).then(|| self.hits as f64 / gets as f64)
    }
}

/// What a per-server counter counts: its place among the counter words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    /// A get that found a value (index chunk bytes 16..24).
    Hit = 0,
    /// A get that found none (24..32).
    Miss = 1,
    /// A key evicted (32..40).
    Eviction = 2,
    /// An expired value a read found (40..48).
    Expiration = 3,
}

/// The counter words of an index chunk.
const COUNTERS: usize = 4;
/// Operations counted that go out together.
const COUNTS_AT_ONCE: u64 = 64;

/// What a client counted and has not yet added to the servers' counter words.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Per server, what to add to each counter word.
    by_node: HashMap<u32, [u64; COUNTERS]>,
    /// Operations counted since the last addition.
    operations: u64,
    /// When the oldest of them was counted.
    oldest: Option<Instant>,
}

impl Tally {
    fn add(&mut self, node: u32, counter: usize, n: u64) {
        self.by_node.entry(node).or_default()[counter] += n;
        self.operations += n;
        self.oldest.get_or_insert_with(Instant::now);
    }
}

impl Store {
    /// Counts `n` of `what` on server `node`, for its counter words.
    pub(super) fn count_on(&self, node: u32, what: Counted, n: u64) {
        if n > 0 {
            self.tally.lock().add(node, what as usize, n);
        }
    }

    /// Counts one `what` of `key` on its first replica (see the module's text).
    pub(super) fn count_for_key(&self, key: &[u8], what: Counted) {
        if let Some(node) = self.first_replica(key) {
            self.count_on(node, what, 1);
        }
    }

    /// The first of `key`'s replicas under the view this client places keys by that is up:
    /// the server a get of the key reads first (as [`Store::replicas`] orders them).
    fn first_replica(&self, key: &[u8]) -> Option<u32> {
        let view = self.view.lock().clone().unwrap_or_default();
        let members = self.pool.regions().members();
        let (chosen, _) = super::replicas::placed(
            &view,
            &members,
            KeyHash::of(key),
            self.cfg.replicas,
            super::Purpose::Read,
        );
        chosen
            .into_iter()
            .find(|&id| members.nodes.iter().any(|n| n.node == id && n.up))
    }

    /// After gets of `keys` (each whether it `found` a value): the access notes of a cache
    /// ([`Store::touched_all`]) and the counts waiting, each sent if due, together.
    pub(super) async fn after_gets(&self, keys: &[&[u8]], found: impl IntoIterator<Item = bool>) {
        futures_util::future::join(self.touched_all(keys, found), self.flush_counts(false)).await;
    }

    /// Adds the counts this client holds to the servers' counter words now (docs/STORE.md
    /// section 2), rather than once 64 operations wait or the oldest is a 16th of the grace
    /// period old; in cache mode also the bytes its writes changed to the usage words, and
    /// its access notes. Call it before dropping a store whose counts should be seen at
    /// once (`rdma-tool store` and Python's `Store.close` do): what is not added when a
    /// store is dropped is lost (a usage word then counts less than its slots name). Counts
    /// of a server that is down stay for a later call.
    pub async fn flush_counters(&self) {
        futures_util::future::join3(
            self.flush_counts(true),
            self.flush_usage(),
            self.flush_touches(true),
        )
        .await;
    }

    /// Adds the counts waiting when they are due (or at once, `now`): per server that is
    /// up, a fetch-and-add of each counter word that changed, all in one step. Counts whose
    /// fetch-and-add failed wait for the next time; a step the pool refused is dropped.
    pub(super) async fn flush_counts(&self, now: bool) {
        {
            let t = self.tally.lock();
            let due = t.operations >= COUNTS_AT_ONCE
                || t.oldest.is_some_and(|o| o.elapsed() >= self.cfg.grace / 16);
            if !(due || now) || t.by_node.is_empty() {
                return;
            }
        }
        let up = self.pool.regions().up_nodes();
        let taken: Vec<(RegionNode, [u64; COUNTERS])> = {
            let mut t = self.tally.lock();
            let taken: Vec<_> = up
                .into_iter()
                .filter_map(|n| t.by_node.remove(&n.node).map(|c| (n, c)))
                .collect();
            // What is left (servers down) is tried again a 16th of the grace period on.
            t.operations = 0;
            t.oldest = (!t.by_node.is_empty()).then(Instant::now);
            taken
        };
        if taken.is_empty() {
            return;
        }
        let indexes = join_all(taken.iter().map(|(n, _)| self.index(n))).await;
        let mut ops = Vec::new();
        let mut asked = Vec::new();
        for ((n, counts), ix) in taken.iter().zip(indexes) {
            let Ok(ix) = ix else {
                self.put_back(n.node, counts.iter().copied().enumerate());
                continue;
            };
            for (i, &add) in counts.iter().enumerate().filter(|(_, &add)| add > 0) {
                ops.push(Op {
                    node: n.node,
                    io: Io::FetchAdd {
                        at: ix.counter_word(i),
                        add,
                    },
                });
                asked.push((n.node, i, add));
            }
        }
        if ops.is_empty() {
            return;
        }
        let incarnation = |node: u32| {
            taken
                .iter()
                .find(|(n, _)| n.node == node)
                .map_or(0, |(n, _)| n.incarnation)
        };
        let Ok(answers) = self
            .pool
            .regions()
            .perform(&ops, incarnation, Payload::None)
            .await
        else {
            return;
        };
        let mut t = self.tally.lock();
        for ((node, i, add), answer) in asked.into_iter().zip(answers) {
            if !matches!(answer, Answer::Word(_)) {
                t.add(node, i, add);
            }
        }
    }

    /// Counts taken out for an addition that could not be made, back into the tally.
    fn put_back(&self, node: u32, counts: impl IntoIterator<Item = (usize, u64)>) {
        let mut t = self.tally.lock();
        for (i, n) in counts.into_iter().filter(|&(_, n)| n > 0) {
            t.add(node, i, n);
        }
    }

    /// Each live server's counters and usage, from one READ of its index chunk's bytes
    /// 8..48 (the usage word and the four counter words; docs/STORE.md section 2), every
    /// server's at once. A server whose store has no index yet gets one (as for any
    /// operation on it). This client's counts not yet added are not in them: call
    /// [`Store::flush_counters`] first to see them.
    ///
    /// # Errors
    /// [`Error::NodeDown`] when a live server could not be read.
    pub async fn server_stats(&self) -> Result<Vec<ServerStats>> {
        let budget = self.cfg.cache.as_ref().map_or(0, |c| c.budget);
        let nodes = self.pool.regions().up_nodes();
        let mut reads = Vec::with_capacity(nodes.len());
        for n in &nodes {
            let ix = self.index(n).await?;
            reads.push((
                n.node,
                n.incarnation,
                ix.usage_word(),
                8 * (1 + COUNTERS as u64),
            ));
        }
        let answers = self.pool.regions().reads(&reads).await;
        let mut out = Vec::with_capacity(nodes.len());
        for (n, bytes) in nodes.iter().zip(answers) {
            let Some(bytes) = bytes.filter(|b| b.len() >= 8 * (1 + COUNTERS)) else {
                return Err(Error::NodeDown {
                    node: n.node,
                    reason: "its index chunk's usage and counter words could not be read".into(),
                });
            };
            let word = |i: usize| {
                let mut w = [0; 8];
                w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
                u64::from_le_bytes(w)
            };
            let used = word(0);
            out.push(ServerStats {
                node: n.node,
                // A sum of signed additions: below 0 only while frees were added before
                // the allocations they free.
                used: if (used as i64) < 0 { 0 } else { used },
                budget,
                hits: word(1 + Counted::Hit as usize),
                misses: word(1 + Counted::Miss as usize),
                evictions: word(1 + Counted::Eviction as usize),
                expirations: word(1 + Counted::Expiration as usize),
            });
        }
        Ok(out)
    }
}

impl Index {
    /// Region offset of counter word `i` (index chunk bytes `16 + 8 i .. 24 + 8 i`:
    /// [`Counted`]'s order).
    fn counter_word(&self, i: usize) -> u64 {
        self.start - INDEX_START + 16 + 8 * i as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_words_are_bytes_16_to_48_of_the_index_chunk() {
        let chunk = 5 << 20;
        let ix = Index {
            chunk: 5,
            start: chunk + INDEX_START,
            buckets: 100,
        };
        assert_eq!(ix.usage_word(), chunk + 8);
        let words: Vec<u64> = (0..COUNTERS).map(|i| ix.counter_word(i) - chunk).collect();
        assert_eq!(words, [16, 24, 32, 40]);
        assert_eq!(
            ix.counter_word(Counted::Expiration as usize) + 8,
            ix.bucket(0) - 16
        );
    }

    #[test]
    fn a_tally_counts_operations_per_server_and_the_hit_rate_its_gets() {
        let mut t = Tally::default();
        t.add(1, Counted::Hit as usize, 1);
        t.add(1, Counted::Miss as usize, 1);
        t.add(2, Counted::Eviction as usize, 3);
        assert_eq!(t.operations, 5);
        assert_eq!(t.by_node[&1], [1, 1, 0, 0]);
        assert_eq!(t.by_node[&2], [0, 0, 3, 0]);
        assert!(t.oldest.is_some());
        let s = ServerStats {
            hits: 3,
            misses: 1,
            ..ServerStats::default()
        };
        assert_eq!(s.hit_rate(), Some(0.75));
        assert_eq!(ServerStats::default().hit_rate(), None);
    }
}
