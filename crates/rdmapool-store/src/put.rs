//! A put (and a remove, which puts a tombstone) as a state machine without I/O
//! (docs/STORE.md section 6):
//!
//! 1. [`Lookup`] the key on every replica: the newest version anywhere is the one to beat.
//! 2. Allocate a block on every replica, beside the first lookup's reads (once; a retried
//!    put reuses them), then WRITE each: header (version `(newest.seq + 1, writer)`), key,
//!    and the value, the driver's payload (the machine never holds it).
//! 3. `CAS` the primary's slot from the word it read to the new block's. Lost: another put
//!    came first; back to 1. Won: the put's linearization point.
//! 4. On every other replica, replace the slot's word unless it names a version at least as
//!    high; a lost swap there repeats 1 and 4 for that replica alone.
//!
//! Every replica must answer: a replica that fails fails the put (`Error::NodeDown`), which
//! may then already be visible on the primary (as a timed-out write may have landed). The
//! caller retries once membership has moved on, and repair completes what a failed put left.
//! The blocks a put replaced are returned, to be freed after the grace period; its own
//! blocks that were not published are returned too, to be freed at once.

use super::decide::{empty_slot, next_version, replaces};
use super::format::{
    block_len, encode_header_for, KeyHash, Kind, Slot, ValueDigest, Version, HEADER_LEN,
};
use super::lookup::{read_ops, replies, Looked, Lookup, Replica};
use rdmapool_pool::remote::step::{Answer, Io, Machine, Op, Step};
use rdmapool_pool::{Error, Result};
use std::time::Instant;

mod steps;
pub(crate) use steps::{BlockAt, PutDone, Swap};

/// How many times a put starts again after losing its primary swap before it gives up.
pub(crate) const MAX_ROUNDS: u32 = 64;

#[derive(Debug)]
enum State {
    Buckets {
        lookup: Lookup,
    },
    Blocks {
        lookup: Lookup,
    },
    /// Every replica's block written, and the primary's swap right after its write.
    Publishing {
        looked: Looked,
        writes: Vec<(usize, usize)>,
        primary: Asked,
    },
    /// Swaps on replicas after the primary's (every replica's for a copy, after its
    /// write), each followed by its fence read when the put is [fenced](Put::fenced).
    Backups {
        writes: Vec<(usize, usize)>,
        swaps: Vec<Asked>,
    },
    Finished,
}

/// A swap a step asked for: on which replica, and where its answers are in the step.
#[derive(Debug, Clone, Copy)]
struct Asked {
    replica: usize,
    swap: Swap,
    /// The swap's answer.
    at: usize,
    /// The fence read's answer, when the put is fenced.
    fence: Option<usize>,
}

/// One put or remove (see the module's text).
pub(crate) struct Put {
    key: Vec<u8>,
    h: KeyHash,
    digest: ValueDigest,
    kind: Kind,
    writer: u64,
    replicas: Vec<Replica>,
    /// This put's block on each replica, once allocated.
    blocks: Vec<u64>,
    /// Blocks allocated and not (yet) this put's: those of the first step, until the put
    /// takes them, and all of them when the allocation failed on some replica.
    orphans: Vec<BlockAt>,
    /// The answers to the allocations of the first step, one per replica, until the put
    /// takes its blocks.
    early: Vec<Answer>,
    /// The first step was asked for.
    started: bool,
    /// The last step's reads came with the allocations (the first step): how many reads.
    allocating: Option<usize>,
    /// The primary's swap was won: the put is visible.
    published: bool,
    /// A repair's copy of an existing version ([`Put::copy`]): no primary, every replica
    /// is a backup.
    copy: bool,
    /// In the backups' phase: a lookup answers for the pending replicas alone.
    backing: bool,
    version: Version,
    /// A version the put's must exceed whatever it finds (a retry after its view changed
    /// under it, or a put while data moves: docs/STORE.md section 4).
    floor: Option<Version>,
    /// The floor's version is a removal's tombstone ([`Put::at_least`]).
    floor_removed: bool,
    rounds: u32,
    /// Steps of operations asked for: the put's round trips.
    trips: u32,
    /// Read this word (the view's fence word) on each replica right after this put's swap
    /// there, in the same list ([`Put::fenced`]).
    fence_at: Option<u64>,
    /// Replicas (by position) that still need this put's version.
    pending: Vec<usize>,
    done: PutDone,
    state: State,
}

