//! A simulated cluster for the store's machines: each node's region the pool's
//! [`SimRegion`] (one operation at a time), a bump allocator for blocks beside it, and
//! nodes that can be down. [`Cluster::perform`] performs an operation of the step
//! vocabulary as the pool's real driver does; the runs here drive machines with it, and
//! tests interleave several machines step by step.

use super::format::{block_len, encode_block, KeyHash, Kind, Slot, ValueDigest, Version};
use super::get::Get;
use super::lookup::{Read, Replica};
use super::put::{Put, PutDone};
use super::root::Index;
use rdmapool_pool::remote::layout::Layout;
use rdmapool_pool::remote::sim::SimRegion;
use rdmapool_pool::remote::step::{Answer, Io, Machine, Op, Step};
use rdmapool_pool::Result;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

mod repairing;
pub(super) use repairing::Repairing;
mod view_change;

pub(super) fn layout() -> Layout {
    Layout::new(4 << 20, 1 << 20, 16).unwrap()
}

/// Nodes' regions as bytes, each with its index in chunk 0 and blocks from chunk 1 on.
pub(super) struct Cluster {
    pub(super) regions: HashMap<u32, SimRegion>,
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
            regions: nodes.iter().map(|&n| (n, SimRegion::new(l, 1))).collect(),
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
        if let Some(r) = self.regions.get(&node) {
            r.wipe();
        }
    }

    /// A block of `len` bytes on `node`, as an allocation of the step vocabulary answers
    /// (`None`: down, or no room).
    pub(super) fn alloc(&mut self, node: u32, len: u64) -> Option<u64> {
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
        let mut region = self.regions[&node].bytes();
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

    /// Performs `op` as the pool's driver does: [`Answer::Failed`] on a node that is
    /// down; an allocation from the node's bump allocator; a write with a payload writes
    /// `payload` after its head.
    pub(super) fn perform(&mut self, op: &Op, payload: &[u8]) -> Answer {
        match &op.io {
            Io::Alloc { len } if !self.down.contains(&op.node) => {
                Answer::Offset(self.alloc(op.node, *len))
            }
            Io::WriteWithPayload { at, head } if !self.down.contains(&op.node) => {
                match self.regions.get(&op.node) {
                    Some(r) => r.write(*at, &[head, payload]),
                    None => Answer::Failed,
                }
            }
            _ => self.answer(op),
        }
    }

    /// Performs `op`, one that neither allocates nor writes a payload (a read, a write, a
    /// compare-and-swap), on the node's region: [`Answer::Failed`] on a node that is down.
    pub(super) fn answer(&self, op: &Op) -> Answer {
        if self.down.contains(&op.node) {
            return Answer::Failed;
        }
        self.regions
            .get(&op.node)
            .map_or(Answer::Failed, |r| r.apply(&op.io))
    }

    /// The bytes of `r` (`None`: its node is down).
    pub(super) fn read(&self, r: &Read) -> Option<Vec<u8>> {
        match self.answer(&r.op()) {
            Answer::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// Runs a get; a tombstone is "not found".
    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut g = Get::new(key, &self.replicas);
        let now = Instant::now();
        let mut answers: Vec<Answer> = Vec::new();
        loop {
            match g.advance(&mut (), now, &answers)?.listed() {
                Step::Do(ops) => answers = ops.iter().map(|op| self.answer(op)).collect(),
                Step::Done(None) => return Ok(None),
                Step::Done(Some((_, f))) if f.block.tombstone => return Ok(None),
                Step::Done(Some((at, f))) => {
                    let b = match at {
                        super::lookup::Src::Read(i) => answers[i].bytes().unwrap().to_vec(),
                        super::lookup::Src::Early(e) => g.take_early(e),
                    };
                    return Ok(Some(b[f.block.value].to_vec()));
                }
                Step::One(_) | Step::Sleep(_) | Step::Wait => answers.clear(),
            }
        }
    }

    /// A compare-and-swap of the word at `at` of `node`: the old value (`None`: down).
    pub(super) fn cas(&mut self, node: u32, at: u64, expected: u64, swap: u64) -> Option<u64> {
        let op = Op {
            node,
            io: Io::Cas { at, expected, swap },
        };
        match self.perform(&op, &[]) {
            Answer::Word(w) => Some(w),
            _ => None,
        }
    }

    /// Every slot word of `key`'s bucket on `node`.
    pub(super) fn bucket(&self, node: u32, key: &[u8]) -> Vec<u64> {
        let r = self.replica(node);
        let at = r.bucket_at(KeyHash::of(key));
        (0..8)
            .map(|i| self.regions[&node].load(at + i * 8))
            .collect()
    }
}

/// A put in progress in the simulation: the machine, the value, and its pending step.
pub(super) struct Running {
    pub(super) put: Put,
    value: Vec<u8>,
    /// The operations it asked for and has not been answered.
    step: Option<Vec<Op>>,
    /// The answers to the pending step's first operations, performed one at a time
    /// ([`Running::step_op`]).
    answered: Vec<Answer>,
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
        Self::start(put, value)
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
        Self::start(put, value)
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
        Self::start(put, value)
    }

    pub(super) fn start(mut put: Put, value: &[u8]) -> Self {
        let step = put.advance(&mut (), Instant::now(), &[]);
        let mut r = Self {
            put,
            value: value.to_vec(),
            step: None,
            answered: Vec::new(),
            outcome: None,
        };
        r.take(step);
        r
    }

    fn take(&mut self, step: Result<Step<PutDone>>) {
        match step {
            Ok(Step::Done(d)) => self.outcome = Some(Ok(d)),
            Ok(Step::Do(ops)) => self.step = Some(ops),
            Ok(Step::One(op)) => self.step = Some(vec![op]),
            Ok(Step::Sleep(_) | Step::Wait) => self.step = Some(Vec::new()),
            Err(e) => self.outcome = Some(Err(e)),
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// Whether the pending step swaps slot words (tests stop a put at a chosen point).
    pub(super) fn next_is_swap(&self) -> bool {
        self.step
            .as_ref()
            .is_some_and(|ops| ops.iter().any(|op| matches!(op.io, Io::Cas { .. })))
    }

    /// The nodes the pending step allocates on.
    pub(super) fn pending_allocs(&self) -> Vec<u32> {
        self.step
            .iter()
            .flatten()
            .filter(|op| matches!(op.io, Io::Alloc { .. }))
            .map(|op| op.node)
            .collect()
    }

    /// Whether the pending step reads.
    pub(super) fn next_is_read(&self) -> bool {
        self.step
            .as_ref()
            .is_some_and(|ops| ops.iter().any(|op| matches!(op.io, Io::Read { .. })))
    }

    /// Performs the pending step on the cluster (every operation of it, one at a time, as
    /// they would land) and advances the machine.
    pub(super) fn step(&mut self, c: &mut Cluster) {
        let Some(ops) = self.step.take() else { return };
        let answers: Vec<Answer> = ops.iter().map(|op| c.perform(op, &self.value)).collect();
        let next = self.put.advance(&mut (), Instant::now(), &answers);
        self.take(next);
    }

    /// Performs the pending step's next operation alone, and advances the machine once
    /// all of them are answered. Other machines' operations may land between two of a
    /// step's: RC keeps a list in order on its node, but never makes it atomic, and lists
    /// on different nodes land independently (any schedule that keeps each node's order is
    /// one of these, as operations on different nodes commute).
    pub(super) fn step_op(&mut self, c: &mut Cluster) {
        let Some(ops) = self.step.as_ref() else {
            return;
        };
        if let Some(op) = ops.get(self.answered.len()) {
            let a = c.perform(op, &self.value);
            self.answered.push(a);
        }
        if self.answered.len() >= ops.len() {
            self.step = None;
            let answers = std::mem::take(&mut self.answered);
            let next = self.put.advance(&mut (), Instant::now(), &answers);
            self.take(next);
        }
    }

    /// Runs to the end.
    pub(super) fn run(mut self, c: &mut Cluster) -> Result<PutDone> {
        while !self.finished() {
            self.step(c);
        }
        self.outcome.take().unwrap()
    }
}

/// A get in progress in the simulation, its operations performed one at a time as
/// [`Running::step_op`] does a put's.
pub(super) struct Reading {
    get: Get,
    step: Option<Vec<Op>>,
    answered: Vec<Answer>,
    /// What it returned (a tombstone is "not found"), once done.
    pub(super) outcome: Option<Result<Option<Vec<u8>>>>,
}

impl Reading {
    /// A get of `key` on the cluster's replicas, its first step asked.
    pub(super) fn new(c: &Cluster, key: &[u8]) -> Self {
        let mut r = Self {
            get: Get::new(key, &c.replicas),
            step: None,
            answered: Vec::new(),
            outcome: None,
        };
        r.advance(&[]);
        r
    }

    fn advance(&mut self, answers: &[Answer]) {
        match self
            .get
            .advance(&mut (), Instant::now(), answers)
            .map(Step::listed)
        {
            Err(e) => self.outcome = Some(Err(e)),
            Ok(Step::Do(ops)) => self.step = Some(ops),
            Ok(Step::Done(None)) => self.outcome = Some(Ok(None)),
            Ok(Step::Done(Some((_, f)))) if f.block.tombstone => self.outcome = Some(Ok(None)),
            Ok(Step::Done(Some((at, f)))) => {
                let b = match at {
                    super::lookup::Src::Read(i) => answers[i].bytes().map(<[u8]>::to_vec),
                    super::lookup::Src::Early(e) => Some(self.get.take_early(e)),
                };
                self.outcome = Some(Ok(b.map(|b| b[f.block.value].to_vec())));
            }
            Ok(other) => panic!(
                "a get asks only for lists: {:?}",
                std::mem::discriminant(&other)
            ),
        }
    }

    /// Whether it has returned.
    pub(super) fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// Performs the pending step's next operation alone, and advances the machine once all
    /// of them are answered.
    pub(super) fn step_op(&mut self, c: &mut Cluster) {
        let Some(ops) = self.step.as_ref() else {
            return;
        };
        if let Some(op) = ops.get(self.answered.len()) {
            self.answered.push(c.answer(op));
        }
        if self.answered.len() >= ops.len() {
            self.step = None;
            let answers = std::mem::take(&mut self.answered);
            self.advance(&answers);
        }
    }
}

/// A race the proptests run (`put::tests`, `evict::clear::tests`): a cluster of nodes 1 to
/// 3 whose key `b"k"` holds a value `planted` by writer 99 on its first `r` replicas, and
/// `writers` puts of it (each its own value, writer `w + 1`), hinted with the planted
/// slots or not, not started yet.
pub(super) struct Race {
    pub(super) c: Cluster,
    pub(super) planted: PutDone,
    pub(super) values: Vec<Vec<u8>>,
    pub(super) puts: Vec<Running>,
}

impl Race {
    pub(super) fn new(r: usize, writers: usize, hinted: bool) -> Self {
        let mut c = Cluster::new(&[1, 2, 3]);
        c.replicas.truncate(r);
        let planted = Running::put(&c, b"k", b"planted", 99)
            .run(&mut c)
            .expect("the planted put");
        let values: Vec<Vec<u8>> = (0..writers)
            .map(|w| format!("value of {w}").into_bytes())
            .collect();
        let puts = (0..writers)
            .map(|w| {
                let hints = if hinted {
                    planted.installed.clone()
                } else {
                    Vec::new()
                };
                Running::put_hinted(&c, b"k", &values[w], w as u64 + 1, &hints)
            })
            .collect();
        Self {
            c,
            planted,
            values,
            puts,
        }
    }

    /// The value and version of the put with the highest version (every put must have
    /// ended with one).
    pub(super) fn winner(&mut self) -> (Vec<u8>, crate::format::Version) {
        let versions: Vec<crate::format::Version> = self
            .puts
            .iter_mut()
            .map(|p| p.outcome.take().unwrap().unwrap().version.unwrap())
            .collect();
        let top = *versions.iter().max().unwrap();
        let w = versions.iter().position(|&v| v == top).unwrap();
        (self.values[w].clone(), top)
    }

    /// What each of the first `r` nodes, read alone, answers for the key.
    pub(super) fn alone(&mut self, r: usize) -> Vec<Option<Vec<u8>>> {
        (1..=r as u32)
            .map(|node| {
                self.c.down = (1..=3).filter(|&n| n != node).collect();
                self.c.get(b"k").unwrap()
            })
            .collect()
    }
}
