//! Striped values on the pool (docs/STORE.md section 9; the formats are `rdmapool-store/src/stripe.rs`):
//! a put writes the parts (several at once, each a put of its own part key, so on the
//! part's own replicas), then the manifest under the object's key; a get reads the
//! manifest, then the parts at once. The parts of a replaced or removed striped version
//! are cleared after the grace period by the client that replaced it.

use super::{Source, Store, Writing};
use crate::decide::candidates;
use crate::format::{peek, Block, Expiry, KeyHash, Kind, Version};
use crate::lookup::Replica;
use crate::stripe::{Manifest, PART_KEY_LEN, PART_OVERHEAD};
use futures_util::future::join_all;
use rdmapool_pool::fabric::{Mr, RegisteredMemory};
use rdmapool_pool::{Error, Result};
use std::sync::Arc;
use std::time::Instant;

/// Parts put or read at once by one call.
const PARTS_AT_ONCE: usize = 8;
/// How many times a get starts again when a striped value's parts vanished under it
/// (the value was replaced and the parts cleared after the grace period).
const GET_ROUNDS: u32 = 8;

impl Store {
    /// The most bytes one block may have here: the configured part size, or less if some
    /// live server's chunks hold no block that large.
    pub(super) fn block_limit(&self) -> u64 {
        let smallest = self
            .pool
            .regions()
            .up_nodes()
            .iter()
            .map(|n| rdmapool_pool::remote::layout::largest_object(n.layout.chunk_size))
            .min();
        smallest.map_or(self.cfg.part_size, |s| s.min(self.cfg.part_size))
    }

    /// Puts `value` as parts and a manifest under `key` (the parts as large as
    /// [`Store::block_limit`] allows).
    pub(super) async fn put_striped(
        &self,
        key: &[u8],
        value: Source<'_>,
        replicas: usize,
        meta: (Expiry, crate::format::Pin),
    ) -> Result<Version> {
        let part_len = self.block_limit().saturating_sub(PART_OVERHEAD).max(1);
        let nonce = rdmapool_core::util::random_nonzero()?;
        let writer = self.pool.client_id();
        // Each part as a source of its own: a slice, or a view of the caller's region.
        let (m, views) = match value {
            Source::Bytes(b) => (Manifest::new(b, part_len, writer, nonce), Vec::new()),
            Source::Mr(region) => {
                let count = (region.len() as u64).div_ceil(part_len) as usize;
                let mut m = Manifest {
                    total: region.len() as u64,
                    part_len,
                    writer,
                    nonce,
                    crcs: Vec::with_capacity(count),
                };
                let whole = Arc::new(region.clone());
                let mut views = Vec::with_capacity(count);
                for i in 0..count {
                    let r = m.range(i);
                    m.crcs
                        .push(super::digest_of(region, r.start, r.len())?.crc());
                    views.push(Mr::share_range(&whole, r.start, r.len())?);
                }
                (m, views)
            }
        };
        let part = |i: usize| match value {
            Source::Bytes(b) => Source::Bytes(&b[m.range(i)]),
            Source::Mr(_) => Source::Mr(&views[i]),
        };
        let keys = m.part_keys(key);
        let mut failure = None;
        let mut tried = 0;
        for batch in (0..keys.len()).collect::<Vec<_>>().chunks(PARTS_AT_ONCE) {
            let done = join_all(
                batch
                    .iter()
                    .map(|&i| self.write(&keys[i], part(i), Writing::kind(Kind::Part), replicas)),
            )
            .await;
            tried += batch.len();
            if let Some(e) = done.into_iter().find_map(|r| r.err()) {
                failure = Some(e);
                break;
            }
        }
        if let Some(e) = failure {
            // No manifest names these parts: clear them now.
            self.clear_keys(&keys[..tried]).await;
            return Err(e);
        }
        let (r, published) = self
            .write_published(
                key,
                Source::Bytes(&m.encode()),
                Writing::kind(Kind::Manifest).with(meta),
                replicas,
            )
            .await;
        match r {
            Ok(done) => done.version.ok_or_else(|| Error::Damaged {
                key: String::from_utf8_lossy(key).into_owned(),
                reason: "a put ended without a version".into(),
            }),
            Err(e) => {
                if !published {
                    self.clear_keys(&keys).await;
                }
                Err(e)
            }
        }
    }

    /// The value a manifest names, read from its parts at once; `None` when a part is gone
    /// (the value was replaced meanwhile: the caller reads the key again).
    async fn read_parts(&self, key: &[u8], m: &Manifest) -> Result<Option<Vec<u8>>> {
        let keys = m.part_keys(key);
        let mut out = vec![0u8; m.total as usize];
        let damaged = |reason: String| Error::Damaged {
            key: String::from_utf8_lossy(key).into_owned(),
            reason,
        };
        for batch in (0..keys.len()).collect::<Vec<_>>().chunks(PARTS_AT_ONCE) {
            let got = join_all(batch.iter().map(|&i| self.get_block(&keys[i]))).await;
            for (&i, r) in batch.iter().zip(got) {
                let Some((bytes, block)) = r? else {
                    return Ok(None);
                };
                let part = bytes.get(block.value.clone()).unwrap_or_default();
                let range = m.range(i);
                if block.kind != Kind::Part || part.len() != range.len() {
                    return Err(damaged(format!("part {i} is not the manifest's")));
                }
                if crc32fast::hash(part) != m.crcs[i] {
                    return Err(damaged(format!(
                        "part {i}'s checksum is not the manifest's"
                    )));
                }
                out[range].copy_from_slice(part);
            }
        }
        Ok(Some(out))
    }

