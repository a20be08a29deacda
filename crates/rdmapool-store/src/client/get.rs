//! Get, and what looks a key up ([`Store::get`], [`Store::get_into`], [`Store::exists`],
//! [`Store::locate`], [`Store::list`]): the `Get` machine's steps on the pool with the fence
//! words read beside the first round, where this client last saw each key (hints), and
//! the zero-copy get: a get into the caller's registered memory finds the key's candidate
//! blocks by their headers alone (bucket, then header and key of each candidate), then
//! READs the newest one's value straight into the caller's buffer and verifies it there; a
//! copy that fails its checksum is skipped for the next.

use super::{check_user_key, digest_of, stripe, Located, Purpose, Store};
use crate::format::{decode_split, peek, value_len, Kind, Version, HEADER_LEN};
use crate::get::Get;
use crate::lookup::{Looked, Replica, Src};
use crate::lookup::{Lookup, Read};
use crate::put::SlotSeen;
use crate::stripe::Manifest;
use futures_util::future::join_all;
use rdmapool_pool::fabric::{Mr, RegisteredMemory, Shared};
use rdmapool_pool::remote::step::{Answer, Io, Machine, Op, Step};
use rdmapool_pool::remote::RemotePtr;
use rdmapool_pool::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// How many lookups a get makes before it reports a key whose copies all fail their
/// checksum as damaged (the first may have raced a reuse after the grace period).
const DAMAGED_LOOKS: u32 = 3;
/// How many times a get starts again when what it found changed under it.
const ROUNDS: u32 = 8;
/// Parts read at once.
const PARTS_AT_ONCE: usize = 8;

/// A key's block as its header says, before its value is read.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    node: u32,
    incarnation: u64,
    /// The slot naming it in the key's bucket there, and the slot's word.
    slot: usize,
    word: u64,
    at: u64,
    version: Version,
    kind: Kind,
    value_len: u64,
}

/// What reading a candidate's value into the caller's buffer gave.
enum Into {
    /// The value, verified: its length, CRC-32 and version.
    Read(usize, u32, Version),
    /// The newest verified block is not of the kind looked for (a tombstone, or a
    /// manifest where a part was expected).
    Other(Kind),
    /// The newest verified value, of this version, has expired (docs/STORE.md section 11).
    Expired(Version),
}

