//! Zero-copy put and get ([`Store::put_from`], [`Store::get_into`]): values WRITten
//! straight from, and READ straight into, the caller's registered memory. The block's
//! header and key go through a small staging buffer beside the value's own transfer (two
//! operations at once on the node's connection), and the checksum is computed over the
//! caller's bytes where they are.
//!
//! A get finds the key's candidate blocks by their headers alone (bucket, then header and
//! key of each candidate), then READs the newest one's value into the caller's buffer and
//! verifies it; a copy that fails its checksum is skipped for the next.

use super::{check_user_key, digest_of, Source, Store};
use crate::format::{block_len, decode_split, peek, value_len, Kind, Version, HEADER_LEN};
use crate::lookup::{Lookup, Read};
use crate::stripe::Manifest;
use futures_util::future::join_all;
use rdmapool_pool::fabric::{Mr, RegisteredMemory, Shared};
use rdmapool_pool::{CoreError, Error, Result};
use std::sync::atomic::Ordering;

/// How many times a get starts again when what it found changed under it.
const ROUNDS: u32 = 8;
/// Parts read at once.
const PARTS_AT_ONCE: usize = 8;

/// A key's block as its header says, before its value is read.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    node: u32,
    incarnation: u64,
    at: u64,
    version: Version,
    kind: Kind,
    value_len: u64,
}

/// What reading a candidate's value into the caller's buffer gave.
enum Into {
    /// The value, verified: its length and CRC-32.
    Read(usize, u32),
    /// The newest verified block is not of the kind looked for (a tombstone, or a
    /// manifest where a part was expected).
    Other(Kind),
}

impl Store {
    /// [`Store::put`] of the bytes of `value`, a registered view (e.g.
    /// [`Mr::share`]/[`Mr::share_range`] of a region of this client's protection domain):
    /// every replica's block (or every part, for a striped value) is WRITten straight from
    /// `value`'s memory, with no copy on this host; the CPU reads the bytes once, for the
    /// checksum. `value` must not change until the put returns.
    ///
    /// # Errors
    /// As [`Store::put`].
    pub async fn put_from(&self, key: &[u8], value: &Mr<Shared>) -> Result<Version> {
        self.put_source(key, Source::Mr(value), self.cfg.replicas)
            .await
    }