impl Put {
    /// A put of a value whose digest is `digest` under `key` by client `writer` on
    /// `replicas` (best first: the first is the primary), as a block of `kind`; a
    /// [`Kind::Tombstone`] is a remove (`digest` of the empty value).
    pub(crate) fn new(
        key: &[u8],
        digest: ValueDigest,
        kind: Kind,
        writer: u64,
        replicas: &[Replica],
    ) -> Result<Self> {
        let mut header = [0; HEADER_LEN];
        encode_header_for(&mut header, key, &digest, Version { seq: 1, writer }, kind)?;
        if replicas.is_empty() {
            return Err(Error::NoServer {
                reason: "a store put needs at least one live replica".into(),
            });
        }
        let lookup = Lookup::new(key, replicas);
        Ok(Self {
            key: key.to_vec(),
            h: KeyHash::of(key),
            digest,
            kind,
            writer,
            replicas: replicas.to_vec(),
            blocks: Vec::new(),
            orphans: Vec::new(),
            early: Vec::new(),
            started: false,
            allocating: None,
            published: false,
            copy: false,
            backing: false,
            version: Version { seq: 0, writer },
            floor: None,
            floor_removed: false,
            rounds: 0,
            trips: 0,
            fence_at: None,
            pending: (0..replicas.len()).collect(),
            done: Self::empty_done(),
            state: State::Buckets { lookup },
        })
    }

    /// A repair's copy of `key`'s existing `version` (its value's digest `digest`) onto
    /// `replicas`: a block with exactly that version's bytes is written on each, and put
    /// into the key's slot there unless the slot already names a version at least as high
    /// (docs/STORE.md section 7). There is no primary: the copy is "published" as soon as
    /// its first swap is sent, so a copy given up after that leaves its blocks to repair.
    pub(crate) fn copy(
        key: &[u8],
        digest: ValueDigest,
        kind: Kind,
        version: Version,
        replicas: &[Replica],
    ) -> Result<Self> {
        let mut put = Self::new(key, digest, kind, version.writer, replicas)?;
        put.copy = true;
        put.version = version;
        Ok(put)
    }

    /// This put, taking a version above `floor` whatever it finds on its replicas: a put
    /// retried after its view changed, above the version it published under the old one,
    /// or a put while data moves, above the newest on the previous placement.
    ///
    /// A remove treats a floor above what its replicas hold as a version of the key that
    /// exists elsewhere: it writes its tombstone even when its replicas hold nothing (the
    /// repair that moves the key would bring the value back otherwise), unless
    /// `floor_removed` says the floor's version is itself a removal's tombstone.
    pub(crate) fn at_least(mut self, floor: Option<Version>, floor_removed: bool) -> Self {
        self.floor = floor;
        self.floor_removed = floor_removed;
        self
    }

    /// The same put, also reading beside its first buckets the blocks at `hints`
    /// ([`Lookup::hinted`]): a lookup of one round of reads when they are still current.
    pub(crate) fn hinted(mut self, hints: &[(u32, u64)]) -> Self {
        if let State::Buckets { lookup } = std::mem::replace(&mut self.state, State::Finished) {
            self.state = State::Buckets {
                lookup: lookup.hinted(hints),
            };
        }
        self
    }

    /// The blocks this put allocated: the caller frees them if it gives the put up (an
    /// error from its [`Machine::advance`] or its own deadline) while it is not
    /// [`published`](Put::published).
    pub(crate) fn allocated(&self) -> Vec<BlockAt> {
        self.replicas
            .iter()
            .zip(&self.blocks)
            .map(|(r, &b)| (r.node, b))
            .chain(self.orphans.iter().copied())
            .collect()
    }