impl Store {
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
        let out = self.beside_frees(self.get_value(key)).await?;
        self.count_get(key, out.is_some());
        self.after_gets(&[key], [out.is_some()]).await;
        Ok(out)
    }

    /// The newest verified block of `key` on its replicas, read whole, if any (a
    /// tombstone too).
    pub(super) async fn get_block(&self, key: &[u8]) -> Result<Option<stripe::BlockRead>> {
        // One future, the lookups in a loop (not a future per lookup, which a retry wrapper
        // would move into place on every get).
        let mut attempt = 1;
        let mut views = 0;
        'lookup: loop {
            let number = self.placing_view().await?.number;
            let (replicas, missing) = self.replicas(key, self.cfg.replicas, Purpose::Read).await?;
            let since = Instant::now();
            let mut g = Get::hinted(key, &replicas, &self.hints_of(key)).missing(missing);
            let mut answers: Vec<Answer> = Vec::new();
            let mut first = true;
            loop {
                match g
                    .advance(&mut (), Instant::now(), &answers)
                    .map(Step::listed)
                {
                    // A reader slower than the grace period finds its block reused under it
                    // (section 8): look again before calling the key damaged.
                    Err(Error::Damaged { .. }) if attempt < DAMAGED_LOOKS => {
                        attempt += 1;
                        continue 'lookup;
                    }
                    Err(e) => return Err(e),
                    Ok(Step::Do(mut ops)) if first => {
                        // The fence words in the first round, each read on a replica's list
                        // after its reads: a newer view in force means this placement may
                        // be stale (docs/STORE.md section 4).
                        first = false;
                        self.counters
                            .get_round_trips
                            .fetch_add(1, Ordering::Relaxed);
                        let asked = ops.len();
                        ops.extend(replicas.iter().map(|r| Op {
                            node: r.node,
                            io: Io::Read {
                                at: crate::view::VIEW_AT,
                                len: 8,
                            },
                        }));
                        let mut a = self.perform(&replicas, &ops).await?;
                        let fences: Vec<Option<u64>> = a
                            .split_off(asked)
                            .iter()
                            .map(|f| f.bytes().map(|_| f.word()))
                            .collect();
                        if Self::fenced_out(&fences, number) {
                            self.counters.fenced.fetch_add(1, Ordering::Relaxed);
                            views += 1;
                            if views >= super::put::VIEW_ROUNDS {
                                return Err(Error::Contended {
                                    what: "store get across view changes",
                                    rounds: views,
                                });
                            }
                            self.reload_view().await?;
                            continue 'lookup;
                        }
                        answers = a;
                    }
                    Ok(Step::Do(ops)) => {
                        self.counters
                            .get_round_trips
                            .fetch_add(1, Ordering::Relaxed);
                        answers = self.perform(&replicas, &ops).await?;
                    }
                    Ok(Step::Done(Some((at, f)))) => {
                        self.remember_found(key, &g, since);
                        let b = match at {
                            Src::Read(i) => match answers
                                .get_mut(i)
                                .map(|a| std::mem::replace(a, Answer::Failed))
                            {
                                Some(Answer::Bytes(b)) => b,
                                _ => Vec::new(),
                            },
                            Src::Early(e) => g.take_early(e),
                        };
                        return Ok(Some((b, f.block)));
                    }
                    Ok(Step::Done(None)) => return Ok(None),
                    Ok(Step::One(_) | Step::Sleep(_) | Step::Wait) => answers.clear(),
                }
            }
        }
    }

    /// Whether `key` holds a value (a striped value's parts are not read).
    ///
    /// # Errors
    /// As [`Store::get`].
    pub async fn exists(&self, key: &[u8]) -> Result<bool> {
        check_user_key(key, 1)?;
        let Some((_, b)) = self.beside_frees(self.get_block(key)).await? else {
            return Ok(false);
        };
        if !matches!(b.kind, Kind::Value | Kind::Manifest) {
            return Ok(false);
        }
        if self.expired_for_get(key, b.expiry) {
            self.reclaim_expired(key, b.version).await;
            return Ok(false);
        }
        Ok(true)
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
    async fn locate_any(&self, key: &[u8]) -> Result<Vec<Located>> {
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
            let offset = crate::format::Slot::from_word(f.word).map_or(0, |s| s.offset);
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
                // A removed key, or one whose newest value expired, is not listed.
                let gone = e.kind == Kind::Tombstone || self.is_expired(e.expiry);
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

    /// The value of `key` READ straight into `out` from its start, with no copy on this
    /// host (the CPU reads the bytes once, to verify the checksum): its length, or `None`
    /// when the key holds none. Bytes of `out` past the value's length may be overwritten.
    ///
    /// # Errors
    /// As [`Store::get`]; [`Error::OutOfBounds`] when the value is longer than `out`
    /// (nothing read).
    pub async fn get_into(&self, key: &[u8], out: &Mr<Shared>) -> Result<Option<usize>> {
        check_user_key(key, 1)?;
        let got = self
            .beside_frees(async {
                match self.get_into_from_hints(&[key], &[out]).await[0] {
                    Some(n) => Ok(Some(n)),
                    None => self.get_into_looked_up(key, out).await,
                }
            })
            .await?;
        self.count_get(key, got.is_some());
        self.after_gets(&[key], [got.is_some()]).await;
        Ok(got)
    }

    /// Counts a get of `key` that found a value (a hit) or none (a miss), in this client's
    /// counters and on the key's first replica's (`counts.rs`).
    pub(super) fn count_get(&self, key: &[u8], hit: bool) {
        let (counter, on_server) = if hit {
            (&self.counters.hits, super::counts::Counted::Hit)
        } else {
            (&self.counters.misses, super::counts::Counted::Miss)
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.count_for_key(key, on_server);
    }

    /// [`Store::get_into`] by a lookup in rounds: buckets, the candidates' headers, then
    /// the newest one's value into `out` (it leaves a hint for the next).
    pub(super) async fn get_into_looked_up(
        &self,
        key: &[u8],
        out: &Mr<Shared>,
    ) -> Result<Option<usize>> {
        for _ in 0..ROUNDS {
            let since = Instant::now();
            let cands = self.candidates(key).await?;
            match self.read_into(key, &cands, Kind::Value, out, 0).await? {
                None | Some(Into::Other(Kind::Tombstone)) => return Ok(None),
                Some(Into::Expired(version)) => {
                    self.reclaim_expired(key, version).await;
                    return Ok(None);
                }
                Some(Into::Read(n, _, version)) => {
                    // Where the value is, for the next get into memory in one round.
                    let slots = cands
                        .iter()
                        .filter(|c| c.version == version)
                        .map(|c| SlotSeen {
                            node: c.node,
                            slot: c.slot,
                            word: c.word,
                            version,
                            kind: c.kind,
                        })
                        .collect();
                    self.remember(key, since, slots);
                    return Ok(Some(n));
                }
                Some(Into::Other(Kind::Manifest)) => {
                    // Striped: the manifest is small; read it whole, then each part straight
                    // into its place in `out`.
                    let Some((bytes, block)) = self.get_block(key).await? else {
                        return Ok(None);
                    };
                    if block.kind != Kind::Manifest {
                        continue; // replaced meanwhile
                    }
                    if self.expired_for_get(key, block.expiry) {
                        self.reclaim_expired(key, block.version).await;
                        return Ok(None);
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
                    Some(Into::Read(n, crc, _)) if n == m.range(i).len() && crc == m.crcs[i] => {}
                    Some(Into::Read(..)) => {
                        return Err(self.damaged(key, &format!("part {i} is not the manifest's")))
                    }
                    None | Some(Into::Other(_) | Into::Expired(_)) => return Ok(false),
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
            if views >= super::put::VIEW_ROUNDS {
                return Err(Error::Contended {
                    what: "store get into a buffer across view changes",
                    rounds: views,
                });
            }
            self.reload_view().await?;
        };
        self.counters
            .get_round_trips
            .fetch_add(1, Ordering::Relaxed);
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
        if !reads.is_empty() {
            self.counters
                .get_round_trips
                .fetch_add(1, Ordering::Relaxed);
        }
        let mut out = Vec::new();
        for (k, (r, bytes)) in reads.iter().zip(&heads).enumerate() {
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
            let Some((slot, word)) = lookup.read_slot(k) else {
                continue;
            };
            if p.key == key {
                out.push(Candidate {
                    node: r.node,
                    incarnation: rep.incarnation,
                    slot,
                    word,
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
            self.counters
                .get_round_trips
                .fetch_add(1, Ordering::Relaxed);
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
                    if self.expired_for_get(key, b.expiry) {
                        return Ok(Some(Into::Expired(b.version)));
                    }
                    return Ok(Some(Into::Read(
                        c.value_len as usize,
                        digest.crc(),
                        c.version,
                    )));
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

    pub(super) fn damaged(&self, key: &[u8], reason: &str) -> Error {
        Error::Damaged {
            key: String::from_utf8_lossy(key).into_owned(),
            reason: reason.into(),
        }
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
