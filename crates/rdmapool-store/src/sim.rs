//! A simulated cluster for the store's machines: each node's region as bytes, one
//! operation at a time, a bump allocator for blocks, and nodes that can be down. The
//! drivers here perform a machine's steps the way the store client will, and tests
//! interleave several machines step by step.

use super::format::{block_len, encode_block, KeyHash, Kind, Slot, ValueDigest, Version};
use super::get::{Get, GetStep};
use super::lookup::{Read, Replica};
use super::put::{Put, PutDone, PutStep, Reply};
use super::root::Index;
use rdmapool_pool::remote::layout::Layout;
use rdmapool_pool::Result;
use std::collections::{HashMap, HashSet};

mod repairing;
pub(super) use repairing::Repairing;
mod view_change;

pub(super) fn layout() -> Layout {
    Layout::new(4 << 20, 1 << 20, 16).unwrap()
}

/// Nodes' regions as bytes, each with its index in chunk 0 and blocks from chunk 1 on.
pub(super) struct Cluster {
    pub(super) regions: HashMap<u32, Vec<u8>>,
    pub(super) replicas: Vec<Replica>,
    next_block: HashMap<u32, u64>,
    pub(super) down: HashSet<u32>,
}

impl Cluster {
    pub(super) fn new(nodes: &[u32]) -> Self {
        let l = layout();
        let index = Index {
            chunk: 0,
            start: l.chunk(0) + 64,
            buckets: ((1 << 20) - 64) / 64,
        };
        Self {
            regions: nodes
                .iter()
                .map(|&n| (n, vec![0; l.len as usize]))
                .collect(),
            replicas: nodes
                .iter()
                .map(|&node| Replica {
                    node,
                    incarnation: 1,
                    layout: l,
                    index,
                })
                .collect(),
            next_block: nodes.iter().map(|&n| (n, l.chunk(1))).collect(),
            down: HashSet::new(),
        }
    }

    /// Node `node` as a replica (every simulated node has the same layout and index).
    pub(super) fn replica(&self, node: u32) -> Replica {
        Replica {
            node,
            ..self.replicas[0]
        }
    }

    /// Node `node` restarted: its memory is empty again (index and blocks).
    pub(super) fn wipe(&mut self, node: u32) {
        if let Some(r) = self.regions.get_mut(&node) {
            r.fill(0);
        }
    }

    fn alloc(&mut self, node: u32, len: u64) -> Option<u64> {
        if self.down.contains(&node) {
            return None;
        }
        let next = self.next_block.get_mut(&node)?;
        let at = *next;
        *next += len.next_multiple_of(64);
        (*next <= layout().len).then_some(at)
    }

    /// Writes a block for `key` on `node` directly and points a free slot of its bucket at
    /// it (a put from outside the machines, to set a scene).
    pub(super) fn plant(&mut self, node: u32, key: &[u8], value: &[u8], version: Version) -> u64 {
        let block = encode_block(key, value, version, Kind::Value).unwrap();
        let at = self.alloc(node, block.len() as u64).unwrap();
        let r = self.replica(node);
        let h = KeyHash::of(key);
        let bucket = r.bucket_at(h) as usize;
        let region = self.regions.get_mut(&node).unwrap();
        region[at as usize..at as usize + block.len()].copy_from_slice(&block);
        let word = Slot::new(h, at, block_len(key, value.len() as u64))
            .unwrap()
            .word();
        let free = (0..8)
            .find(|i| region[bucket + i * 8..bucket + i * 8 + 8] == [0; 8])
            .unwrap();
        region[bucket + free * 8..bucket + free * 8 + 8].copy_from_slice(&word.to_le_bytes());
        at
    }

    pub(super) fn read(&self, r: &Read) -> Option<Vec<u8>> {
        if self.down.contains(&r.node) {
            return None;
        }
        let region = &self.regions[&r.node];
        let end = ((r.at + r.len) as usize).min(region.len());
        Some(region.get(r.at as usize..end)?.to_vec())
    }

    /// Runs a get; a tombstone is "not found".
    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut g = Get::new(key, &self.replicas);
        let mut bytes: Vec<Option<Vec<u8>>> = Vec::new();
        loop {
            let replies: Vec<Option<&[u8]>> = bytes.iter().map(Option::as_deref).collect();
            match g.advance(&replies)? {
                GetStep::Read(reads) => bytes = reads.iter().map(|r| self.read(r)).collect(),
                GetStep::Done(None) => return Ok(None),
                GetStep::Done(Some((_, f))) if f.block.tombstone => return Ok(None),
                GetStep::Done(Some((at, f))) => {
                    let b = match at {
                        super::lookup::Src::Read(i) => bytes[i].clone().unwrap(),
                        super::lookup::Src::Early(e) => g.take_early(e),
                    };
                    return Ok(Some(b[f.block.value].to_vec()));
                }
            }
        }
    }

    /// A compare-and-swap of the word at `at` of `node`: the old value (`None`: down).
    pub(super) fn cas(&mut self, node: u32, at: u64, expected: u64, swap: u64) -> Option<u64> {
        if self.down.contains(&node) {
            return None;
        }
        let region = self.regions.get_mut(&node)?;
        let w = &mut region[at as usize..at as usize + 8];
        let old = u64::from_le_bytes(w.try_into().ok()?);
        if old == expected {
            w.copy_from_slice(&swap.to_le_bytes());
        }
        Some(old)
    }

    /// Every slot word of `key`'s bucket on `node`.
    pub(super) fn bucket(&self, node: u32, key: &[u8]) -> Vec<u64> {
        let r = self.replica(node);
        let at = r.bucket_at(KeyHash::of(key)) as usize;
        self.regions[&node][at..at + 64]
            .chunks(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect()
    }
}