    /// Whether the primary's swap was won: the version is visible, and a put given up
    /// after this leaves its blocks to repair (some replicas may name them).
    pub(crate) fn published(&self) -> bool {
        self.published
    }

    /// This put, reading the word at `at` (the view's fence word, docs/STORE.md section 4)
    /// on each replica right after its swap there, in the same list of operations: RC
    /// order makes the read see the word as it was after the swap, with no round of its
    /// own. The words read are in [`PutDone::fences`].
    pub(crate) fn fenced(mut self, at: u64) -> Self {
        self.fence_at = Some(at);
        self
    }

    /// The round trips this put has taken: the steps of operations it asked for.
    pub(crate) fn round_trips(&self) -> u32 {
        self.trips
    }

    /// Bytes of this put's block.
    pub(crate) fn block_len(&self) -> u64 {
        block_len(&self.key, self.digest.len())
    }

    fn down(&self, i: usize, what: &str) -> Error {
        Error::NodeDown {
            node: self.replicas[i].node,
            reason: format!("store put: {what} failed"),
        }
    }

    fn first_failed<T>(&self, replies: &[Option<T>], what: &str) -> Result<()> {
        match replies.iter().position(Option::is_none) {
            Some(i) => Err(self.down(self.pending.get(i).copied().unwrap_or(i), what)),
            None => Ok(()),
        }
    }

    /// The replicas of `pending`, for a lookup there.
    fn lookup_pending(&self) -> Lookup {
        let rs: Vec<Replica> = self.pending.iter().map(|&i| self.replicas[i]).collect();
        Lookup::new(&self.key, &rs)
    }

    /// The swap that puts this put's block into replica `i`'s slot, given what it holds;
    /// `None` if it holds a version at least as high.
    fn swap_for(&self, i: usize, held: &super::lookup::Held) -> Result<Option<Swap>> {
        let r = &self.replicas[i];
        if !replaces(held.current.map(|(_, _, v)| v), self.version) {
            return Ok(None);
        }
        let (slot, expected, replacing) = match held.current {
            Some((slot, word, v)) => (slot, word, Some(v)),
            None => (
                empty_slot(&held.bucket).ok_or(Error::IndexFull { node: r.node })?,
                0,
                None,
            ),
        };
        Ok(Some(Swap {
            node: r.node,
            at: r.bucket_at(self.h) + slot as u64 * 8,
            expected,
            swap: Slot::new(self.h, self.blocks[i], self.block_len())?.word(),
            replacing,
        }))
    }

    fn read_step(
        &mut self,
        mut lookup: Lookup,
        replies: &[Option<&[u8]>],
    ) -> Result<Step<PutDone>> {
        let buckets = replies.len().min(lookup.replica_count());
        self.first_failed(&replies[..buckets], "reading the key's bucket")?;
        let reads = lookup.on_buckets(replies);
        if reads.is_empty() {
            // No candidate, or every one read early beside the buckets.
            return self.looked(&lookup, &[]);
        }
        self.state = State::Blocks { lookup };
        Ok(self.ask(read_ops(&reads)))
    }

    /// From the candidate blocks' bytes (the last replies, or read early): what the
    /// replicas hold, then [`Put::decide`].
    fn looked(&mut self, lookup: &Lookup, replies: &[Option<&[u8]>]) -> Result<Step<PutDone>> {
        let looked = lookup.on_blocks(replies);
        if looked.unread {
            return Err(self.down(0, "reading a candidate block"));
        }
        if !self.backing && !self.copy {
            self.done.superseded = manifests(lookup, &looked, replies);
        }
        self.decide(looked)
    }

