//! Gets into the caller's registered memory, and `exists`, in one round from hints
//! (docs/STORE.md sections 5 and 10): for every key this client saw lately, on every replica, all in one step (per
//! server, one list): the key's bucket, the server's fence word (once per server), and, on
//! the first replica, the hinted block's header and key into a staging buffer and the rest
//! of it straight into the caller's buffer. A key is done when every replica's bucket still
//! names the block its hint names there and no other slot of the bucket may be the key's,
//! no fence names a newer view, and the block verifies with the hinted version. Any other
//! key is looked up in rounds (`get.rs`), which writes over what landed in its buffer.

use super::{digest_of, Purpose, Store};
use crate::format::{decode_split, value_len, KeyHash, Kind, Slot, HEADER_LEN};
use crate::lookup::{Lookup, Replica};
use crate::put::SlotSeen;
use rdmapool_pool::fabric::{Mr, RegisteredMemory, Shared};
use rdmapool_pool::remote::regions::Payload;
use rdmapool_pool::remote::step::{Answer, Io, Op};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A get into memory from a hint, planned.
struct Planned {
    replicas: Vec<Replica>,
    /// The hinted slot on each replica, in the replicas' order.
    slots: Vec<SlotSeen>,
    /// The first replica's block: where it starts, its header and key's length, and how
    /// much of the rest is READ into the caller's buffer.
    block_at: u64,
    head_len: u64,
    value_part: u64,
}

/// Where a planned get's answers are in the step's.
struct Placed {
    buckets: Range<usize>,
    head: usize,
    value: usize,
}

impl Store {
    /// `key`'s replicas and this client's hinted slot on each, when the hint names one
    /// version on every replica and none is down.
    async fn hinted_replicas(&self, key: &[u8]) -> Option<(Vec<Replica>, Vec<SlotSeen>)> {
        let seen = self.hint_slots(key)?;
        let (replicas, missing) = self
            .replicas(key, self.cfg.replicas, Purpose::Read)
            .await
            .ok()?;
        let slots: Vec<SlotSeen> = replicas
            .iter()
            .map(|r| seen.iter().find(|s| s.node == r.node).copied())
            .collect::<Option<_>>()?;
        let version = slots.first()?.version;
        (missing == 0 && slots.iter().all(|s| s.version == version)).then_some((replicas, slots))
    }

    /// The plan of a one-round get of `key` into `out`: `None` when this client has no
    /// hint naming a value on every replica, a replica is down, or the block cannot be
    /// read so.
    async fn plan_into(&self, key: &[u8], out: &Mr<Shared>) -> Option<Planned> {
        let (replicas, slots) = self.hinted_replicas(key).await?;
        if slots.iter().any(|s| s.kind != Kind::Value) {
            return None;
        }
        let head_len = (HEADER_LEN + key.len()) as u64;
        let block = Lookup::block_read(replicas.first()?, slots[0].word)?;
        let value_part = block.len.saturating_sub(head_len).min(out.len() as u64);
        (value_part > 0).then_some(Planned {
            block_at: block.at,
            replicas,
            slots,
            head_len,
            value_part,
        })
    }

    /// Whether each of `keys` holds a value, in one round from this client's hints: for
    /// every key whose hint names one version on every replica, its buckets and each
    /// server's fence word, all in one step (no block is read: a bucket that still names
    /// the hinted block says the key holds what the hint saw, a value or a tombstone).
    /// `None` for a key to look up.
    pub(super) async fn exists_from_hints(&self, keys: &[&[u8]]) -> Vec<Option<bool>> {
        let mut done = vec![None; keys.len()];
        let Ok(view) = self.placing_view().await else {
            return done;
        };
        let mut plans = Vec::with_capacity(keys.len());
        for key in keys {
            plans.push(self.hinted_replicas(key).await);
        }
        if plans.iter().all(Option::is_none) {
            return done;
        }
        let mut ops: Vec<Op> = Vec::new();
        let mut fences: Vec<(u32, u64, usize)> = Vec::new();
        let placed: Vec<Option<Range<usize>>> = keys
            .iter()
            .zip(&plans)
            .map(|(key, plan)| {
                let (replicas, _) = plan.as_ref()?;
                Some(buckets_and_fences(key, replicas, &mut ops, &mut fences))
            })
            .collect();
        let answers = self
            .pool
            .regions()
            .perform(&ops, incarnation(&fences), Payload::None)
            .await;
        self.counters
            .get_round_trips
            .fetch_add(1, Ordering::Relaxed);
        let Some(answers) = answers.ok().filter(|a| current(&fences, a, view.number)) else {
            return done;
        };
        for (i, (plan, at)) in plans.iter().zip(&placed).enumerate() {
            let (Some((_, slots)), Some(at)) = (plan, at) else {
                continue;
            };
            if still_named(keys[i], slots, &answers[at.clone()]) {
                done[i] = Some(matches!(slots[0].kind, Kind::Value | Kind::Manifest));
            }
        }
        done
    }