/// A put in progress in the simulation: the machine, the value, and its pending step.
pub(super) struct Running {
    pub(super) put: Put,
    value: Vec<u8>,
    key: Vec<u8>,
    step: Option<PutStep>,
    pub(super) outcome: Option<Result<PutDone>>,
}

impl Running {
    pub(super) fn put(c: &Cluster, key: &[u8], value: &[u8], writer: u64) -> Self {
        Self::new(c, key, value, false, writer)
    }

    /// A put whose first lookup also reads the blocks at `hints` ([`Put::hinted`]).
    pub(super) fn put_hinted(
        c: &Cluster,
        key: &[u8],
        value: &[u8],
        writer: u64,
        hints: &[(u32, u64)],
    ) -> Self {
        let put = Put::new(
            key,
            ValueDigest::of(value),
            Kind::Value,
            writer,
            &c.replicas,
        )
        .expect("valid put")
        .hinted(hints);
        Self::start(put, key, value)
    }

    pub(super) fn remove(c: &Cluster, key: &[u8], writer: u64) -> Self {
        Self::new(c, key, b"", true, writer)
    }

    fn new(c: &Cluster, key: &[u8], value: &[u8], tombstone: bool, writer: u64) -> Self {
        let kind = if tombstone {
            Kind::Tombstone
        } else {
            Kind::Value
        };
        let put =
            Put::new(key, ValueDigest::of(value), kind, writer, &c.replicas).expect("valid put");
        Self::start(put, key, value)
    }

    /// A repair's copy of `key`'s `version` onto `replicas`.
    pub(super) fn copy(
        replicas: &[Replica],
        key: &[u8],
        value: &[u8],
        kind: Kind,
        version: Version,
    ) -> Self {
        let put =
            Put::copy(key, ValueDigest::of(value), kind, version, replicas).expect("valid copy");
        Self::start(put, key, value)
    }

    pub(super) fn start(mut put: Put, key: &[u8], value: &[u8]) -> Self {
        let step = put.advance(Reply::Start);
        let mut r = Self {
            put,
            value: value.to_vec(),
            key: key.to_vec(),
            step: None,
            outcome: None,
        };
        r.take(step);
        r
    }

    fn take(&mut self, step: Result<PutStep>) {
        match step {
            Ok(PutStep::Done(d)) => self.outcome = Some(Ok(d)),
            Ok(s) => self.step = Some(s),
            Err(e) => self.outcome = Some(Err(e)),
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// The pending step's kind, for tests that stop a put at a chosen point.
    pub(super) fn next_is_swap(&self) -> bool {
        matches!(self.step, Some(PutStep::Swap(_)))
    }

    /// Whether the pending step is a round of READs.
    pub(super) fn next_is_read(&self) -> bool {
        matches!(self.step, Some(PutStep::Read(_)))
    }

    /// Performs the pending step on the cluster (every operation of it, one at a time, as
    /// they would land) and advances the machine.
    pub(super) fn step(&mut self, c: &mut Cluster) {
        let Some(step) = self.step.take() else { return };
        let next = match step {
            PutStep::Read(reads) => {
                let bytes: Vec<Option<Vec<u8>>> = reads.iter().map(|r| c.read(r)).collect();
                let replies: Vec<Option<&[u8]>> = bytes.iter().map(Option::as_deref).collect();
                self.put.advance(Reply::Bytes(&replies))
            }
            PutStep::Alloc { nodes, len } => {
                let offsets: Vec<Option<u64>> = nodes.iter().map(|&n| c.alloc(n, len)).collect();
                self.put.advance(Reply::Offsets(&offsets))
            }
            PutStep::Write(writes) => {
                let ok: Vec<bool> = writes
                    .iter()
                    .map(|w| {
                        if c.down.contains(&w.node) {
                            return false;
                        }
                        let region = c.regions.get_mut(&w.node).unwrap();
                        let mut at = w.at as usize;
                        for part in [&w.header[..], &self.key, &self.value] {
                            region[at..at + part.len()].copy_from_slice(part);
                            at += part.len();
                        }
                        true
                    })
                    .collect();
                self.put.advance(Reply::Done(&ok))
            }
            PutStep::Swap(swaps) => {
                let old: Vec<Option<u64>> = swaps
                    .iter()
                    .map(|s| c.cas(s.node, s.at, s.expected, s.swap))
                    .collect();
                self.put.advance(Reply::Words(&old))
            }
            PutStep::Done(_) => unreachable!("a finished put has no step"),
        };
        self.take(next);
    }

    /// Runs to the end.
    pub(super) fn run(mut self, c: &mut Cluster) -> Result<PutDone> {
        while !self.finished() {
            self.step(c);
        }
        self.outcome.take().unwrap()
    }
}
