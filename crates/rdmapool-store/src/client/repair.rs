//! Scanning the nodes' indexes ([`Store::list`], [`Store::repair`]) and repair: for every
//! key, its replicas brought to the version kept, and what no longer belongs cleared
//! (docs/STORE.md section 7; the decisions are `rdmapool-store/src/repair.rs`'s).

use super::{Source, Store};
use crate::format::{decode_block, peek, Kind, Slot, ValueDigest, HEADER_LEN, MAX_KEY_LEN};
use crate::lookup::Replica;
use crate::put::Put;
use crate::repair::{by_key, keep, plan_moving, targets, Entry};
use crate::timing::TombstoneRule;
use crate::Version;
use futures_util::future::join_all;
use rdmapool_pool::remote::regions::RegionNode;
use rdmapool_pool::Result;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// What a [`Store::repair`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Live nodes scanned.
    pub nodes: usize,
    /// Keys found (removed ones included: their tombstones are repaired too).
    pub keys: usize,
    /// Replicas written: a block copied to one of its key's replicas that had none sound.
    pub copied: usize,
    /// Index slots cleared: older versions, damaged copies, duplicates, and entries on
    /// nodes that are no longer among their key's replicas (their blocks are freed after
    /// the grace period).
    pub cleared: usize,
    /// Keys with no sound block of the version to keep (every copy of it damaged): left
    /// as they are.
    pub unreadable: usize,
    /// Keys whose copy failed (a replica went down meanwhile): run the repair again.
    pub failed: usize,
    /// Keys one of whose replicas is a member that is down: copied onto the replicas that
    /// are up and lack the version kept, nothing of theirs cleared (the member may still
    /// hold a newer version, or an older one a clear would let come back); repaired in
    /// full once it answers again or leaves the membership.
    pub deferred: usize,
    /// Entries naming a newer version than their key's replicas hold, on nodes that are
    /// not its replicas (written under another membership): left as they are.
    pub conflicts: usize,
    /// Blocks freed in the chunks of writers that hold no lease any more: allocated, and
    /// named by no index slot in this repair and the last one, at least twice the grace
    /// period before (docs/STORE.md section 8).
    pub reclaimed: usize,
    /// Chunks of such writers given back to the pool (left empty, or never formatted).
    pub released: usize,
    /// Blocks found unnamed in such chunks for the first time: the next repair, at least
    /// twice the grace period from now, frees those it finds so again.
    pub reclaim_pending: usize,
    /// Index slots of removed keys cleared: tombstones on each of their replicas and
    /// nowhere else, found so by this client's repairs at least
    /// [`StoreConfig::tombstone_hold`](super::StoreConfig::tombstone_hold) apart.
    pub tombstones_cleared: usize,
    /// Keys whose newest value had expired: replaced with a tombstone, its space freed
    /// after the grace period, as a reader would (docs/STORE.md section 11).
    pub expired: usize,
}

impl RepairReport {
    /// Whether the repair left nothing behind: no key failed, deferred or unreadable (a
    /// view change settles only after such a repair).
    pub fn clean(&self) -> bool {
        self.failed + self.deferred + self.unreadable == 0
    }
}

/// Keys a repair found removed and clean: the tombstone's version, and since when.
pub(super) type Tombstones = HashMap<Vec<u8>, (Version, Instant)>;

/// Keys repaired at once.
const KEYS_AT_ONCE: usize = 16;