    /// From what the first lookup found: the version, then the blocks and the writes.
    fn decide(&mut self, looked: Looked) -> Result<Step<PutDone>> {
        if self.backing {
            return self.backups(looked);
        }
        if self.copy {
            return self.take_blocks(looked);
        }
        let newest = looked.newest();
        let newest_is_tombstone = looked
            .found
            .iter()
            .filter(|f| Some(f.block.version) == newest)
            .any(|f| f.block.tombstone);
        // A floor above what the replicas hold is a version of the key elsewhere (the
        // previous placement while keys move, or this put's own under an older view).
        let floor_above = self.floor.is_some_and(|f| newest.is_none_or(|n| f > n));
        let nothing_here = newest.is_none() || newest_is_tombstone;
        if self.kind == Kind::Tombstone && nothing_here && (!floor_above || self.floor_removed) {
            // Nothing to remove.
            self.state = State::Finished;
            let mut done = std::mem::replace(&mut self.done, Self::empty_done());
            done.unused = self.allocated();
            return Ok(Step::Done(done));
        }
        self.version = next_version(newest.max(self.floor), self.writer);
        if self.blocks.is_empty() {
            return self.take_blocks(looked);
        }
        self.write(looked)
    }

    /// Takes the blocks the first step allocated, then writes them. A replica without room
    /// fails the put `RemoteExhausted` (before any that is down fails it `NodeDown`); the
    /// blocks allocated elsewhere stay [`allocated`](Put::allocated), for the caller.
    fn take_blocks(&mut self, looked: Looked) -> Result<Step<PutDone>> {
        let early = std::mem::take(&mut self.early);
        if early.len() != self.replicas.len() {
            return Err(Error::Core(rdmapool_pool::CoreError::Malformed {
                what: "store put allocation",
                reason: format!(
                    "{} answers for {} replicas",
                    early.len(),
                    self.replicas.len()
                ),
            }));
        }
        if early.contains(&Answer::Offset(None)) {
            return Err(Error::RemoteExhausted {
                size: self.block_len(),
            });
        }
        let mut blocks = Vec::with_capacity(early.len());
        for (i, a) in early.iter().enumerate() {
            match a {
                Answer::Offset(Some(at)) => blocks.push(*at),
                _ => return Err(self.down(i, "allocating a block")),
            }
        }
        self.blocks = blocks;
        self.orphans.clear();
        self.write(looked)
    }

    fn empty_done() -> PutDone {
        PutDone {
            version: None,
            replaced: Vec::new(),
            unused: Vec::new(),
            superseded: Vec::new(),
            installed: Vec::new(),
            fences: Vec::new(),
        }
    }

    /// The step that publishes: every replica's block written, and on the primary its
    /// swap right after its write, in the same list (RC order: the block is whole before
    /// the slot names it), then the fence read. A copy (no primary) swaps every replica
    /// that way.
    fn write(&mut self, looked: Looked) -> Result<Step<PutDone>> {
        let mut header = [0; HEADER_LEN];
        encode_header_for(
            &mut header,
            &self.key,
            &self.digest,
            self.version,
            self.kind,
        )?;
        // The header and the key; the value follows as the driver's payload.
        let mut head = Vec::with_capacity(HEADER_LEN + self.key.len());
        head.extend_from_slice(&header);
        head.extend_from_slice(&self.key);
        let mut ops = Vec::with_capacity(self.replicas.len() * 3);
        let mut writes = Vec::with_capacity(self.replicas.len());
        let mut swaps = Vec::new();
        for i in 0..self.replicas.len() {
            let (node, at) = (self.replicas[i].node, self.blocks[i]);
            writes.push((i, ops.len()));
            ops.push(Op {
                node,
                io: Io::WriteWithPayload {
                    at,
                    head: head.clone(),
                },
            });
            if !self.copy && i > 0 {
                continue;
            }
            match self.swap_for(i, &looked.held[i])? {
                Some(swap) => swaps.push(self.swap_ops(i, swap, &mut ops)),
                None if self.copy => self.done.unused.push((node, at)),
                // The primary holds a newer version than the lookup's newest: it moved
                // on meanwhile. Start again.
                None => return self.again(),
            }
        }
        if self.copy {
            // Published as soon as its first swap is sent (a copy given up after that
            // leaves its blocks to repair).
            self.published = !swaps.is_empty();
            self.backing = true;
            self.pending.clear();
            if swaps.is_empty() {
                return Ok(self.finish());
            }
            self.state = State::Backups { writes, swaps };
            return Ok(self.ask(ops));
        }
        let primary = swaps.pop().expect("the primary's swap");
        self.state = State::Publishing {
            looked,
            writes,
            primary,
        };
        Ok(self.ask(ops))
    }

