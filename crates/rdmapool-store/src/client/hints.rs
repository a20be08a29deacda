//! What a client keeps to save round trips (docs/STORE.md sections 5 and 6):
//!
//! - **Hints**: per key, the slots where this client last saw it (its own put installed
//!   them, or a get found them), with the version and kind of the blocks they named, and
//!   when. A get or put reads those blocks beside the buckets; a put whose hint is recent
//!   enough and covers every replica publishes from it in one round trip.
//! - **Spares**: blocks allocated ahead, one per node, incarnation and size class, for the
//!   next put of that size there (each put allocates the next one's beside itself).
//! - **Put locks**: one put of a key at a time from this client, so no two puts of one
//!   key ever take the same version (both would be `(seq, this client)`).

use super::Store;
use crate::format::Kind;
use crate::get::Get;
use crate::lookup::Replica;
use crate::put::{BlockAt, SlotSeen};
use rdmapool_pool::remote::layout::size_class;
use std::time::{Duration, Instant};

/// Keys whose last-seen slots a client remembers.
const HINTS: usize = 1 << 16;

/// Put locks: puts of keys that hash alike wait for each other.
pub(super) const PUT_LOCKS: usize = 256;

/// A hint is current for a one-round put while younger than the grace period divided by
/// this: the blocks it names were replaced no sooner than it was seen, and are freed no
/// sooner than a grace period after that, so none can have been reused under the same
/// word, even by a swap that lands somewhat after it is sent.
const CURRENT_FOR: u32 = 4;

/// Where a key's slots were seen, and since when (at the latest).
#[derive(Debug, Clone)]
pub(super) struct Hint {
    since: Instant,
    slots: Vec<SlotSeen>,
}

impl Store {
    /// Where this client last saw `key`'s blocks: `(node, slot word)`.
    pub(super) fn hints_of(&self, key: &[u8]) -> Vec<(u32, u64)> {
        self.hints
            .lock()
            .get(key)
            .map(|h| h.slots.iter().map(|s| (s.node, s.word)).collect())
            .unwrap_or_default()
    }

    /// When this client last saw `key`'s blocks, and where.
    pub(super) fn hint_with_time(&self, key: &[u8]) -> Option<(Instant, Vec<SlotSeen>)> {
        self.hints
            .lock()
            .get(key)
            .map(|h| (h.since, h.slots.clone()))
    }

    /// Where this client last saw `key`'s blocks, with their versions and kinds.
    pub(super) fn hint_slots(&self, key: &[u8]) -> Option<Vec<SlotSeen>> {
        self.hints.lock().get(key).map(|h| h.slots.clone())
    }

    /// `key`'s slots on every one of `replicas` (in their order) if this client saw them
    /// all less than a fraction of the grace period ago, before `now`.
    pub(super) fn current_hint(
        &self,
        key: &[u8],
        replicas: &[Replica],
        now: Instant,
    ) -> Option<Vec<SlotSeen>> {
        let hints = self.hints.lock();
        let h = hints.get(key)?;
        let young = self.cfg.grace / CURRENT_FOR;
        if now.saturating_duration_since(h.since) >= young.max(Duration::from_nanos(1)) {
            return None;
        }
        replicas
            .iter()
            .map(|r| h.slots.iter().find(|s| s.node == r.node).copied())
            .collect()
    }

    /// Notes where a get that started at `since` found `key`'s blocks of `version` (the
    /// current ones).
    pub(super) fn remember_found(&self, key: &[u8], get: &Get, since: Instant) {
        let Some(version) = get.found().iter().map(|f| f.block.version).max() else {
            return;
        };
        let slots = get
            .found()
            .iter()
            .filter(|f| f.block.version == version)
            .map(|f| SlotSeen {
                node: f.node,
                slot: f.slot,
                word: f.word,
                version,
                kind: f.block.kind,
            })
            .collect();
        self.remember(key, since, slots);
    }

    /// Notes where `key`'s current blocks are, as seen by an operation that started at
    /// `since` (a bounded memory: it starts afresh when full).
    pub(super) fn remember(&self, key: &[u8], since: Instant, slots: Vec<SlotSeen>) {
        if slots.is_empty() {
            return;
        }
        let mut h = self.hints.lock();
        if h.len() >= HINTS && !h.contains_key(key) {
            h.clear();
        }
        h.insert(key.to_vec(), Hint { since, slots });
    }

    /// A spare block of `len` bytes' size class on every one of `replicas`, taken (all or
    /// none).
    pub(super) fn take_spares(&self, replicas: &[Replica], len: u64) -> Option<Vec<u64>> {
        let mut spares = self.spares.lock();
        let keys: Vec<_> = replicas.iter().map(|r| spare_key(r, len)).collect();
        if !keys
            .iter()
            .all(|k| k.is_some_and(|k| spares.get(&k).is_some_and(|v| !v.is_empty())))
        {
            return None;
        }
        Some(
            keys.iter()
                .flatten()
                .filter_map(|k| spares.get_mut(k).and_then(Vec::pop))
                .collect(),
        )
    }

    /// The positions of `replicas` with fewer than `keep` spare blocks of `len` bytes' size
    /// class (1 for a put alone; a batch keeps as many as it has puts, so that the next
    /// batch of as many puts publishes in one round).
    pub(super) fn lacking_spares(&self, replicas: &[Replica], len: u64, keep: usize) -> Vec<usize> {
        let spares = self.spares.lock();
        replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                spare_key(r, len).is_some_and(|k| spares.get(&k).is_none_or(|v| v.len() < keep))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Keeps `blocks` (on `replicas`' nodes, for puts of `len` bytes) as spares.
    pub(super) fn keep_spares(&self, replicas: &[Replica], len: u64, blocks: &[BlockAt]) {
        let mut spares = self.spares.lock();
        for &(node, at) in blocks {
            let Some(r) = replicas.iter().find(|r| r.node == node) else {
                continue;
            };
            if let Some(k) = spare_key(r, len) {
                spares.entry(k).or_default().push(at);
            }
        }
        // Spares on an incarnation that is gone are gone with it.
        spares.retain(|&(node, inc, _), v| {
            !v.is_empty()
                && replicas
                    .iter()
                    .all(|r| r.node != node || r.incarnation == inc)
        });
    }

    /// The lock this client's puts of `key` take.
    pub(super) fn put_lock(&self, key: &[u8]) -> &tokio::sync::Mutex<()> {
        &self.put_locks[Self::put_lock_index(key)]
    }

    /// Which of the put locks is `key`'s (a batch takes each of its keys' once, in order).
    pub(super) fn put_lock_index(key: &[u8]) -> usize {
        crate::format::KeyHash::of(key).0 as usize % PUT_LOCKS
    }

    /// Whether a put of `kind` may publish from a hint and take spares: a value, not a
    /// remove (it must know whether there is anything to remove), a manifest or a part.
    pub(super) fn saves_rounds(kind: Kind) -> bool {
        kind == Kind::Value
    }
}

/// Where a spare for a block of `len` bytes on `r` is kept: node, incarnation, size class.
fn spare_key(r: &Replica, len: u64) -> Option<(u32, u64, u64)> {
    size_class(len, r.layout.chunk_size).map(|c| (r.node, r.incarnation, c))
}