    /// The value of `key` READ straight into `out` from its start, with no copy on this
    /// host (the CPU reads the bytes once, to verify the checksum): its length, or `None`
    /// when the key holds none. Bytes of `out` past the value's length may be overwritten.
    ///
    /// # Errors
    /// As [`Store::get`]; [`Error::OutOfBounds`] when the value is longer than `out`
    /// (nothing read).
    pub async fn get_into(&self, key: &[u8], out: &Mr<Shared>) -> Result<Option<usize>> {
        check_user_key(key, 1)?;
        let got = self.get_into_rounds(key, out).await?;
        let counter = if got.is_some() {
            &self.counters.hits
        } else {
            &self.counters.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(got)
    }

    async fn get_into_rounds(&self, key: &[u8], out: &Mr<Shared>) -> Result<Option<usize>> {
        for _ in 0..ROUNDS {
            let cands = self.candidates(key).await?;
            match self.read_into(key, &cands, Kind::Value, out, 0).await? {
                None | Some(Into::Other(Kind::Tombstone)) => return Ok(None),
                Some(Into::Read(n, _)) => return Ok(Some(n)),
                Some(Into::Other(Kind::Manifest)) => {
                    // Striped: the manifest is small; read it whole, then each part straight
                    // into its place in `out`.
                    let Some((bytes, block)) = self.get_block(key).await? else {
                        return Ok(None);
                    };
                    if block.kind != Kind::Manifest {
                        continue; // replaced meanwhile
                    }
                    let m = bytes
                        .get(block.value.clone())
                        .and_then(Manifest::decode)
                        .ok_or_else(|| self.damaged(key, "its manifest does not decode"))?;
                    fits(m.total, out)?;
                    if self.read_parts_into(key, &m, out).await? {
                        return Ok(Some(m.total as usize));
                    }
                }
                Some(Into::Other(_)) => return Ok(None),
            }
        }
        Err(Error::Contended {
            what: "store get into a buffer",
            rounds: ROUNDS,
        })
    }

    /// Each part of `m` READ into its place in `out`, verified against the manifest;
    /// `false` when a part is gone (the value was replaced meanwhile).
    async fn read_parts_into(&self, key: &[u8], m: &Manifest, out: &Mr<Shared>) -> Result<bool> {
        let keys = m.part_keys(key);
        let keys = &keys;
        for batch in (0..keys.len()).collect::<Vec<_>>().chunks(PARTS_AT_ONCE) {
            let got = join_all(batch.iter().map(|&i| async move {
                let cands = self.candidates(&keys[i]).await?;
                self.read_into(&keys[i], &cands, Kind::Part, out, m.range(i).start)
                    .await
            }))
            .await;
            for (&i, r) in batch.iter().zip(got) {
                match r? {
                    Some(Into::Read(n, crc)) if n == m.range(i).len() && crc == m.crcs[i] => {}
                    Some(Into::Read(..)) => {
                        return Err(self.damaged(key, &format!("part {i} is not the manifest's")))
                    }
                    None | Some(Into::Other(_)) => return Ok(false),
                }
            }
        }
        Ok(true)
    }

    /// The key's blocks on its replicas as their headers say, newest first (the primary's
    /// first among equals).
    async fn candidates(&self, key: &[u8]) -> Result<Vec<Candidate>> {
        let mut views = 0;
        let (replicas, mut lookup, buckets) = loop {
            let number = self.placing_view().await?.number;
            let (replicas, _) = self
                .replicas(key, self.cfg.replicas, super::Purpose::Read)
                .await?;
            let lookup = Lookup::new(key, &replicas);
            // The fence words beside the bucket READs (docs/STORE.md section 4).
            let (buckets, fences) = futures_util::future::join(
                self.reads(&replicas, &lookup.bucket_reads()),
                self.fences(&replicas),
            )
            .await;
            if !Self::fenced_out(&fences, number) {
                break (replicas, lookup, buckets);
            }
            self.counters.fenced.fetch_add(1, Ordering::Relaxed);
            views += 1;
            if views >= super::write::VIEW_ROUNDS {
                return Err(Error::Contended {
                    what: "store get into a buffer across view changes",
                    rounds: views,
                });
            }
            self.reload_view().await?;
        };
        if buckets.iter().all(Option::is_none) {
            return Err(Error::NodeDown {
                node: replicas.first().map_or(0, |r| r.node),
                reason: "no replica's bucket could be read".into(),
            });
        }
        let replies: Vec<Option<&[u8]>> = buckets.iter().map(Option::as_deref).collect();
        let head = (HEADER_LEN + key.len()) as u64;
        let reads: Vec<Read> = lookup
            .on_buckets(&replies)
            .into_iter()
            .map(|r| Read {
                len: r.len.min(head),
                ..r
            })
            .collect();
        let heads = self.reads(&replicas, &reads).await;
        let mut out = Vec::new();
        for (r, bytes) in reads.iter().zip(&heads) {
            let Some(bytes) = bytes else {
                return Err(Error::NodeDown {
                    node: r.node,
                    reason: "a candidate block could not be read".into(),
                });
            };
            let (Some(p), Some(len)) = (peek(bytes), value_len(bytes)) else {
                continue;
            };
            let Some(rep) = replicas.iter().find(|x| x.node == r.node) else {
                continue;
            };
            if p.key == key {
                out.push(Candidate {
                    node: r.node,
                    incarnation: rep.incarnation,
                    at: r.at,
                    version: p.version,
                    kind: p.kind,
                    value_len: len,
                });
            }
        }
        let rank = |node: u32| replicas.iter().position(|r| r.node == node);
        out.sort_by_key(|c| (std::cmp::Reverse(c.version), rank(c.node)));
        Ok(out)
    }

    /// The newest candidate of kind `want` READ into `out` at `offset` and verified (a
    /// damaged one skipped for the next); `None` when there is none; [`Into::Other`] when
    /// the newest sound block is of another kind.
    async fn read_into(
        &self,
        key: &[u8],
        cands: &[Candidate],
        want: Kind,
        out: &Mr<Shared>,
        offset: usize,
    ) -> Result<Option<Into>> {
        let mut unread = None;
        for c in cands {
            if c.kind != want {
                return Ok(Some(Into::Other(c.kind)));
            }
            fits(offset as u64 + c.value_len, out)?;
            let head_len = (HEADER_LEN + key.len()) as u64;
            let read = self
                .pool
                .regions()
                .read_into(
                    c.node,
                    c.incarnation,
                    c.at,
                    head_len,
                    out,
                    offset,
                    c.value_len,
                )
                .await;
            let head = match read {
                Ok(h) => h,
                Err(e) => {
                    unread = Some(e);
                    continue;
                }
            };
            let digest = digest_of(out, offset, c.value_len as usize)?;
            match decode_split(&head, key, &digest) {
                Ok(b) if b.version == c.version && b.kind == want => {
                    return Ok(Some(Into::Read(c.value_len as usize, digest.crc())))
                }
                _ => continue, // replaced and reused, torn, or damaged: the next copy
            }
        }
        match unread {
            Some(e) => Err(e),
            None if cands.is_empty() => Ok(None),
            None => Err(self.damaged(key, "no copy of it verifies")),
        }
    }

    fn damaged(&self, key: &[u8], reason: &str) -> Error {
        Error::Damaged {
            key: String::from_utf8_lossy(key).into_owned(),
            reason: reason.into(),
        }
    }

    /// [`Store::put_with`] from a source.
    pub(super) async fn put_source(
        &self,
        key: &[u8],
        value: Source<'_>,
        replicas: usize,
    ) -> Result<Version> {
        check_user_key(key, value.len())?;
        if replicas == 0 {
            return Err(Error::Core(CoreError::OutOfLimits {
                what: "store replicas",
                value: 0,
                min: 1,
                max: u64::MAX,
            }));
        }
        let mut waited = false;
        let version = loop {
            let put = if block_len(key, value.len()) > self.block_limit() {
                self.put_striped(key, value, replicas).await
            } else {
                match self.write(key, value, Kind::Value, replicas).await {
                    Ok(done) => done
                        .version
                        .ok_or_else(|| self.damaged(key, "a put ended without a version")),
                    Err(e) => Err(e),
                }
            };
            // Backpressure: no room, but blocks this client replaced wait out their grace
            // period. Wait for them (at most one grace period), free them, try once more.
            if let Err(Error::RemoteExhausted { .. }) = &put {
                if let (false, Some(due)) = (waited, self.retired_due()) {
                    waited = true;
                    self.counters.waits_for_room.fetch_add(1, Ordering::Relaxed);
                    self.pool.regions().sleep_until(due).await;
                    self.flush_retired().await;
                    continue;
                }
            }
            break put?;
        };
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        Ok(version)
    }
}

/// Whether `len` bytes fit in `out`.
fn fits(len: u64, out: &Mr<Shared>) -> Result<()> {
    if len > out.len() as u64 {
        return Err(Error::OutOfBounds {
            offset: 0,
            len,
            limit: out.len() as u64,
        });
    }
    Ok(())
}