    /// Adds `swap` (on replica `i`) to `ops`, then its fence read when the put is fenced.
    fn swap_ops(&self, i: usize, swap: Swap, ops: &mut Vec<Op>) -> Asked {
        let at = ops.len();
        ops.push(swap.op());
        let fence = self.fence_at.map(|word| {
            ops.push(Op {
                node: swap.node,
                io: Io::Read { at: word, len: 8 },
            });
            at + 1
        });
        Asked {
            replica: i,
            swap,
            at,
            fence,
        }
    }

    /// A step of operations (counted as a round trip).
    fn ask(&mut self, ops: Vec<Op>) -> Step<PutDone> {
        self.trips += 1;
        Step::Do(ops)
    }

    /// Notes the fence word read after this put's swap `asked`.
    fn fence_read(&mut self, asked: &Asked, answers: &[Answer]) {
        let Some(f) = asked.fence else { return };
        let word = match answers.get(f) {
            Some(a @ Answer::Bytes(b)) if b.len() == 8 => Some(a.word()),
            _ => None,
        };
        let node = asked.swap.node;
        self.done.fences.retain(|&(n, _)| n != node);
        self.done.fences.push((node, word));
    }

    /// The first write of `writes` that did not land: the error that fails the put.
    fn failed_write(&self, writes: &[(usize, usize)], answers: &[Answer]) -> Option<Error> {
        writes
            .iter()
            .find(|&&(_, at)| answers.get(at) != Some(&Answer::Written))
            .map(|&(i, _)| self.down(i, "writing the block"))
    }

    /// The swaps on the replicas still pending after the primary (or after a lost swap).
    fn backups(&mut self, looked: Looked) -> Result<Step<PutDone>> {
        let mut ops = Vec::new();
        let mut swaps = Vec::new();
        for (k, held) in looked.held.iter().enumerate() {
            let i = self.pending[k];
            match self.swap_for(i, held)? {
                Some(s) => swaps.push(self.swap_ops(i, s, &mut ops)),
                None => self
                    .done
                    .unused
                    .push((self.replicas[i].node, self.blocks[i])),
            }
        }
        self.pending.clear();
        if swaps.is_empty() {
            return Ok(self.finish());
        }
        self.state = State::Backups {
            writes: Vec::new(),
            swaps,
        };
        Ok(self.ask(ops))
    }

    fn finish(&mut self) -> Step<PutDone> {
        self.state = State::Finished;
        let mut done = std::mem::replace(&mut self.done, Self::empty_done());
        done.version = Some(self.version);
        Step::Done(done)
    }

    fn replaced(&mut self, swap: &Swap, old: u64) {
        self.done.installed.push((swap.node, swap.swap));
        if let (Some(s), Some(v)) = (Slot::from_word(old), swap.replacing) {
            self.done.replaced.push((swap.node, s.offset, v));
        }
    }

