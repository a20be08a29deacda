//! Gets of many keys at once: every key's get machine advances in step, and each step's
//! READs of all keys go out together as pool batches (per server, one list with one
//! doorbell and one completion), so N small gets cost about as many round trips as one;
//! whether many keys hold a value (`exists_many`, the same rounds, no value kept); and gets
//! of many keys into the caller's memory (`get_into_many`).

use super::Store;
use crate::format::Kind;
use crate::get::Get;
use crate::lookup::{Replica, Src};
use futures_util::future::join_all;
use rdmapool_pool::fabric::{Mr, RegisteredMemory, Shared};
use rdmapool_pool::remote::step::{Answer, Io, Machine, Step};
use rdmapool_pool::{Error, Result};
use std::sync::atomic::Ordering;

/// What a read of many keys returns for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Its value.
    Values,
    /// Whether it holds one.
    Presence,
}

/// One key's get, while it runs.
struct Running {
    /// Its place in the caller's list.
    key: usize,
    replicas: Vec<Replica>,
    get: Get,
    /// Its READs of the last step: where they start in the step's combined list, and how
    /// many.
    reads: std::ops::Range<usize>,
}

impl Store {
    /// The values of `keys` READ straight into `outs` (key `i` into `outs[i]`, from its
    /// start), as [`Store::get_into`] of each, with no copy on this host: per key, the
    /// value's length or `None`. Every key this client saw lately is read in one round, all
    /// of them together (per server, one list: `into.rs`); the others are looked up, all at
    /// once, as `get_into` does.
    ///
    /// # Errors
    /// Per key, as [`Store::get_into`]; every key fails with
    /// [`CoreError::OutOfLimits`](rdmapool_pool::CoreError::OutOfLimits) when `outs` is not
    /// as long as `keys`, and with [`CoreError::BadSetting`](rdmapool_pool::CoreError::BadSetting)
    /// when two of `outs` overlap (nothing is read).
    pub async fn get_into_many(
        &self,
        keys: &[&[u8]],
        outs: &[&Mr<Shared>],
    ) -> Vec<Result<Option<usize>>> {
        if keys.len() != outs.len() {
            let wrong = || {
                Err(Error::Core(rdmapool_pool::CoreError::OutOfLimits {
                    what: "get_into_many buffers (one per key)",
                    value: outs.len() as u64,
                    min: keys.len() as u64,
                    max: keys.len() as u64,
                }))
            };
            return keys.iter().map(|_| wrong()).collect();
        }
        // Two keys read into the same bytes could each verify before the other's READ
        // lands: a value returned over bytes that are no longer its own.
        let mut spans: Vec<(u64, u64, usize)> = outs
            .iter()
            .enumerate()
            .map(|(i, o)| (o.addr(), o.len() as u64, i))
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
            let (a, b) = (w[0].2.min(w[1].2), w[0].2.max(w[1].2));
            let overlap = || {
                Err(Error::Core(rdmapool_pool::CoreError::BadSetting {
                    name: "get_into_many buffers".into(),
                    value: format!("{a} and {b}"),
                    reason: "they overlap: each key needs bytes of its own (nothing was read)"
                        .into(),
                }))
            };
            return keys.iter().map(|_| overlap()).collect();
        }
        let checked: Vec<Result<()>> = keys.iter().map(|k| super::check_user_key(k, 1)).collect();
        let valid: Vec<usize> = (0..keys.len()).filter(|&i| checked[i].is_ok()).collect();
        let vkeys: Vec<&[u8]> = valid.iter().map(|&i| keys[i]).collect();
        let vouts: Vec<&Mr<Shared>> = valid.iter().map(|&i| outs[i]).collect();
        let (first, rest, looked) = self
            .beside_frees(async {
                let first = self.get_into_from_hints(&vkeys, &vouts).await;
                let rest: Vec<usize> = (0..valid.len()).filter(|&j| first[j].is_none()).collect();
                let looked = join_all(
                    rest.iter()
                        .map(|&j| self.get_into_looked_up(vkeys[j], vouts[j])),
                )
                .await;
                (first, rest, looked)
            })
            .await;
        let mut out: Vec<Result<Option<usize>>> =
            checked.into_iter().map(|c| c.map(|()| None)).collect();
        for (j, &i) in valid.iter().enumerate() {
            if let Some(n) = first[j] {
                out[i] = Ok(Some(n));
            }
        }
        for (&j, r) in rest.iter().zip(looked) {
            out[valid[j]] = r;
        }
        for (key, found) in keys.iter().zip(&out) {
            if let Ok(found) = found {
                self.count_get(key, found.is_some());
            }
        }
        self.after_gets(keys, out.iter().map(|r| matches!(r, Ok(Some(_)))))
            .await;
        out
    }

    /// The values stored under `keys`, in their order (as [`Store::get`] of each), read
    /// together: each round of READs of every key goes out as one pool batch per server.
    /// A striped value's parts are read after its manifest, as by `get`.
    ///
    /// # Errors
    /// Per key, as [`Store::get`].
    pub async fn get_many(&self, keys: &[&[u8]]) -> Vec<Result<Option<Vec<u8>>>> {
        let out = self.beside_frees(self.read_many(keys, Want::Values)).await;
        self.after_gets(keys, out.iter().map(|r| matches!(r, Ok(Some(_)))))
            .await;
        out
    }

    /// Whether each of `keys` holds a value (as [`Store::exists`] of each), looked up
    /// together as [`Store::get_many`] reads them: each round of READs of every key one
    /// pool batch per server. Each key's newest block is read whole and verified, so a key
    /// whose every copy is damaged fails (`Damaged`), never `false`; a striped value's
    /// parts are not read.
    ///
    /// # Errors
    /// Per key, as [`Store::exists`].
    pub async fn exists_many(&self, keys: &[&[u8]]) -> Vec<Result<bool>> {
        self.beside_frees(self.read_many(keys, Want::Presence))
            .await
            .into_iter()
            .map(|r| r.map(|v| v.is_some()))
            .collect()
    }

    /// [`Store::get_many`], or [`Store::exists_many`] with [`Want::Presence`] (a found
    /// value is then an empty `Vec`, and a striped one's parts are not read).
    async fn read_many(&self, keys: &[&[u8]], want: Want) -> Vec<Result<Option<Vec<u8>>>> {
        for _ in 0..super::put::VIEW_ROUNDS {
            let number = match self.placing_view().await {
                Ok(v) => v.number,
                Err(_) => {
                    return keys
                        .iter()
                        .map(|_| Err(super::view::torn_record()))
                        .collect()
                }
            };
            if let Some(out) = self.get_many_under(keys, number, want).await {
                return out;
            }
            // A newer view is in force: read it, and look up again under it.
            if self.reload_view().await.is_err() {
                return keys
                    .iter()
                    .map(|_| Err(super::view::torn_record()))
                    .collect();
            }
        }
        keys.iter()
            .map(|_| {
                Err(Error::Contended {
                    what: "store get_many across view changes",
                    rounds: super::put::VIEW_ROUNDS,
                })
            })
            .collect()
    }

    /// [`Store::get_many`] under view `number`; `None` when a fence word read in its
    /// first round names a newer view.
    async fn get_many_under(
        &self,
        keys: &[&[u8]],
        number: u64,
        want: Want,
    ) -> Option<Vec<Result<Option<Vec<u8>>>>> {
        let mut out: Vec<Option<Result<Option<Vec<u8>>>>> = (0..keys.len()).map(|_| None).collect();
        let mut running = Vec::new();
        let since = std::time::Instant::now();
        for (i, key) in keys.iter().enumerate() {
            let started = match super::check_user_key(key, 1) {
                Err(e) => Err(e),
                Ok(()) => {
                    self.replicas(key, self.cfg.replicas, super::Purpose::Read)
                        .await
                }
            };
            match started {
                Ok((replicas, missing)) => {
                    let get = Get::hinted(key, &replicas, &self.hints_of(key)).missing(missing);
                    running.push(Running {
                        key: i,
                        replicas,
                        get,
                        reads: 0..0,
                    });
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        // Answers to the last step's combined READs (empty before the first step).
        let mut answers: Vec<Answer> = Vec::new();
        let now = std::time::Instant::now();
        let mut again = Vec::new();
        // Keys whose newest value expired, to reclaim (docs/STORE.md section 11).
        let mut expired = Vec::new();
        let mut first = true;
        while !running.is_empty() {
            let mut reads = Vec::new();
            let mut still = Vec::with_capacity(running.len());
            for mut r in running {
                let key = keys[r.key];
                let mine = answers.get(r.reads.clone()).unwrap_or(&[]);
                match r.get.advance(&mut (), now, mine).map(Step::listed) {
                    // Looked up again by `get`, which looks up to three times before it says so.
                    Err(Error::Damaged { .. }) => again.push(r.key),
                    Err(e) => out[r.key] = Some(Err(e)),
                    Ok(Step::Do(ops)) => {
                        let start = reads.len();
                        for op in ops {
                            if let Io::Read { at, len } = op.io {
                                let inc = r
                                    .replicas
                                    .iter()
                                    .find(|x| x.node == op.node)
                                    .map_or(0, |x| x.incarnation);
                                reads.push((op.node, inc, at, len));
                            }
                        }
                        r.reads = start..reads.len();
                        still.push(r);
                    }
                    Ok(Step::One(_) | Step::Sleep(_) | Step::Wait) => {
                        r.reads = 0..0;
                        still.push(r);
                    }
                    Ok(Step::Done(None)) => out[r.key] = Some(Ok(None)),
                    Ok(Step::Done(Some((at, found)))) => {
                        self.remember_found(key, &r.get, since);
                        let mut b = match at {
                            Src::Read(k) => match answers.get_mut(r.reads.start + k) {
                                Some(a) => match std::mem::replace(a, Answer::Failed) {
                                    Answer::Bytes(b) => b,
                                    _ => Vec::new(),
                                },
                                None => Vec::new(),
                            },
                            Src::Early(e) => r.get.take_early(e),
                        };
                        let block = found.block;
                        out[r.key] = Some(match block.kind {
                            _ if self.expired_for_get(key, block.expiry) => {
                                expired.push((r.key, block.version));
                                Ok(None)
                            }
                            Kind::Value | Kind::Manifest if want == Want::Presence => {
                                Ok(Some(Vec::new()))
                            }
                            Kind::Value => {
                                b.truncate(block.value.end);
                                b.drain(..block.value.start);
                                Ok(Some(b))
                            }
                            // Read again whole by `get` (its parts, on other servers).
                            Kind::Manifest => {
                                again.push(r.key);
                                Ok(None)
                            }
                            Kind::Tombstone | Kind::Part => Ok(None),
                        });
                    }
                }
            }
            running = still;
            if running.is_empty() {
                break;
            }
            // The fence word of every replica read, beside the first round's READs.
            let mut fenced: Vec<(u32, u64)> = Vec::new();
            if first {
                for r in &running {
                    for x in &r.replicas {
                        if !fenced.contains(&(x.node, x.incarnation)) {
                            fenced.push((x.node, x.incarnation));
                        }
                    }
                }
                let at = crate::view::VIEW_AT;
                reads.extend(fenced.iter().map(|&(node, inc)| (node, inc, at, 8)));
            }
            // The get machines' reads are all reads: one batch per node, as deep as its queue.
            let mut bytes = self.pool.regions().reads(&reads).await;
            self.counters
                .get_round_trips
                .fetch_add(1, Ordering::Relaxed);
            if first {
                first = false;
                let fences: Vec<Option<u64>> = bytes
                    .split_off(bytes.len() - fenced.len())
                    .into_iter()
                    .map(|b| Some(u64::from_le_bytes(b?.get(..8)?.try_into().ok()?)))
                    .collect();
                if Self::fenced_out(&fences, number) {
                    self.counters.fenced.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
            answers = bytes
                .into_iter()
                .map(|b| b.map_or(Answer::Failed, Answer::Bytes))
                .collect();
        }
        for i in again {
            out[i] = Some(match want {
                Want::Values => self.get_value(keys[i]).await,
                Want::Presence => self.exists(keys[i]).await.map(|e| e.then(Vec::new)),
            });
        }
        join_all(
            expired
                .iter()
                .map(|&(i, version)| self.reclaim_expired(keys[i], version)),
        )
        .await;
        Some(
            out.into_iter()
                .zip(keys)
                .map(|(r, key)| {
                    let r = r.unwrap_or(Ok(None));
                    // Gets count as hits or misses; exists as neither (as `exists` of one).
                    match (&r, want) {
                        (Ok(Some(_)), Want::Values) => self.count_get(key, true),
                        (Ok(None), Want::Values) => self.count_get(key, false),
                        _ => {}
                    }
                    r
                })
                .collect(),
        )
    }
}