    /// Gets of `keys`, each into the same position of `outs` from its start, in one round
    /// from this client's hints (see the module's text): per key, the value's length when
    /// done, `None` when it must be looked up.
    pub(super) async fn get_into_from_hints(
        &self,
        keys: &[&[u8]],
        outs: &[&Mr<Shared>],
    ) -> Vec<Option<usize>> {
        let mut done = vec![None; keys.len()];
        let Ok(view) = self.placing_view().await else {
            return done;
        };
        let mut plans = Vec::with_capacity(keys.len());
        for (key, out) in keys.iter().zip(outs) {
            plans.push(self.plan_into(key, out).await);
        }
        if plans.iter().all(Option::is_none) {
            return done;
        }
        // The step: per key its buckets, each server's fence word once, the block's head
        // and its value into the caller's buffer.
        let mut ops: Vec<Op> = Vec::new();
        let mut dests: Vec<(&Mr<Shared>, usize)> = Vec::new();
        let mut fences: Vec<(u32, u64, usize)> = Vec::new();
        let mut placed: Vec<Option<Placed>> = Vec::with_capacity(keys.len());
        for ((key, out), plan) in keys.iter().zip(outs).zip(&plans) {
            let Some(p) = plan else {
                placed.push(None);
                continue;
            };
            let buckets = buckets_and_fences(key, &p.replicas, &mut ops, &mut fences);
            let node = p.replicas[0].node;
            ops.push(Op {
                node,
                io: Io::Read {
                    at: p.block_at,
                    len: p.head_len,
                },
            });
            dests.push((out, 0));
            ops.push(Op {
                node,
                io: Io::ReadInto {
                    at: p.block_at + p.head_len,
                    len: p.value_part,
                    into: dests.len() - 1,
                },
            });
            placed.push(Some(Placed {
                buckets,
                head: ops.len() - 2,
                value: ops.len() - 1,
            }));
        }
        let since = Instant::now();
        let answers = self
            .pool
            .regions()
            .perform(&ops, incarnation(&fences), Payload::Into(&dests))
            .await;
        self.counters
            .get_round_trips
            .fetch_add(1, Ordering::Relaxed);
        // A newer view, or a fence unread: the lookups see to it.
        let Some(answers) = answers.ok().filter(|a| current(&fences, a, view.number)) else {
            return done;
        };
        for (i, (plan, at)) in plans.iter().zip(&placed).enumerate() {
            let (Some(p), Some(at)) = (plan, at) else {
                continue;
            };
            done[i] = self.verify_into(keys[i], outs[i], p, at, &answers, since);
        }
        done
    }

    /// The value's length if the answers of `p`'s reads show its hinted block current and
    /// sound (see the module's text); it notes the hint seen again, from `since`.
    fn verify_into(
        &self,
        key: &[u8],
        out: &Mr<Shared>,
        p: &Planned,
        at: &Placed,
        answers: &[Answer],
        since: Instant,
    ) -> Option<usize> {
        if !still_named(key, &p.slots, &answers[at.buckets.clone()]) {
            return None;
        }
        let head = answers.get(at.head)?.bytes()?;
        if answers.get(at.value)? != &Answer::Written {
            return None;
        }
        let len = value_len(head).filter(|&l| l > 0 && l <= p.value_part)?;
        let digest = digest_of(out, 0, len as usize).ok()?;
        let block = decode_split(head, key, &digest).ok()?;
        if block.version != p.slots[0].version || block.kind != Kind::Value {
            return None;
        }
        self.remember(key, since, p.slots.clone());
        Some(len as usize)
    }
}

/// Whether the buckets read (`buckets`, one per slot of `slots`, in order) still hold each
/// slot's word in its place, and no other slot of them carries `key`'s fingerprint.
fn still_named(key: &[u8], slots: &[SlotSeen], buckets: &[Answer]) -> bool {
    let fingerprint = KeyHash::of(key).fingerprint();
    slots.len() == buckets.len()
        && slots.iter().zip(buckets).all(|(s, a)| {
            a.bytes().is_some_and(|bucket| {
                bucket.chunks_exact(8).enumerate().all(|(i, w)| {
                    let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
                    if i == s.slot {
                        w == s.word
                    } else {
                        Slot::from_word(w).is_none_or(|x| x.fingerprint != fingerprint)
                    }
                })
            })
        })
}

/// Adds to `ops` the READs of `key`'s bucket on every one of `replicas`, and of each
/// replica's fence word unless `fences` has its node already (`(node, incarnation, op)`):
/// where the bucket READs are in `ops`.
fn buckets_and_fences(
    key: &[u8],
    replicas: &[Replica],
    ops: &mut Vec<Op>,
    fences: &mut Vec<(u32, u64, usize)>,
) -> Range<usize> {
    let start = ops.len();
    ops.extend(
        Lookup::new(key, replicas)
            .bucket_reads()
            .iter()
            .map(|r| r.op()),
    );
    let buckets = start..ops.len();
    for r in replicas {
        if !fences.iter().any(|&(node, _, _)| node == r.node) {
            fences.push((r.node, r.incarnation, ops.len()));
            ops.push(Op {
                node: r.node,
                io: Io::Read {
                    at: crate::view::VIEW_AT,
                    len: 8,
                },
            });
        }
    }
    buckets
}

/// The incarnation of each node of `fences`, as `Regions::perform` asks for it.
fn incarnation(fences: &[(u32, u64, usize)]) -> impl Fn(u32) -> u64 + '_ {
    move |node| {
        fences
            .iter()
            .find(|&&(n, _, _)| n == node)
            .map_or(0, |&(_, inc, _)| inc)
    }
}

/// Whether every fence word of `fences` was read and names view `number` or an older one.
fn current(fences: &[(u32, u64, usize)], answers: &[Answer], number: u64) -> bool {
    fences.iter().all(|&(_, _, k)| {
        answers
            .get(k)
            .and_then(|a| a.words().first().copied())
            .is_some_and(|f| f <= number)
    })
}