impl Store {
    /// Every occupied slot of `n`'s index, with the header and key of the block it names
    /// (slots naming memory outside the data area, or no block, are left out), and the
    /// offset every occupied slot names (all of them).
    pub(super) async fn scan(&self, n: &RegionNode) -> Result<(Vec<Entry>, HashSet<u64>)> {
        const PIECE: u64 = 1 << 20;
        let ix = self.index(n).await?;
        let total = ix.buckets * 64;
        let mut words = Vec::with_capacity(total as usize / 8);
        let mut at = 0;
        while at < total {
            let len = PIECE.min(total - at);
            let bytes = self
                .pool
                .regions()
                .read(n.node, n.incarnation, ix.start + at, len)
                .await?;
            words.extend(
                bytes
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))),
            );
            at += len;
        }
        let named: HashSet<u64> = words
            .iter()
            .filter_map(|&w| Slot::from_word(w))
            .map(|s| s.offset)
            .collect();
        let slots: Vec<(u64, Slot)> = words
            .iter()
            .enumerate()
            .filter_map(|(i, &w)| Slot::from_word(w).map(|s| (ix.start + 8 * i as u64, s)))
            .filter(|(_, s)| n.layout.chunk_of(s.offset).is_some())
            .collect();
        let heads = join_all(slots.iter().map(|(_, s)| {
            let len = s
                .read_len()
                .min(HEADER_LEN as u64 + MAX_KEY_LEN as u64)
                .min(self.room(n, s));
            self.pool
                .regions()
                .read(n.node, n.incarnation, s.offset, len)
        }))
        .await;
        let mut out = Vec::new();
        for ((at, s), head) in slots.iter().zip(heads) {
            let Some(p) = peek(&head?) else { continue };
            out.push(Entry {
                node: n.node,
                at: *at,
                word: s.word(),
                key: p.key,
                version: p.version,
                kind: p.kind,
                expiry: p.expiry,
            });
        }
        Ok((out, named))
    }

    /// Bytes from the slot's block to the end of its chunk.
    pub(super) fn room(&self, n: &RegionNode, s: &Slot) -> u64 {
        n.layout
            .chunk_of(s.offset)
            .map_or(0, |c| n.layout.chunk(c) + n.layout.chunk_size - s.offset)
    }

    /// Brings every key to [`StoreConfig::replicas`](super::StoreConfig::replicas) copies
    /// of its version on its replicas (the top `r` live servers), and clears what no longer
    /// belongs: older versions, damaged copies and duplicates, and the entries on servers
    /// that are not the key's replicas any more (rebalancing after a server joined). Run it
    /// after a server left or joined, or at any time; it is safe beside running puts, gets
    /// and removes (every change is a copy that never replaces a newer version, or a
    /// compare-and-swap of a slot from the word scanned).
    ///
    /// Not one-sided-cheap: it READs every live node's whole index, the header and key of
    /// every block, and every block of each key's kept version.
    ///
    /// # Errors
    /// [`Error::NodeDown`](rdmapool_pool::Error::NodeDown) when a live node's index could not be
    /// read (nothing was changed); a key whose copy fails is counted in
    /// [`RepairReport::failed`] instead.
    pub async fn repair(&self) -> Result<RepairReport> {
        let placing = self.reload_view().await?;
        let view = self.pool.regions().members();
        if let Some((addr, why)) = view.unreached.first().filter(|_| placing.number == 0) {
            return Err(rdmapool_pool::Error::MemberUnreached {
                addr: addr.to_string(),
                reason: why.clone(),
            });
        }
        // Keys are placed over the view's members, or with none set over every member
        // (section 4); every joined server that is up is scanned.
        let members: Vec<u32> = if placing.number == 0 {
            view.nodes.iter().map(|n| n.node).collect()
        } else {
            placing.members.clone()
        };
        let previous = placing.previous.clone();
        let down: Vec<u32> = view
            .nodes
            .iter()
            .filter(|n| !n.up)
            .map(|n| n.node)
            .collect();
        let nodes: Vec<RegionNode> = view.nodes.into_iter().filter(|n| n.up).collect();
        let mut entries = Vec::new();
        let mut named = HashMap::new();
        for n in &nodes {
            let (es, offsets) = self.scan(n).await?;
            entries.extend(es);
            named.insert(n.node, offsets);
        }
        let keys: Vec<(Vec<u8>, Vec<Entry>)> = by_key(entries).into_iter().collect();
        // Tombstones a past repair found clean, and when (this repair keeps those it finds
        // clean again and has not cleared).
        let seen: Tombstones = std::mem::take(&mut *self.tombstones.lock());
        let mut report = RepairReport {
            nodes: nodes.len(),
            keys: keys.len(),
            ..RepairReport::default()
        };
        for batch in keys.chunks(KEYS_AT_ONCE) {
            let done = join_all(batch.iter().map(|(key, es)| {
                self.repair_key(&nodes, (&members, &previous), &down, key, es, &seen)
            }))
            .await;
            for d in done {
                report.copied += d.copied;
                report.cleared += d.cleared;
                report.unreadable += d.unreadable;
                report.failed += d.failed;
                report.deferred += d.deferred;
                report.conflicts += d.conflicts;
                report.tombstones_cleared += d.tombstones_cleared;
                report.expired += d.expired;
            }
        }
        if report.failed + report.deferred + report.unreadable == 0 && down.is_empty() {
            self.pool.regions().settle_departed();
        }
        let r = self.reclaim(&nodes, &named).await?;
        report.reclaimed = r.freed;
        report.released = r.released;
        report.reclaim_pending = r.pending;
        Ok(report)
    }

    /// Repairs one key: `nodes` are the members that are up (scanned), `members` all of
    /// them, `down` those that are not up.
    async fn repair_key(
        &self,
        nodes: &[RegionNode],
        (members, previous): (&[u32], &[u32]),
        down: &[u32],
        key: &[u8],
        entries: &[Entry],
        seen: &Tombstones,
    ) -> RepairReport {
        let mut out = RepairReport::default();
        let targets = targets(key, members, self.cfg.replicas);
        // While data moves, gets read the previous placement too: keep what they read.
        let mut readable = targets.clone();
        for id in crate::repair::targets(key, previous, self.cfg.replicas) {
            if !readable.contains(&id) {
                readable.push(id);
            }
        }
        let waiting = targets.iter().any(|t| down.contains(t));
        if self.cfg.cache.is_some() && !entries.iter().any(|e| readable.contains(&e.node)) {
            // A cache never brings back what none of a key's replicas holds: a key evicted
            // there stays a miss, and its copies elsewhere (older, maybe) go (section 12).
            if !waiting {
                out.cleared = self.clear(nodes, key, entries.iter()).await;
            }
            return out;
        }
        let Some(version) = keep(entries, &readable) else {
            return out;
        };

        let node_of = |id: u32| nodes.iter().find(|n| n.node == id);
        // Read every block of the kept version whole, and verify it.
        let blocks = join_all(entries.iter().map(|e| async move {
            let n = node_of(e.node)?;
            let s = Slot::from_word(e.word)?;
            if e.version != version {
                return None;
            }
            let len = s.read_len().min(self.room(n, &s));
            let bytes = self
                .pool
                .regions()
                .read(n.node, n.incarnation, s.offset, len)
                .await
                .ok()?;
            let block = decode_block(&bytes, key).ok()?;
            (block.version == version).then_some((bytes, block))
        }))
        .await;
        // An expired value (its expiry read from a copy that verifies) is not copied: it is
        // replaced with a tombstone, as its first reader would, and the next repair treats
        // that as a remove's.
        if blocks
            .iter()
            .flatten()
            .any(|(_, b)| self.is_expired(b.expiry))
        {
            self.reclaim_expired(key, version).await;
            out.expired = 1;
            return out;
        }
        let sound: Vec<bool> = blocks.iter().map(Option::is_some).collect();
        let mut p = plan_moving(entries, &sound, &targets, &readable);
        if waiting {
            // A replica is away: copy onto those that are up, clear nothing.
            p.need.retain(|id| !down.contains(id));
            p.clear.clear();
            out.deferred = 1;
        }
        out.conflicts = p.conflicts;
        let clean = !waiting
            && p.kind == Kind::Tombstone
            && p.need.is_empty()
            && p.clear.is_empty()
            && p.conflicts == 0
            && entries.len() == targets.len()
            // A server that is away may hold an older version, which must not come back.
            && self.pool.regions().all_up();
        if clean {
            out.tombstones_cleared = self
                .clear_tombstone(nodes, key, entries, version, seen)
                .await;
            return out;
        }
        let Some((bytes, block)) = p.source.and_then(|i| blocks[i].clone()) else {
            // Under live load a block read long after the scan may have been replaced and,
            // past the grace period, reused: that is no damage. Damaged is what a slot
            // still names unchanged (a block a slot names is never freed).
            if !self.slots_changed(nodes, entries, version).await {
                out.unreadable = 1;
            }
            return out;
        };
        // A cache never copies: a copy of what the scan read could land after a newer put
        // of the key was evicted, and bring an older value back (section 12). A replica
        // without the version stays so; gets read the other, the next put writes both.
        if !p.need.is_empty() && self.cfg.cache.is_none() {
            let mut replicas = Vec::new();
            for id in &p.need {
                let Some(n) = node_of(*id) else { continue };
                match self.replica(n).await {
                    Ok(r) => replicas.push(r),
                    Err(_) => {
                        out.failed = 1;
                        return out;
                    }
                }
            }
            let value = &bytes[block.value.clone()];
            match self
                .copy(key, value, (p.kind, block.expiry), version, &replicas)
                .await
            {
                Ok(copied) => out.copied = copied,
                Err(_) => {
                    out.failed = 1;
                    return out;
                }
            }
        }
        out.cleared = self
            .clear(nodes, key, p.clear.iter().map(|&i| &entries[i]))
            .await;
        out
    }

    /// Whether a slot of `entries` naming `version` no longer holds the word scanned (or
    /// cannot be read now): the key changed under the repair, and the next one sees it.
    async fn slots_changed(
        &self,
        nodes: &[RegionNode],
        entries: &[Entry],
        version: Version,
    ) -> bool {
        let node_of = |id: u32| nodes.iter().find(|n| n.node == id);
        let now = join_all(
            entries
                .iter()
                .filter(|e| e.version == version)
                .map(|e| async move {
                    let n = node_of(e.node)?;
                    let w = self
                        .pool
                        .regions()
                        .read(n.node, n.incarnation, e.at, 8)
                        .await
                        .ok()?;
                    Some(u64::from_le_bytes(w[..8].try_into().ok()?) == e.word)
                }),
        )
        .await;
        now.iter().any(|same| *same != Some(true))
    }

    /// Swaps each of `entries`' slots (of `key`) from the word scanned to 0, and retires
    /// the blocks of those it cleared (a slot changed since the scan is left as it is);
    /// how many it cleared.
    async fn clear<'a>(
        &self,
        nodes: &[RegionNode],
        key: &[u8],
        entries: impl Iterator<Item = &'a Entry>,
    ) -> usize {
        let node_of = |id: u32| nodes.iter().find(|n| n.node == id);
        let cleared = join_all(entries.map(|e| async move {
            let inc = node_of(e.node)?.incarnation;
            let old = self
                .pool
                .regions()
                .cas(e.node, inc, e.at, e.word, 0)
                .await
                .ok()?;
            let at = Slot::from_word(e.word)?.offset;
            (old == e.word).then_some(((e.node, inc, at, e.version), e.word))
        }))
        .await;
        let (cleared, words): (Vec<_>, Vec<u64>) = cleared.into_iter().flatten().unzip();
        self.charge(
            cleared
                .iter()
                .zip(&words)
                .map(|(c, &w)| (c.0, -(crate::format::named_bytes(w) as i64))),
        );
        let n = cleared.len();
        self.retire(key, cleared);
        n
    }

    /// A removed key whose tombstone is on each of its replicas and nowhere else: cleared
    /// (every slot swapped from its word to 0, the blocks retired) if a past repair of this
    /// client found it so, with the same version, at least `StoreConfig::tombstone_hold`
    /// ago; otherwise noted for a later repair. How many slots were cleared.
    async fn clear_tombstone(
        &self,
        nodes: &[RegionNode],
        key: &[u8],
        entries: &[Entry],
        version: Version,
        seen: &Tombstones,
    ) -> usize {
        let rule = crate::timing::tombstone(
            seen.get(key).copied(),
            version,
            Instant::now(),
            self.cfg.tombstone_hold,
        );
        match rule {
            TombstoneRule::Hold { since } => {
                self.tombstones
                    .lock()
                    .insert(key.to_vec(), (version, since));
                0
            }
            TombstoneRule::Clear => self.clear(nodes, key, entries.iter()).await,
        }
    }

    /// Copies `key`'s `version` (its `value`) onto `replicas`; how many took it.
    async fn copy(
        &self,
        key: &[u8],
        value: &[u8],
        (kind, expiry): (Kind, crate::format::Expiry),
        version: crate::Version,
        replicas: &[Replica],
    ) -> Result<usize> {
        let mut put =
            Put::copy(key, ValueDigest::of(value), kind, version, replicas)?.expiring(expiry)?;
        match self.run_put(&mut put, replicas, Source::Bytes(value)).await {
            Ok(done) => {
                self.charge(done.named_bytes.iter().copied());
                self.retire_replaced(key, replicas, &done.replaced);
                self.free_now(replicas, &done.unused).await;
                Ok(replicas.len() - done.unused.len())
            }
            Err(e) => {
                // Blocks no slot names (a swap that won, or may have, leaves its own).
                self.free_now(replicas, &put.allocated()).await;
                Err(e)
            }
        }
    }
}
