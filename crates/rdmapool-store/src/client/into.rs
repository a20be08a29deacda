//! Gets into the caller's registered memory in one round, from hints (docs/STORE.md
//! section 5): for every key this client saw lately, on every replica, all in one step (per
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
    /// The plan of a one-round get of `key` into `out`: `None` when this client has no
    /// hint naming a value on every replica, a replica is down, or the block cannot be
    /// read so.
    async fn plan_into(&self, key: &[u8], out: &Mr<Shared>) -> Option<Planned> {
        let seen = self.hint_slots(key)?;
        let (replicas, missing) = self
            .replicas(key, self.cfg.replicas, Purpose::Read)
            .await
            .ok()?;
        let slots: Vec<SlotSeen> = replicas
            .iter()
            .map(|r| seen.iter().find(|s| s.node == r.node).copied())
            .collect::<Option<_>>()?;
        let first = replicas.first()?;
        let version = slots[0].version;
        if missing > 0
            || slots
                .iter()
                .any(|s| s.version != version || s.kind != Kind::Value)
        {
            return None;
        }
        let head_len = (HEADER_LEN + key.len()) as u64;
        let block = Lookup::block_read(first, slots[0].word)?;
        let value_part = block.len.saturating_sub(head_len).min(out.len() as u64);
        (value_part > 0).then_some(Planned {
            block_at: block.at,
            replicas,
            slots,
            head_len,
            value_part,
        })
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
            let start = ops.len();
            ops.extend(
                Lookup::new(key, &p.replicas)
                    .bucket_reads()
                    .iter()
                    .map(|r| r.op()),
            );
            let buckets = start..ops.len();
            for r in &p.replicas {
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
        let incarnation_of = |node: u32| {
            fences
                .iter()
                .find(|&&(n, _, _)| n == node)
                .map_or(0, |&(_, inc, _)| inc)
        };
        let answers = self
            .pool
            .regions()
            .perform(&ops, incarnation_of, Payload::Into(&dests))
            .await;
        self.counters
            .get_round_trips
            .fetch_add(1, Ordering::Relaxed);
        let Ok(answers) = answers else {
            return done;
        };
        let current = fences.iter().all(|&(_, _, k)| {
            answers
                .get(k)
                .and_then(|a| a.words().first().copied())
                .is_some_and(|f| f <= view.number)
        });
        if !current {
            return done; // a newer view, or a fence unread: the lookups see to it
        }
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
        let fingerprint = KeyHash::of(key).fingerprint();
        for (s, a) in p.slots.iter().zip(&answers[at.buckets.clone()]) {
            let bucket = a.bytes()?;
            for (i, w) in bucket.chunks_exact(8).enumerate() {
                let w = u64::from_le_bytes(w.try_into().ok()?);
                let moved = i == s.slot && w != s.word;
                let other =
                    i != s.slot && Slot::from_word(w).is_some_and(|x| x.fingerprint == fingerprint);
                if moved || other {
                    return None;
                }
            }
        }
        let head = answers.get(at.head)?.bytes()?;
        if answers.get(at.value)? != &Answer::Written {
            return None;
        }
        let len = value_len(head).filter(|&l| l > 0 && l <= p.value_part)?;
        let digest = digest_of(out, 0, len as usize).ok()?;
        let block = decode_split(head, key, &digest).ok()?;
        // An expired value is a miss, which the lookup in rounds answers (and counts).
        if block.version != p.slots[0].version
            || block.kind != Kind::Value
            || self.is_expired(block.expiry)
        {
            return None;
        }
        self.remember(key, since, p.slots.clone());
        Some(len as usize)
    }
}
