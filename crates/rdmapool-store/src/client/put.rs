//! Put and remove ([`Store::put`], [`Store::put_with`], [`Store::put_from`],
//! [`Store::put_with_ttl`], [`Store::remove`]): the value's source (bytes, or the caller's registered memory, WRITten
//! from where it is), the `Put` machine's steps performed on the pool, each step's
//! operations on every node at once, the fence check after them and the put made anew under
//! a newer view, and what a finished or failed put leaves to free.

use super::{check_user_key, incarnation, Store};
use crate::format::{block_len, Expiry, Kind, Pin, ValueDigest, Version};
use crate::lookup::Replica;
use crate::put::{Put, PutDone};
use futures_util::future::join_all;
use rdmapool_pool::fabric::{Mr, RegisteredMemory, Shared};
use rdmapool_pool::remote::regions::Payload;
use rdmapool_pool::{CoreError, Error, Result};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Puts made anew after finding the view changed under them, before giving up.
pub(super) const VIEW_ROUNDS: u32 = 8;

/// Times a put into a full cache evicts and waits for room before it fails.
const MAKE_ROOM_TRIES: u32 = 8;

/// No expiry, no pin.
pub(super) const NOTHING: (Expiry, Pin) = (Expiry::NEVER, Pin::None);

/// What settling a put made by [`Store::prepare_put`] needs besides its machine.
#[derive(Debug, Clone, Copy)]
pub(super) struct PutMeta {
    /// Its block's length (the size class of its spares).
    len: u64,
    /// When it was made (the age of what it will remember).
    since: Instant,
}

/// How a value is put beside its bytes ([`Store::put_with_options`]): how long it lives,
/// and whether a cache may evict it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PutOptions {
    /// A time to live (docs/STORE.md section 11); `None`: until replaced or removed.
    pub ttl: Option<Duration>,
    /// Whether a cache may evict it (docs/STORE.md section 12; a durable store keeps the
    /// pin in the block and evicts nothing).
    pub pin: Pin,
}

/// What a write puts: a block of `kind`, expiring at `expiry`, pinned as `pin`; for the
/// reclaim of an expired value or a cache's eviction, only over that value's version.
#[derive(Debug, Clone, Copy)]
pub(super) struct Writing {
    pub(super) kind: Kind,
    pub(super) expiry: Expiry,
    pub(super) pin: Pin,
    /// Write only while this is the key's newest version (and as writer 0).
    pub(super) only_over: Option<Version>,
}

impl Writing {
    /// A block of `kind` that does not expire, unpinned.
    pub(super) fn kind(kind: Kind) -> Self {
        Self {
            kind,
            expiry: Expiry::NEVER,
            pin: Pin::None,
            only_over: None,
        }
    }

    /// The same, expiring at `expiry` and pinned as `pin`.
    pub(super) fn with(self, (expiry, pin): (Expiry, Pin)) -> Self {
        Self {
            expiry,
            pin,
            ..self
        }
    }
}

impl Store {
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
    /// [`StoreConfig::replicas`](super::StoreConfig::replicas) (a get reads as many replicas as the store is configured
    /// for, so a version put with fewer survives fewer failures).
    ///
    /// # Errors
    /// As [`Store::put`]; [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) for 0
    /// replicas.
    pub async fn put_with(&self, key: &[u8], value: &[u8], replicas: usize) -> Result<Version> {
        self.put_source(key, Source::Bytes(value), replicas, NOTHING)
            .await
    }

    /// [`Store::put`] of a value that lives for `ttl`: once that has passed, gets, exists
    /// and listings treat the key as absent (the version stays the newest: an older value
    /// never comes back). The end is this client's wall clock plus `ttl`; readers take it
    /// as passed [`StoreConfig::clock_skew`](super::StoreConfig::clock_skew) early
    /// (docs/STORE.md section 11).
    ///
    /// ```no_run
    /// # async fn f(store: &rdmapool_store::Store) -> rdmapool_pool::Result<()> {
    /// use std::time::Duration;
    /// store.put_with_ttl(b"session:7", b"token", Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Store::put`]; [`CoreError::OutOfLimits`] for a `ttl` not longer than the clock
    /// skew (0 among them) or one whose end does not fit 64-bit milliseconds (nothing is
    /// written).
    pub async fn put_with_ttl(&self, key: &[u8], value: &[u8], ttl: Duration) -> Result<Version> {
        let expiry = self.expiry_after(ttl)?;
        self.put_source(
            key,
            Source::Bytes(value),
            self.cfg.replicas,
            (expiry, Pin::None),
        )
        .await
    }

