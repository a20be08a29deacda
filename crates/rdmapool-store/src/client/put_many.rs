//! Puts and removes of many keys at once ([`Store::put_many`], [`Store::remove_many`]):
//! every key's put (or remove) machine advances in
//! step, and each round's operations of all of them go out as one step, per server one
//! list with one doorbell ([`Regions::drive_many`](rdmapool_pool::remote::regions::Regions::drive_many)),
//! so N puts take the round trips of one: one from current hints, two or three without.
//! What is not put together is put alone, after the rest, in the caller's order: a striped
//! value, a key given twice (its later values), every key while keys move between views,
//! and a put that found no room or met a newer view.

use super::put::{PutMeta, Source, Writing};
use super::{check_user_key, Purpose, Store};
use crate::format::{block_len, Kind, Version};
use crate::lookup::Replica;
use crate::put::{Put, PutDone};
use futures_util::future::join_all;
use rdmapool_pool::fabric::{Mr, Shared};
use rdmapool_pool::remote::regions::Payload;
use rdmapool_pool::{Error, Result};
use std::sync::atomic::Ordering;

/// What became of one key's put made together with others.
enum Together {
    /// Acknowledged (the version it wrote; none for a remove that found nothing), or
    /// failed for good.
    Ended(Result<Option<Version>>),
    /// To be put alone, after the others (no room now: the single put waits for it).
    Alone,
    /// Published under a view that is no longer in force: to be made anew above it.
    Above(Version),
}