    /// The value of `key`: its block's, or its parts' for a striped value.
    pub(super) async fn get_value(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        for _ in 0..GET_ROUNDS {
            let Some((mut bytes, block)) = self.get_block(key).await? else {
                return Ok(None);
            };
            if self.expired_for_get(key, block.expiry) {
                self.reclaim_expired(key, block.version).await;
                return Ok(None);
            }
            match block.kind {
                Kind::Value => {
                    bytes.truncate(block.value.end);
                    bytes.drain(..block.value.start);
                    return Ok(Some(bytes));
                }
                Kind::Manifest => {
                    let m = bytes
                        .get(block.value.clone())
                        .and_then(Manifest::decode)
                        .ok_or_else(|| Error::Damaged {
                            key: String::from_utf8_lossy(key).into_owned(),
                            reason: "its manifest does not decode".into(),
                        })?;
                    if let Some(v) = self.read_parts(key, &m).await? {
                        return Ok(Some(v));
                    }
                }
                Kind::Tombstone | Kind::Part => return Ok(None),
            }
        }
        Err(Error::Contended {
            what: "store get of a striped value",
            rounds: GET_ROUNDS,
        })
    }

    /// Queues the parts of `manifests` (values of striped versions of `key` a put
    /// superseded) to be cleared at `due`.
    pub(super) fn retire_parts(&self, due: Instant, key: &[u8], manifests: &[Vec<u8>]) {
        let mut q = self.retired_parts.lock();
        for m in manifests.iter().filter_map(|m| Manifest::decode(m)) {
            q.extend(m.part_keys(key).into_iter().map(|k| (due, k)));
        }
    }

    /// Clears every slot of each of `keys` (part keys, which no put writes twice) on every
    /// live node, and frees their blocks: a bucket READ per node, then the header and key
    /// of each candidate, then a compare-and-swap of each slot that names the key to 0.
    /// Best effort: a node that does not answer keeps its copy (repair then keeps it too).
    pub(super) async fn clear_keys(&self, keys: &[Vec<u8>]) -> usize {
        let mut replicas = Vec::new();
        for n in self.pool.regions().up_nodes() {
            if let Ok(r) = self.replica(&n).await {
                replicas.push(r);
            }
        }
        let mut cleared = 0;
        for batch in keys.chunks(PARTS_AT_ONCE) {
            let done = join_all(batch.iter().flat_map(|k| {
                replicas
                    .iter()
                    .map(move |r| self.clear_key_on(r, k.as_slice()))
            }))
            .await;
            cleared += done.iter().sum::<usize>();
        }
        cleared
    }

    async fn clear_key_on(&self, r: &Replica, key: &[u8]) -> usize {
        let h = KeyHash::of(key);
        let bucket = r.bucket_at(h);
        let Ok(bytes) = self
            .pool
            .regions()
            .read(r.node, r.incarnation, bucket, 64)
            .await
        else {
            return 0;
        };
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
            .collect();
        let mut cleared = 0;
        for (slot, s) in candidates(h, &words) {
            if r.layout.chunk_of(s.offset).is_none() {
                continue;
            }
            let head_len = (super::super::format::HEADER_LEN + PART_KEY_LEN) as u64;
            let Ok(head) = self
                .pool
                .regions()
                .read(r.node, r.incarnation, s.offset, head_len)
                .await
            else {
                continue;
            };
            if peek(&head).is_none_or(|p| p.key != key) {
                continue;
            }
            let at = bucket + 8 * slot as u64;
            let word = s.word();
            let swapped = self
                .pool
                .regions()
                .cas(r.node, r.incarnation, at, word, 0)
                .await;
            if swapped.is_ok_and(|old| old == word) {
                cleared += 1;
                self.charge([(r.node, -(crate::format::named_bytes(word) as i64))]);
                let _ = self
                    .pool
                    .regions()
                    .free(r.node, r.incarnation, s.offset)
                    .await;
            }
        }
        cleared
    }

    /// Clears the queued parts whose time has come; how many slots.
    pub(super) async fn flush_parts(&self) -> usize {
        let now = Instant::now();
        let due: Vec<Vec<u8>> = {
            let mut q = self.retired_parts.lock();
            let n = q.iter().take_while(|(t, _)| now >= *t).count();
            q.drain(..n).map(|(_, k)| k).collect()
        };
        if due.is_empty() {
            return 0;
        }
        self.clear_keys(&due).await
    }
}

/// A verified block read whole: its bytes and where its value is in them.
pub(super) type BlockRead = (Vec<u8>, Block);
