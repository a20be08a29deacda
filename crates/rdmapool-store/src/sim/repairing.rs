//! A repair of one key in the simulated cluster, performed the way `Store::repair` does it
//! (scan, read the kept version whole, copy, clear), one step at a time so that tests can
//! interleave it with puts and gets.

use super::{Cluster, Running};
use crate::decide::SLOTS_PER_BUCKET;
use crate::format::{decode_block, peek, KeyHash, Slot};
use crate::lookup::Read;
use crate::repair::{plan_moving, Entry, Plan};

enum Phase {
    Scan,
    Verify(Vec<Entry>),
    Copy(Vec<Entry>, Plan, Box<Running>),
    Clear(Vec<Entry>, Vec<usize>),
    Done,
}

/// One key's repair in progress, onto `targets` (its replicas), scanning `nodes`.
pub(crate) struct Repairing {
    key: Vec<u8>,
    nodes: Vec<u32>,
    targets: Vec<u32>,
    /// What gets read: the targets, and while keys move the previous placement too.
    readable: Vec<u32>,
    phase: Phase,
    /// Slots cleared.
    pub(crate) cleared: usize,
    /// The plan made, once made.
    pub(crate) plan: Option<Plan>,
}

impl Repairing {
    pub(crate) fn new(key: &[u8], nodes: &[u32], targets: &[u32]) -> Self {
        Self::moving(key, nodes, targets, targets)
    }

    /// A repair while keys move from a previous view's placement: the version kept is the
    /// newest on `readable` (both placements), as `Store::repair` keeps it.
    pub(crate) fn moving(key: &[u8], nodes: &[u32], targets: &[u32], readable: &[u32]) -> Self {
        Self {
            key: key.to_vec(),
            nodes: nodes.to_vec(),
            targets: targets.to_vec(),
            readable: readable.to_vec(),
            phase: Phase::Scan,
            cleared: 0,
            plan: None,
        }
    }

    pub(crate) fn finished(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The key's slots on every node that answers (what the whole-index scan finds of it).
    fn scan(&self, c: &Cluster) -> Vec<Entry> {
        let h = KeyHash::of(&self.key);
        let mut out = Vec::new();
        for &node in &self.nodes {
            let r = c.replica(node);
            let bucket = r.bucket_at(h);
            let read = Read {
                node,
                at: bucket,
                len: SLOTS_PER_BUCKET as u64 * 8,
            };
            let Some(words) = c.read(&read) else { continue };
            for (i, w) in words.chunks_exact(8).enumerate() {
                let word = u64::from_le_bytes(w.try_into().unwrap());
                let Some(s) = Slot::from_word(word) else {
                    continue;
                };
                let head = c.read(&Read {
                    node,
                    at: s.offset,
                    len: 64 + 255,
                });
                let Some(p) = head.as_deref().and_then(peek) else {
                    continue;
                };
                if p.key == self.key {
                    out.push(Entry {
                        node,
                        at: bucket + 8 * i as u64,
                        word,
                        key: p.key,
                        version: p.version,
                        kind: p.kind,
                        expiry: p.expiry,
                    });
                }
            }
        }
        out
    }

    /// Performs the next step.
    pub(crate) fn step(&mut self, c: &mut Cluster) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Scan => Phase::Verify(self.scan(c)),
            Phase::Verify(entries) => {
                let blocks: Vec<Option<Vec<u8>>> = entries
                    .iter()
                    .map(|e| {
                        let s = Slot::from_word(e.word)?;
                        c.read(&Read {
                            node: e.node,
                            at: s.offset,
                            len: s.read_len(),
                        })
                    })
                    .collect();
                let kept = crate::repair::keep(&entries, &self.readable);
                let sound: Vec<bool> = blocks
                    .iter()
                    .map(|b| {
                        b.as_deref()
                            .and_then(|b| decode_block(b, &self.key).ok())
                            .is_some_and(|d| Some(d.version) == kept)
                    })
                    .collect();
                let p = plan_moving(&entries, &sound, &self.targets, &self.readable);
                self.plan = Some(p.clone());
                match p.source {
                    None => Phase::Done,
                    Some(i) if !p.need.is_empty() => {
                        let bytes = blocks[i].as_deref().unwrap();
                        let block = decode_block(bytes, &self.key).unwrap();
                        let replicas: Vec<_> = p.need.iter().map(|&n| c.replica(n)).collect();
                        let copy = Running::copy(
                            &replicas,
                            &self.key,
                            &bytes[block.value],
                            block.kind,
                            block.version,
                        );
                        Phase::Copy(entries, p, Box::new(copy))
                    }
                    Some(_) => Phase::Clear(entries, p.clear),
                }
            }
            Phase::Copy(entries, p, mut copy) => {
                copy.step(c);
                match copy.outcome.take() {
                    None => Phase::Copy(entries, p, copy),
                    Some(Ok(_)) => Phase::Clear(entries, p.clear),
                    Some(Err(_)) => Phase::Done,
                }
            }
            Phase::Clear(entries, mut clear) => match clear.pop() {
                None => Phase::Done,
                Some(i) => {
                    let e = &entries[i];
                    if c.cas(e.node, e.at, e.word, 0) == Some(e.word) {
                        self.cleared += 1;
                    }
                    Phase::Clear(entries, clear)
                }
            },
            Phase::Done => Phase::Done,
        };
    }

    /// Runs to the end.
    pub(crate) fn run(mut self, c: &mut Cluster) -> Self {
        while !self.finished() {
            self.step(c);
        }
        self
    }
}