impl Store {
    /// Stores each of `values` under the key of `keys` at its position (as [`Store::put`]
    /// of each, in that order), together: every round of the puts' one-sided operations
    /// goes out at once, one list per server, so a batch takes about the round trips of one
    /// put (one from current hints). Each key gets its own result.
    ///
    /// A key given twice ends with its last value (its later values are put after the
    /// rest, one by one). Values too large for one block (striped), and every key while
    /// keys move between views, are put one by one, as is a put that found no room (it
    /// waits, once, for the blocks this client replaced) or met a newer view (made anew
    /// above the version it published, as [`Store::put`] does).
    ///
    /// # Errors
    /// Per key, as [`Store::put`]; every key fails with
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) when `values` is not
    /// as long as `keys` (nothing is written).
    pub async fn put_many(&self, keys: &[&[u8]], values: &[&[u8]]) -> Vec<Result<Version>> {
        let sources: Vec<Source<'_>> = values.iter().map(|v| Source::Bytes(v)).collect();
        self.put_many_from(keys, &sources).await
    }

    /// [`Store::put_many`] of the bytes of registered views (as [`Store::put_from`] of
    /// each): every block's value WRITten straight from its view, no copy on this host.
    /// The views must not change until it returns.
    ///
    /// # Errors
    /// As [`Store::put_many`].
    pub async fn put_from_many(
        &self,
        keys: &[&[u8]],
        values: &[&Mr<Shared>],
    ) -> Vec<Result<Version>> {
        let sources: Vec<Source<'_>> = values.iter().map(|v| Source::Mr(v)).collect();
        self.put_many_from(keys, &sources).await
    }

    /// [`Store::put_many`] from sources.
    async fn put_many_from(&self, keys: &[&[u8]], values: &[Source<'_>]) -> Vec<Result<Version>> {
        if keys.len() != values.len() {
            let wrong = || {
                Err(Error::Core(rdmapool_pool::CoreError::OutOfLimits {
                    what: "put_many values (one per key)",
                    value: values.len() as u64,
                    min: keys.len() as u64,
                    max: keys.len() as u64,
                }))
            };
            return keys.iter().map(|_| wrong()).collect();
        }
        let mut out: Vec<Option<Result<Version>>> = (0..keys.len()).map(|_| None).collect();
        let mut together = Vec::new();
        let mut alone = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, (&key, value)) in keys.iter().zip(values).enumerate() {
            if let Err(e) = check_user_key(key, value.len()) {
                out[i] = Some(Err(e));
            } else if block_len(key, value.len()) > self.block_limit() || !seen.insert(key) {
                alone.push(i);
            } else {
                together.push(i);
            }
        }
        let mut above = Vec::new();
        match self.placing_view().await {
            Ok(view) if !view.moving() && !together.is_empty() => {
                let ended = self
                    .put_together(keys, values, &together, (Kind::Value, view.number))
                    .await;
                for (&i, t) in together.iter().zip(ended) {
                    match t {
                        Together::Ended(r) => {
                            let none = || self.damaged(keys[i], "a put ended without a version");
                            out[i] = Some(r.and_then(|v| v.ok_or_else(none)));
                        }
                        Together::Alone => alone.push(i),
                        Together::Above(v) => above.push((i, v)),
                    }
                }
            }
            _ => alone.extend(&together),
        }
        for (i, published) in above {
            let what = Writing::kind(Kind::Value);
            let again = self.put_again_above(keys[i], values[i], what, published);
            let none = || self.damaged(keys[i], "a put ended without a version");
            out[i] = Some(again.await.and_then(|v| v.ok_or_else(none)));
        }
        // In the caller's order: a key's later values after its earlier ones.
        alone.sort_unstable();
        for i in alone {
            let r = self.put_source(keys[i], values[i], self.cfg.replicas, super::put::NOTHING);
            out[i] = Some(r.await);
        }
        self.after_write().await;
        self.flush_counts(false).await;
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(Error::ListFailed("a put_many key was not put".into())))
            })
            .collect()
    }

    /// Removes each of `keys` (as [`Store::remove`] of each, in that order), together:
    /// every key's tombstone is written by its own remove, every round of them at once, one
    /// list per server. Whether each removed a value. A key given twice is removed once
    /// (its later removes find nothing); every key while keys move between views is removed
    /// one by one.
    ///
    /// # Errors
    /// Per key, as [`Store::remove`].
    pub async fn remove_many(&self, keys: &[&[u8]]) -> Vec<Result<bool>> {
        let mut out: Vec<Option<Result<bool>>> = (0..keys.len()).map(|_| None).collect();
        let mut together = Vec::new();
        let mut alone = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, &key) in keys.iter().enumerate() {
            if let Err(e) = check_user_key(key, 1) {
                out[i] = Some(Err(e));
            } else if !seen.insert(key) {
                alone.push(i);
            } else {
                together.push(i);
            }
        }
        let nothing: Vec<Source<'_>> = keys.iter().map(|_| Source::Bytes(b"")).collect();
        match self.placing_view().await {
            Ok(view) if !view.moving() && !together.is_empty() => {
                let ended = self
                    .put_together(keys, &nothing, &together, (Kind::Tombstone, view.number))
                    .await;
                for (&i, t) in together.iter().zip(ended) {
                    out[i] = match t {
                        Together::Ended(r) => Some(r.map(|v| v.is_some())),
                        Together::Alone => {
                            alone.push(i);
                            None
                        }
                        Together::Above(published) => {
                            let what = Writing::kind(Kind::Tombstone);
                            let again = self.put_again_above(keys[i], nothing[i], what, published);
                            Some(again.await.map(|v| v.is_some()))
                        }
                    };
                }
            }
            _ => alone.extend(&together),
        }
        alone.sort_unstable();
        for i in alone {
            out[i] = Some(self.remove(keys[i]).await);
        }
        self.after_write().await;
        self.flush_counts(false).await;
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::ListFailed(
                        "a remove_many key was not removed".into(),
                    ))
                })
            })
            .collect()
    }

    /// The puts (or removes, for [`Kind::Tombstone`]) of `keys[i]`, `values[i]` for each
    /// `i` of `which` (distinct keys, one block each), driven together under view `number`.
    async fn put_together(
        &self,
        keys: &[&[u8]],
        values: &[Source<'_>],
        which: &[usize],
        (kind, number): (Kind, u64),
    ) -> Vec<Together> {
        // One put of a key at a time from this client: each key's lock, each lock once,
        // in order (two keys may share one).
        let mut locks: Vec<usize> = which
            .iter()
            .map(|&i| Self::put_lock_index(keys[i]))
            .collect();
        locks.sort_unstable();
        locks.dedup();
        let mut held = Vec::with_capacity(locks.len());
        for l in locks {
            held.push(self.put_locks[l].lock().await);
        }
        // As many frees as the puts would start one by one: the batch retires as many
        // blocks as they would.
        self.start_frees(super::gc::FREES_PER_PUT.saturating_mul(which.len()));
        let behind = async {
            if self.frees_behind() {
                self.frees_under_way().await;
            }
        };
        let puts = self.beside_frees(self.drive_together(keys, values, which, (kind, number)));
        let ((), ended) = futures_util::future::join(behind, puts).await;
        drop(held);
        ended
    }

    /// [`Store::put_together`] once its keys' locks are held.
    async fn drive_together(
        &self,
        keys: &[&[u8]],
        values: &[Source<'_>],
        which: &[usize],
        (kind, number): (Kind, u64),
    ) -> Vec<Together> {
        let placed = join_all(
            which
                .iter()
                .map(|&i| self.replicas(keys[i], self.cfg.replicas, Purpose::Write)),
        )
        .await;
        let mut ended: Vec<Option<Together>> = (0..which.len()).map(|_| None).collect();
        // The puts made ready: their place in `which`, replicas and settling needs.
        let mut ready: Vec<(usize, Vec<Replica>, PutMeta)> = Vec::new();
        let mut machines: Vec<Put> = Vec::new();
        for (k, (&i, placed)) in which.iter().zip(placed).enumerate() {
            let made = placed.and_then(|(replicas, _)| {
                let what = Writing::kind(kind);
                let digest = values[i].digest()?;
                // Spares for a batch as large: the next one publishes in one round.
                let keep = which.len();
                self.prepare_put(keys[i], digest, what, &replicas, (None, false), keep)
                    .map(|(put, meta)| (put, meta, replicas))
            });
            match made {
                Ok((put, meta, replicas)) => {
                    machines.push(put);
                    ready.push((k, replicas, meta));
                }
                Err(e) => ended[k] = Some(Together::Ended(Err(e))),
            }
        }
        // Each put's value, as its block WRITEs' payload.
        let parts: Vec<[&[u8]; 1]> = ready
            .iter()
            .map(|(k, ..)| match values[which[*k]] {
                Source::Bytes(b) => [b],
                Source::Mr(_) => [&[][..]],
            })
            .collect();
        let payloads: Vec<Payload<'_>> = ready
            .iter()
            .zip(&parts)
            .map(|((k, ..), bytes)| match values[which[*k]] {
                Source::Bytes(_) => Payload::Bytes(bytes),
                Source::Mr(m) => Payload::Mr(m),
            })
            .collect();
        let incarnation_of = |node: u32| {
            ready
                .iter()
                .flat_map(|(_, replicas, _)| replicas)
                .find(|r| r.node == node)
                .map_or(0, |r| r.incarnation)
        };
        let results = self
            .pool
            .regions()
            .drive_many(&mut machines, incarnation_of, &payloads)
            .await;
        // The puts advanced in step: the batch took as many round trips as its longest.
        let rounds = machines.iter().map(Put::round_trips).max().unwrap_or(0);
        self.counters
            .put_round_trips
            .fetch_add(u64::from(rounds), Ordering::Relaxed);
        let settled = join_all(ready.iter().zip(&machines).zip(results).map(
            |(((k, replicas, meta), put), result)| async move {
                let key = keys[which[*k]];
                let (result, _) = self.settle_put(key, replicas, put, *meta, result).await;
                (
                    *k,
                    self.ended_together(replicas, result, (kind, number)).await,
                )
            },
        ))
        .await;
        for (k, t) in settled {
            ended[k] = Some(t);
        }
        ended
            .into_iter()
            .map(|t| t.unwrap_or(Together::Alone))
            .collect()
    }

    /// What a put (or remove) made together ended with, once settled: its fence words read
    /// after its swaps (a newer view: made anew above it), no room (put alone), or its
    /// version (none for a remove that found nothing).
    async fn ended_together(
        &self,
        replicas: &[Replica],
        result: Result<PutDone>,
        (kind, number): (Kind, u64),
    ) -> Together {
        let done = match result {
            Ok(done) => done,
            Err(Error::RemoteExhausted { .. }) => return Together::Alone,
            Err(e) => return Together::Ended(Err(e)),
        };
        let fences = self.fences_after(replicas, &done.fences).await;
        if Self::fenced_out(&fences, number) {
            self.counters.fenced.fetch_add(1, Ordering::Relaxed);
            return match done.version {
                Some(v) => Together::Above(v),
                None => Together::Alone,
            };
        }
        if done.version.is_some() {
            let counter = match kind {
                Kind::Tombstone => &self.counters.removes,
                _ => &self.counters.puts,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Together::Ended(Ok(done.version))
    }
}