    /// [`Store::put_from`] of a value that lives for `ttl` ([`Store::put_with_ttl`]).
    ///
    /// # Errors
    /// As [`Store::put_with_ttl`].
    pub async fn put_from_with_ttl(
        &self,
        key: &[u8],
        value: &Mr<Shared>,
        ttl: Duration,
    ) -> Result<Version> {
        let expiry = self.expiry_after(ttl)?;
        self.put_source(
            key,
            Source::Mr(value),
            self.cfg.replicas,
            (expiry, Pin::None),
        )
        .await
    }

    /// [`Store::put`] with `options`: a time to live, a pin (docs/STORE.md sections 11
    /// and 12).
    ///
    /// ```no_run
    /// # async fn f(store: &rdmapool_store::Store) -> rdmapool_pool::Result<()> {
    /// use rdmapool_store::{Pin, PutOptions};
    /// let pinned = PutOptions { pin: Pin::Hard, ..PutOptions::default() };
    /// store.put_with_options(b"model:weights:0", b"...", pinned).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Store::put_with_ttl`]; in cache mode, [`CoreError::OutOfLimits`] for a pinned
    /// value whose block is larger than half the budget (nothing is written).
    pub async fn put_with_options(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> Result<Version> {
        let meta = self.meta_of(options, block_len(key, value.len() as u64))?;
        self.put_source(key, Source::Bytes(value), self.cfg.replicas, meta)
            .await
    }

    /// [`Store::put_from`] with `options` ([`Store::put_with_options`]).
    ///
    /// # Errors
    /// As [`Store::put_with_options`].
    pub async fn put_from_with_options(
        &self,
        key: &[u8],
        value: &Mr<Shared>,
        options: PutOptions,
    ) -> Result<Version> {
        let meta = self.meta_of(options, block_len(key, value.len() as u64))?;
        self.put_source(key, Source::Mr(value), self.cfg.replicas, meta)
            .await
    }

    /// The expiry and pin `options` give a block of `len` bytes.
    fn meta_of(&self, options: PutOptions, len: u64) -> Result<(Expiry, Pin)> {
        let expiry = match options.ttl {
            Some(ttl) => self.expiry_after(ttl)?,
            None => Expiry::NEVER,
        };
        if let (Some(c), Pin::Hard | Pin::Soft) = (&self.cfg.cache, options.pin) {
            if len > c.budget / 2 {
                return Err(Error::Core(CoreError::OutOfLimits {
                    what: "pinned store value, in bytes (at most half the cache's budget)",
                    value: len,
                    min: 1,
                    max: c.budget / 2,
                }));
            }
        }
        Ok((expiry, options.pin))
    }

    /// Removes `key`; `false` if no replica held it.
    ///
    /// # Errors
    /// As [`Store::put`].
    pub async fn remove(&self, key: &[u8]) -> Result<bool> {
        check_user_key(key, 1)?;
        let done = self
            .write(
                key,
                Source::Bytes(b""),
                Writing::kind(Kind::Tombstone),
                self.cfg.replicas,
            )
            .await?;
        let removed = done.version.is_some();
        if removed {
            self.counters.removes.fetch_add(1, Ordering::Relaxed);
        }
        self.after_write().await;
        self.flush_counts(false).await;
        Ok(removed)
    }

    /// [`Store::put`] of the bytes of `value`, a registered view (e.g.
    /// [`Mr::share`]/[`Mr::share_range`] of a region of this client's protection domain):
    /// every replica's block (or every part, for a striped value) is WRITten straight from
    /// `value`'s memory, with no copy on this host; the CPU reads the bytes once, for the
    /// checksum. `value` must not change until the put returns.
    ///
    /// # Errors
    /// As [`Store::put`].
    pub async fn put_from(&self, key: &[u8], value: &Mr<Shared>) -> Result<Version> {
        self.put_source(key, Source::Mr(value), self.cfg.replicas, NOTHING)
            .await
    }

    /// [`Store::put`] of `value` under `key` (or a remove, as `what` says) for one of
    /// [`Store::put_many`] or [`Store::remove_many`] that published `published_at` under a
    /// view that is no longer in force (so was not acknowledged): made anew under the view
    /// in force, above that version. The version it wrote (none for a remove that found
    /// nothing).
    pub(super) async fn put_again_above(
        &self,
        key: &[u8],
        value: Source<'_>,
        what: Writing,
        published_at: Version,
    ) -> Result<Option<Version>> {
        let put = async {
            let _one = self.put_lock(key).lock().await;
            let (r, _) = self
                .put_now(key, value, what, self.cfg.replicas, Some(published_at))
                .await;
            r
        };
        let done = self.beside_frees(put).await?;
        if done.version.is_some() {
            let counter = match what.kind {
                Kind::Tombstone => &self.counters.removes,
                _ => &self.counters.puts,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(done.version)
    }

    /// Replaces `key`'s expired value of `version` with a tombstone, so that its space is
    /// freed after the grace period: as writer 0, and only while `version` is the newest
    /// (a put made since is never overtaken: docs/STORE.md section 11). Best effort: a
    /// failure leaves the value where it is, expired, for a later reader or a remove.
    pub(super) async fn reclaim_expired(&self, key: &[u8], version: Version) {
        let what = Writing {
            only_over: Some(version),
            ..Writing::kind(Kind::Tombstone)
        };
        // Boxed: a put's future is large, and every get's would carry it.
        let done = Box::pin(self.write(key, Source::Bytes(b""), what, self.cfg.replicas)).await;
        if done.is_ok_and(|d| d.version.is_some()) {
            self.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`Store::put_with`] from a source, the value expiring at `expiry`, pinned as `pin`.
    pub(super) async fn put_source(
        &self,
        key: &[u8],
        value: Source<'_>,
        replicas: usize,
        (expiry, pin): (Expiry, Pin),
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
        let mut made_room = 0;
        let version = loop {
            let put = if block_len(key, value.len()) > self.block_limit() {
                self.put_striped(key, value, replicas, (expiry, pin)).await
            } else {
                match self
                    .write(
                        key,
                        value,
                        Writing::kind(Kind::Value).with((expiry, pin)),
                        replicas,
                    )
                    .await
                {
                    Ok(done) => done
                        .version
                        .ok_or_else(|| self.damaged(key, "a put ended without a version")),
                    Err(e) => Err(e),
                }
            };
            // Backpressure: no room, but blocks this client replaced wait out their grace
            // period. Wait for them (at most one grace period), free them, try once more.
            if let Err(Error::RemoteExhausted { .. }) = &put {
                // A cache evicts, waits for what it evicted to come free, and tries again.
                if self.cfg.cache.is_some() && made_room < MAKE_ROOM_TRIES {
                    made_room += 1;
                    self.counters.waits_for_room.fetch_add(1, Ordering::Relaxed);
                    self.make_room().await;
                    continue;
                }
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
        self.after_write().await;
        self.flush_counts(false).await;
        Ok(version)
    }

    pub(super) async fn write(
        &self,
        key: &[u8],
        value: Source<'_>,
        kind: Writing,
        replicas: usize,
    ) -> Result<PutDone> {
        self.write_published(key, value, kind, replicas).await.0
    }

    /// [`Store::write`], and whether the put was published (its version may be visible)
    /// when it failed.
    pub(super) async fn write_published(
        &self,
        key: &[u8],
        value: Source<'_>,
        kind: Writing,
        replicas: usize,
    ) -> (Result<PutDone>, bool) {
        // The frees whose grace period has passed start beside the put, in batches, and go
        // on beside the next ones: the put does not wait for them, unless they fell behind
        // (docs/STORE.md section 8).
        self.start_frees(super::gc::FREES_PER_PUT);
        let put = async {
            // One put of a key at a time from this client (`hints.rs`).
            let _one = self.put_lock(key).lock().await;
            self.put_now(key, value, kind, replicas, None).await
        };
        let behind = async {
            if self.frees_behind() {
                self.frees_under_way().await;
            }
            self.flush_parts().await
        };
        let (_, out) = futures_util::future::join(behind, self.beside_frees(put)).await;
        out
    }

    /// A put under the view this client places keys by, fenced (docs/STORE.md section 4):
    /// once published, the fence word of each replica is read (after the put's swaps there,
    /// on the same connections); a newer view on any of them means the put was made under
    /// an old view, so it is not acknowledged: the view is read again and the put made anew
    /// under it, with a version above the one it published. While data moves, the put's
    /// version also beats the newest on the previous placement.
    async fn put_now(
        &self,
        key: &[u8],
        value: Source<'_>,
        kind: Writing,
        replicas: usize,
        published_at: Option<Version>,
    ) -> (Result<PutDone>, bool) {
        // A version this put already published under an older view (a batched put's,
        // `Store::put_many`): the put goes above it.
        let mut floor = published_at;
        let mut floor_removed = false;
        let mut published = published_at.is_some();
        for _ in 0..VIEW_ROUNDS {
            let view = match self.placing_view().await {
                Ok(v) => v,
                Err(e) => return (Err(e), published),
            };
            if view.moving() {
                // Every replica under either placement must answer: a version this put
                // does not see could beat it once the key has moved.
                match self.newest_anywhere(key).await {
                    Ok(Some((version, tombstone))) if floor.is_none_or(|f| version > f) => {
                        floor = Some(version);
                        // A tombstone there: nothing to remove unless it is this put's
                        // own, published under an older view (made anew).
                        floor_removed = tombstone && !published;
                    }
                    Ok(_) => {}
                    Err(e) => return (Err(e), published),
                }
            }
            let (result, now_published, placed) = self
                .put_once(key, value, kind, replicas, (floor, floor_removed))
                .await;
            published |= now_published;
            let done = match result {
                Ok(d) => d,
                Err(e) => return (Err(e), published),
            };
            let fences = self.fences_after(&placed, &done.fences).await;
            if !Self::fenced_out(&fences, view.number) {
                return (Ok(done), true);
            }
            // Made under an old view: not acknowledged; again under the new one.
            self.counters
                .fenced
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if done.version > floor {
                floor = done.version;
                floor_removed = false;
            }
            if let Err(e) = self.reload_view().await {
                return (Err(e), published);
            }
        }
        (
            Err(Error::Contended {
                what: "store put across view changes",
                rounds: VIEW_ROUNDS,
            }),
            published,
        )
    }

    /// One put on the key's replicas under the view in force, its version above `floor`:
    /// what it did, whether it was published, and the replicas it was placed on.
    async fn put_once(
        &self,
        key: &[u8],
        value: Source<'_>,
        what: Writing,
        replicas: usize,
        (floor, floor_removed): (Option<crate::Version>, bool),
    ) -> (Result<PutDone>, bool, Vec<Replica>) {
        let replicas = match self.replicas(key, replicas, super::Purpose::Write).await {
            Ok((r, _)) => r,
            Err(e) => return (Err(e), false, Vec::new()),
        };
        let digest = match value.digest() {
            Ok(d) => d,
            Err(e) => return (Err(e), false, replicas),
        };
        let (mut put, meta) =
            match self.prepare_put(key, digest, what, &replicas, (floor, floor_removed), 1) {
                Ok(p) => p,
                Err(e) => return (Err(e), false, replicas),
            };
        let result = self.run_put(&mut put, &replicas, value).await;
        self.counters
            .put_round_trips
            .fetch_add(u64::from(put.round_trips()), Ordering::Relaxed);
        let (result, published) = self.settle_put(key, &replicas, &put, meta, result).await;
        (result, published, replicas)
    }

    /// The put of `key` on `replicas`, ready to run: its machine, hinted, above `floor`,
    /// fenced; a value put from a current hint and spare blocks when the client has them
    /// (one round trip), allocating the next put's spares beside itself while the client
    /// keeps fewer than `keep_spares` of the block's size class on a replica (docs/STORE.md
    /// section 6).
    pub(super) fn prepare_put(
        &self,
        key: &[u8],
        digest: crate::format::ValueDigest,
        what: Writing,
        replicas: &[Replica],
        (floor, floor_removed): (Option<crate::Version>, bool),
        keep_spares: usize,
    ) -> Result<(Put, PutMeta)> {
        let since = Instant::now();
        let kind = what.kind;
        // An expired value's reclaim writes as no client (id 0): any put's version at the
        // same sequence number is above it (docs/STORE.md section 11).
        let writer = match what.only_over {
            Some(_) => 0,
            None => self.pool.client_id(),
        };
        let mut put = Put::new(key, digest, kind, writer, replicas)?
            .expiring(what.expiry)?
            .pinned(what.pin)?
            .accessed_at(super::wall_clock_us())
            .only_over(what.only_over)
            .hinted(&self.hints_of(key))
            .at_least(floor, floor_removed)
            .fenced(crate::view::VIEW_AT);
        let len = put.block_len();
        if Self::saves_rounds(kind) {
            if let Some(seen) = self.current_hint(key, replicas, since) {
                if let Some(blocks) = self.take_spares(replicas, len) {
                    put = put.current(&seen, &blocks);
                    if !put.publishes_first() {
                        let taken: Vec<(u32, u64)> =
                            replicas.iter().map(|r| r.node).zip(blocks).collect();
                        self.keep_spares(replicas, len, &taken);
                    }
                }
            }
            put = put.spare(&self.lacking_spares(replicas, len, keep_spares));
        }
        Ok((put, PutMeta { len, since }))
    }

    /// What a put that ran left to do: its spares kept, the slots it saw remembered, the blocks it replaced retired, those it did not use
    /// freed (on failure, those no slot can name). The result, and whether the put was
    /// published (its version may be visible).
    pub(super) async fn settle_put(
        &self,
        key: &[u8],
        replicas: &[Replica],
        put: &Put,
        PutMeta { len, since }: PutMeta,
        result: Result<PutDone>,
    ) -> (Result<PutDone>, bool) {
        match result {
            Ok(done) => {
                self.charge(done.named_bytes.iter().copied());
                self.keep_spares(replicas, len, &done.spares);
                self.remember(key, since, done.seen.clone());
                self.retire_replaced(key, replicas, &done.replaced);
                let due = crate::timing::free_after(Instant::now(), self.cfg.grace);
                if done.version.is_some() {
                    self.retire_parts(due, key, &done.superseded);
                }
                self.free_now(replicas, &done.unused).await;
                (Ok(done), true)
            }
            Err(e) => {
                self.charge(put.named_bytes().iter().copied());
                self.keep_spares(replicas, len, put.spares());
                // Blocks no slot names (a swap that won, or may have, leaves its own).
                self.free_now(replicas, &put.allocated()).await;
                (Err(e), put.published())
            }
        }
    }

    pub(super) async fn free_now(&self, replicas: &[Replica], blocks: &[(u32, u64)]) {
        join_all(blocks.iter().map(|&(node, at)| {
            self.pool
                .regions()
                .free(node, incarnation(replicas, node), at)
        }))
        .await;
    }

    /// Runs `put`'s steps with the pool's driver, the value as the payload its block
    /// writes end with.
    pub(super) async fn run_put(
        &self,
        put: &mut Put,
        replicas: &[Replica],
        value: Source<'_>,
    ) -> Result<PutDone> {
        let bytes: [&[u8]; 1];
        let payload = match value {
            Source::Bytes(v) => {
                bytes = [v];
                Payload::Bytes(&bytes)
            }
            Source::Mr(m) => Payload::Mr(m),
        };
        self.pool
            .regions()
            .drive(put, |node| incarnation(replicas, node), payload)
            .await
    }
}

/// A value to put: bytes (copied through a staging buffer), or a registered view whose
/// bytes are WRITten straight from its memory.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    Bytes(&'a [u8]),
    Mr(&'a Mr<Shared>),
}

impl Source<'_> {
    pub(super) fn len(&self) -> u64 {
        match self {
            Source::Bytes(b) => b.len() as u64,
            Source::Mr(m) => m.len() as u64,
        }
    }

    /// The value's digest (a view's bytes are read for it in pieces, not copied whole).
    pub(super) fn digest(&self) -> Result<ValueDigest> {
        match self {
            Source::Bytes(b) => Ok(ValueDigest::of(b)),
            Source::Mr(m) => digest_of(m, 0, m.len()),
        }
    }
}

/// The digest of `len` bytes at `offset` of `m`, read in 64 KiB pieces.
pub(super) fn digest_of(m: &Mr<Shared>, offset: usize, len: usize) -> Result<ValueDigest> {
    let mut d = ValueDigest::new();
    let mut piece = vec![0u8; len.min(64 << 10)];
    let mut at = 0;
    while at < len {
        let n = piece.len().min(len - at);
        m.read_at(offset + at, &mut piece[..n])?;
        d.update(&piece[..n]);
        at += n;
    }
    Ok(d)
}