    /// The next step, from the answers to the last one (none the first time).
    fn step(&mut self, answers: &[Answer]) -> Result<Step<PutDone>> {
        let state = std::mem::replace(&mut self.state, State::Finished);
        match state {
            State::Buckets { lookup } if !self.started => {
                // The first step: the buckets, and a block on every replica (what is read
                // does not change its size), so the allocation costs no round of its own.
                self.started = true;
                let reads = lookup.bucket_reads();
                let mut ops = read_ops(&reads);
                self.allocating = Some(reads.len());
                ops.extend(self.replicas.iter().map(|r| Op {
                    node: r.node,
                    io: Io::Alloc {
                        len: self.block_len(),
                    },
                }));
                self.state = State::Buckets { lookup };
                Ok(self.ask(ops))
            }
            State::Buckets { lookup } => {
                let reads = match self.allocating.take() {
                    Some(n) => {
                        let (reads, allocs) = answers.split_at(n.min(answers.len()));
                        self.orphans = (self.replicas.iter().zip(allocs))
                            .filter_map(|(r, a)| match a {
                                Answer::Offset(Some(at)) => Some((r.node, *at)),
                                _ => None,
                            })
                            .collect();
                        self.early = allocs.to_vec();
                        reads
                    }
                    None => answers,
                };
                self.read_step(lookup, &replies(reads))
            }
            State::Blocks { lookup } => self.looked(&lookup, &replies(answers)),
            State::Publishing {
                looked,
                writes,
                primary,
            } => {
                // The primary first: its write, its swap (RC order: after the write), its
                // fence read.
                if answers.get(writes[0].1) != Some(&Answer::Written) {
                    return Err(self.down(0, "writing the block"));
                }
                let won = match answers.get(primary.at) {
                    Some(&Answer::Word(old)) if old == primary.swap.expected => {
                        self.published = true;
                        self.backing = true;
                        self.replaced(&primary.swap, old);
                        self.fence_read(&primary, answers);
                        true
                    }
                    Some(&Answer::Word(_)) => false,
                    _ => return Err(self.down(0, "the primary's swap")),
                };
                if let Some(e) = self.failed_write(&writes, answers) {
                    return Err(e);
                }
                if !won {
                    return self.again();
                }
                self.pending = (1..self.replicas.len()).collect();
                if self.pending.is_empty() {
                    return Ok(self.finish());
                }
                // The first lookup's view of the backups; a swap it makes that is lost is
                // looked up again.
                let rest = Looked {
                    held: looked.held[1..].to_vec(),
                    ..Looked::default()
                };
                self.backups(rest)
            }
            State::Backups { writes, swaps } => {
                if let Some(e) = self.failed_write(&writes, answers) {
                    return Err(e);
                }
                for asked in &swaps {
                    match answers.get(asked.at) {
                        Some(&Answer::Word(o)) if o == asked.swap.expected => {
                            self.replaced(&asked.swap, o);
                            self.fence_read(asked, answers);
                        }
                        Some(&Answer::Word(_)) => self.pending.push(asked.replica),
                        _ => return Err(self.down(asked.replica, "a replica's swap")),
                    }
                }
                if self.pending.is_empty() {
                    return Ok(self.finish());
                }
                self.rounds += 1;
                if self.rounds > MAX_ROUNDS {
                    return Err(self.contended());
                }
                let lookup = self.lookup_pending();
                let reads = lookup.bucket_reads();
                self.state = State::Buckets { lookup };
                Ok(self.ask(read_ops(&reads)))
            }
            State::Finished => Err(Error::OutcomeTaken),
        }
    }

    /// The primary moved on: look everything up again (the blocks are kept).
    fn again(&mut self) -> Result<Step<PutDone>> {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            return Err(self.contended());
        }
        let lookup = Lookup::new(&self.key, &self.replicas);
        let reads = lookup.bucket_reads();
        self.state = State::Buckets { lookup };
        Ok(self.ask(read_ops(&reads)))
    }

    fn contended(&self) -> Error {
        Error::Contended {
            what: "store put",
            rounds: MAX_ROUNDS,
        }
    }
}

impl Machine for Put {
    type Output = PutDone;
    type Context = ();

    fn advance(&mut self, _: &mut (), _now: Instant, answers: &[Answer]) -> Result<Step<PutDone>> {
        self.step(answers)
    }
}

/// The value of each manifest a lookup found, one per version.
fn manifests(lookup: &Lookup, looked: &Looked, replies: &[Option<&[u8]>]) -> Vec<Vec<u8>> {
    let mut seen: Vec<Version> = Vec::new();
    let mut out = Vec::new();
    for (f, &src) in looked.found.iter().zip(&looked.found_at) {
        if f.block.kind != Kind::Manifest || seen.contains(&f.block.version) {
            continue;
        }
        if let Some(bytes) = lookup.bytes(src, replies) {
            if let Some(value) = bytes.get(f.block.value.clone()) {
                seen.push(f.block.version);
                out.push(value.to_vec());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
