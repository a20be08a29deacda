//! A put (and a remove, which puts a tombstone) as a state machine without I/O
//! (docs/STORE.md section 6):
//!
//! 1. [`Lookup`] the key on every replica: the newest version anywhere is the one to beat.
//!    Allocate a block on every replica beside the lookup's first reads (once; a put made
//!    again reuses them where no slot names them).
//! 2. On every replica at once, in one list each: WRITE the block (header with version
//!    `(newest.seq + 1, writer)`, key, and the value, the driver's payload: the machine
//!    never holds it), then `CAS` the slot from the word read to the new block's, then
//!    read the fence word. The primary's swap decides: lost, another put came first (back
//!    to 1, its version is now the one to beat); won, the put's linearization point.
//! 3. A replica other than the primary whose swap was lost is looked up again, and gets
//!    the put's version unless it holds a version at least as high.
//!
//! With a current hint ([`Put::current`]: the key's slot words on every replica, seen
//! lately, and blocks allocated before) step 1 is skipped: the put is one round trip.
//!
//! Every replica must answer: a replica that fails fails the put (`Error::NodeDown`), which
//! may then already be visible (as a timed-out write may have landed). The caller retries
//! once membership has moved on, and repair completes what a failed put left. The blocks a
//! put replaced are returned, to be freed after the grace period; its own blocks that no
//! slot names are returned too, to be freed at once.

use super::decide::{empty_slot, next_version, replaces};
use super::format::{
    block_len, check_expiry, encode_header_for, named_bytes, stamp_access, Expiry, KeyHash, Kind,
    Pin, Slot, ValueDigest, Version, HEADER_LEN,
};
use super::lookup::{read_ops, replies, Looked, Lookup, Replica};
use rdmapool_pool::remote::step::{Answer, Io, Machine, Op, Step};
use rdmapool_pool::{Error, Result};
use std::time::Instant;

mod steps;
pub(crate) use steps::{BlockAt, PutDone, SlotSeen, Swap};

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
    /// Every replica's block written and its slot swapped right after it, on all replicas
    /// in one step: the primary's swap decides, the others' go beside it (a copy has no
    /// primary: each swap stands alone).
    Publishing {
        writes: Vec<(usize, usize)>,
        swaps: Vec<Asked>,
    },
    /// Swaps on replicas whose swap was lost, after looking them up again, each followed by
    /// its fence read when the put is [fenced](Put::fenced).
    Backups {
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

/// What an allocation a step asked for is for (by replica position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AllocFor {
    /// The put's block there, taken once the first lookup says a block is needed.
    Own(usize),
    /// A new block there, where a slot names this put's last one (its swap there won
    /// while the primary's was lost): the put made again must not write over it.
    Renew(usize),
    /// A block for a later put of this client ([`Put::spare`]).
    Spare(usize),
}

impl AllocFor {
    fn replica(self) -> usize {
        match self {
            AllocFor::Own(i) | AllocFor::Renew(i) | AllocFor::Spare(i) => i,
        }
    }
}

/// One put or remove (see the module's text).
pub(crate) struct Put {
    key: Vec<u8>,
    h: KeyHash,
    digest: ValueDigest,
    kind: Kind,
    /// When its block expires ([`Put::expiring`]).
    expiry: Expiry,
    /// Whether a cache may evict its block ([`Put::pinned`]).
    pin: Pin,
    /// The access time its block starts with ([`Put::accessed_at`]).
    accessed_us: u64,
    /// Write only while this is the key's newest version ([`Put::only_over`]).
    only_over: Option<Version>,
    writer: u64,
    replicas: Vec<Replica>,
    /// This put's block on each replica, once allocated.
    blocks: Vec<u64>,
    /// Per replica: a slot names this put's block there (its swap won, or its answer was
    /// lost and it may have landed).
    named: Vec<bool>,
    /// Per replica: a swap of this put's block there is asked and not answered.
    asked: Vec<bool>,
    /// Blocks allocated and not (yet) this put's: those of the first step, until the put
    /// takes them, and all of them when the allocation failed on some replica.
    orphans: Vec<BlockAt>,
    /// The answers to the allocations of the first step, one per replica, until the put
    /// takes its blocks.
    early: Vec<Answer>,
    /// Allocations the next step asks for, beside its other operations.
    to_alloc: Vec<AllocFor>,
    /// The allocations the last step asked for: where their answers start, and what each
    /// is for.
    allocs: Option<(usize, Vec<AllocFor>)>,
    /// Replicas on which the first step allocates a block for a later put.
    spares_for: Vec<usize>,
    /// Those blocks, once allocated: the caller's ([`PutDone::spares`], [`Put::spares`]).
    spare_blocks: Vec<BlockAt>,
    /// Where the key's slots were seen lately, on every replica: the put publishes in its
    /// first step ([`Put::current`]).
    current: Option<Vec<SlotSeen>>,
    /// The words the put's swaps found or installed, by node: the blocks its next lookup
    /// reads beside the buckets.
    seen_words: Vec<(u32, u64)>,
    /// The first step was asked for.
    started: bool,
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
        encode_header_for(
            &mut header,
            key,
            &digest,
            Version { seq: 1, writer },
            kind,
            (Expiry::NEVER, Pin::None),
        )?;
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
            expiry: Expiry::NEVER,
            pin: Pin::None,
            accessed_us: 0,
            only_over: None,
            writer,
            replicas: replicas.to_vec(),
            blocks: Vec::new(),
            named: vec![false; replicas.len()],
            asked: vec![false; replicas.len()],
            orphans: Vec::new(),
            early: Vec::new(),
            to_alloc: Vec::new(),
            allocs: None,
            spares_for: Vec::new(),
            spare_blocks: Vec::new(),
            current: None,
            seen_words: Vec::new(),
            started: false,
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
    /// (docs/STORE.md section 7). There is no primary: each swap stands alone.
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

    /// This put, its block expiring at `expiry` (a value's or a manifest's only).
    ///
    /// # Errors
    /// [`CoreError::BadSetting`](rdmapool_pool::CoreError::BadSetting) for an expiry on
    /// another kind of block.
    pub(crate) fn expiring(mut self, expiry: Expiry) -> Result<Self> {
        check_expiry(self.kind, expiry)?;
        self.expiry = expiry;
        Ok(self)
    }

    /// This put, its block pinned as `pin` says (a value's or a manifest's only).
    ///
    /// # Errors
    /// [`CoreError::BadSetting`](rdmapool_pool::CoreError::BadSetting) for a pin on
    /// another kind of block.
    pub(crate) fn pinned(mut self, pin: Pin) -> Result<Self> {
        let mut header = [0; HEADER_LEN];
        encode_header_for(
            &mut header,
            &self.key,
            &self.digest,
            Version { seq: 1, writer: 1 },
            self.kind,
            (self.expiry, pin),
        )?;
        self.pin = pin;
        Ok(self)
    }

    /// This put, its block's access time starting at `us` (microseconds since the Unix
    /// epoch: a put counts as a read for a cache's eviction, docs/STORE.md section 12).
    pub(crate) fn accessed_at(mut self, us: u64) -> Self {
        self.accessed_us = us;
        self
    }

    /// This put, made only while `version` is the newest its replicas hold (each lookup,
    /// the first and any after a lost swap, checks): it finishes with nothing written
    /// once a newer version is there. The reclaim of an expired value, which must never
    /// take the place of a put that came after it.
    pub(crate) fn only_over(mut self, version: Option<Version>) -> Self {
        self.only_over = version;
        self
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

    /// The same put, publishing in its first step, with no lookup (docs/STORE.md section
    /// 6, "One round trip"): `seen` is the key's slot on every replica (in the replicas'
    /// order) as this client saw it lately, and `blocks` a block of this put's size class
    /// on each, allocated before (an earlier put's [spares](Put::spare)). The version is
    /// above every version seen; each replica's list is the block's WRITE, the swap from
    /// the word seen and the fence read. A swap lost to a put this client did not see
    /// is answered as in any put (the primary's: looked up again; another's: that replica
    /// looked up again). Only a value put over values: a remove must know whether there
    /// is anything to remove, and a put over a striped value must read its manifest (its
    /// parts are to be cleared). Otherwise, or when `seen` or `blocks` do not cover the
    /// replicas, the put is unchanged.
    ///
    /// The caller's rule (the store client's): `seen` is younger than a fraction of the
    /// grace period, so none of the blocks it names can have been freed and reused under
    /// the same word since (docs/STORE.md section 8).
    pub(crate) fn current(mut self, seen: &[SlotSeen], blocks: &[u64]) -> Self {
        let covers = seen.len() == self.replicas.len()
            && blocks.len() == self.replicas.len()
            && seen
                .iter()
                .zip(&self.replicas)
                .all(|(s, r)| s.node == r.node && s.kind == Kind::Value && s.slot < 8);
        if self.kind == Kind::Value && !self.copy && covers {
            self.current = Some(seen.to_vec());
            self.blocks = blocks.to_vec();
        }
        self
    }

    /// This put, also allocating in its first step a block on each of the replicas at
    /// positions `on` for a later put of this client: in [`PutDone::spares`], or
    /// [`Put::spares`] if the put fails.
    pub(crate) fn spare(mut self, on: &[usize]) -> Self {
        self.spares_for = on
            .iter()
            .copied()
            .filter(|&i| i < self.replicas.len())
            .collect();
        self
    }

    /// Whether the put publishes in its first step ([`Put::current`] took), before it
    /// starts.
    pub(crate) fn publishes_first(&self) -> bool {
        self.current.is_some()
    }

    /// The blocks this put allocated that no slot names: the caller frees them if it gives
    /// the put up (an error from its [`Machine::advance`] or its own deadline). Those a swap
    /// won (or may have: its answer was lost) are left to repair.
    pub(crate) fn allocated(&self) -> Vec<BlockAt> {
        self.replicas
            .iter()
            .zip(&self.blocks)
            .enumerate()
            .filter(|&(i, _)| !self.named[i] && !self.asked[i])
            .map(|(_, (r, &b))| (r.node, b))
            .chain(self.orphans.iter().copied())
            .collect()
    }

    /// The blocks allocated for later puts ([`Put::spare`]) so far.
    /// What the swaps this put won so far changed of the bytes slots name, by node (what
    /// [`PutDone::named_bytes`] holds, for a put that failed after some swaps won).
    pub(crate) fn named_bytes(&self) -> &[(u32, i64)] {
        &self.done.named_bytes
    }

    pub(crate) fn spares(&self) -> &[BlockAt] {
        &self.spare_blocks
    }

    /// Whether a swap of this put may have landed: the version may be visible, and a put
    /// given up after this leaves the blocks slots may name to repair.
    pub(crate) fn published(&self) -> bool {
        self.named.iter().chain(&self.asked).any(|&b| b)
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

    /// The replicas of `pending`, for a lookup there, reading beside their buckets the
    /// blocks their last swaps found.
    fn lookup_pending(&self) -> Lookup {
        let rs: Vec<Replica> = self.pending.iter().map(|&i| self.replicas[i]).collect();
        Lookup::new(&self.key, &rs).hinted(&self.seen_words)
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
        let moved_on = self.only_over.is_some_and(|v| newest != Some(v));
        if moved_on
            || self.kind == Kind::Tombstone && nothing_here && (!floor_above || self.floor_removed)
        {
            // Nothing to remove.
            self.state = State::Finished;
            let mut done = std::mem::replace(&mut self.done, Self::empty_done());
            done.unused = self.allocated();
            done.spares = std::mem::take(&mut self.spare_blocks);
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
            seen: Vec::new(),
            spares: Vec::new(),
            named_bytes: Vec::new(),
        }
    }

    /// The step that publishes: on every replica its block written, then its swap right
    /// after it in the same list (RC order: the block is whole before the slot names it),
    /// then the fence read; every replica at once, so a put takes the same round trips
    /// whatever `r`. A replica that holds a version at least as high gets neither (its
    /// block is unused); the primary holding one means it moved on since the lookup: the
    /// put starts again.
    fn write(&mut self, looked: Looked) -> Result<Step<PutDone>> {
        let mut header = [0; HEADER_LEN];
        encode_header_for(
            &mut header,
            &self.key,
            &self.digest,
            self.version,
            self.kind,
            (self.expiry, self.pin),
        )?;
        stamp_access(&mut header, self.accessed_us, 0);
        // The header and the key; the value follows as the driver's payload.
        let mut head = Vec::with_capacity(HEADER_LEN + self.key.len());
        head.extend_from_slice(&header);
        head.extend_from_slice(&self.key);
        let mut ops = Vec::with_capacity(self.replicas.len() * 3);
        let mut writes = Vec::with_capacity(self.replicas.len());
        let mut swaps = Vec::with_capacity(self.replicas.len());
        for i in 0..self.replicas.len() {
            let Some(swap) = self.swap_for(i, &looked.held[i])? else {
                if i == 0 && !self.copy {
                    return self.again();
                }
                continue;
            };
            writes.push((i, ops.len()));
            ops.push(Op {
                node: self.replicas[i].node,
                io: Io::WriteWithPayload {
                    at: self.blocks[i],
                    head: head.clone(),
                },
            });
            swaps.push(self.swap_ops(i, swap, &mut ops));
        }
        self.pending.clear();
        if swaps.is_empty() {
            return Ok(self.finish());
        }
        self.state = State::Publishing { writes, swaps };
        Ok(self.ask(ops))
    }

    /// Adds `swap` (on replica `i`) to `ops`, then its fence read when the put is fenced.
    fn swap_ops(&mut self, i: usize, swap: Swap, ops: &mut Vec<Op>) -> Asked {
        self.asked[i] = true;
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

    /// A step of operations (counted as a round trip), with the allocations asked for
    /// beside it.
    fn ask(&mut self, mut ops: Vec<Op>) -> Step<PutDone> {
        self.trips += 1;
        let wanted = std::mem::take(&mut self.to_alloc);
        self.allocs = None;
        if !wanted.is_empty() {
            let len = self.block_len();
            self.allocs = Some((ops.len(), wanted.clone()));
            ops.extend(wanted.iter().map(|f| Op {
                node: self.replicas[f.replica()].node,
                io: Io::Alloc { len },
            }));
        }
        Step::Do(ops)
    }

    /// Takes the answers to the allocations the last step asked for (`wanted`).
    fn allocated_now(&mut self, wanted: &[AllocFor], answers: &[Answer]) -> Result<()> {
        let mut own = Vec::new();
        for (k, &f) in wanted.iter().enumerate() {
            let a = answers.get(k).cloned().unwrap_or(Answer::Failed);
            let i = f.replica();
            let node = self.replicas[i].node;
            match (f, a) {
                (AllocFor::Own(_), a) => own.push(a),
                (AllocFor::Spare(_), Answer::Offset(Some(at))) => {
                    self.spare_blocks.push((node, at));
                }
                (AllocFor::Spare(_), _) => {}
                (AllocFor::Renew(_), Answer::Offset(Some(at))) => {
                    self.blocks[i] = at;
                    self.named[i] = false;
                }
                (AllocFor::Renew(_), Answer::Offset(None)) => {
                    return Err(Error::RemoteExhausted {
                        size: self.block_len(),
                    })
                }
                (AllocFor::Renew(_), _) => return Err(self.down(i, "allocating a block")),
            }
        }
        if !own.is_empty() {
            self.orphans = (self.replicas.iter().zip(&own))
                .filter_map(|(r, a)| match a {
                    Answer::Offset(Some(at)) => Some((r.node, *at)),
                    _ => None,
                })
                .collect();
            self.early = own;
        }
        Ok(())
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

    /// The answers to `swaps`: each won swap's block is named (and what it replaced noted),
    /// each lost one's replica is returned, to look up again; a swap without an answer may
    /// have landed, so its block counts as named, and the first such replica is returned
    /// too. Also whether the primary's swap won.
    fn settle(&mut self, swaps: &[Asked], answers: &[Answer]) -> Settled {
        let mut out = Settled::default();
        for asked in swaps {
            let i = asked.replica;
            self.asked[i] = false;
            let node = asked.swap.node;
            self.seen_words.retain(|&(n, _)| n != node);
            match answers.get(asked.at) {
                Some(&Answer::Word(old)) if old == asked.swap.expected => {
                    self.named[i] = true;
                    self.replaced(i, &asked.swap, old);
                    self.fence_read(asked, answers);
                    self.seen_words.push((node, asked.swap.swap));
                    out.primary_won |= i == 0 && !self.copy;
                }
                Some(&Answer::Word(now)) => {
                    self.seen_words.push((node, now));
                    out.lost.push(i);
                }
                _ => {
                    self.named[i] = true;
                    out.failed.get_or_insert(i);
                }
            }
        }
        out
    }

    /// The swaps on the replicas still pending, from what their lookup found.
    fn backups(&mut self, looked: Looked) -> Result<Step<PutDone>> {
        let mut ops = Vec::new();
        let mut swaps = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        for (k, held) in looked.held.iter().enumerate() {
            let i = pending[k];
            if let Some(s) = self.swap_for(i, held)? {
                swaps.push(self.swap_ops(i, s, &mut ops));
            }
        }
        if swaps.is_empty() {
            return Ok(self.finish());
        }
        self.state = State::Backups { swaps };
        Ok(self.ask(ops))
    }

    /// The put is done: its blocks that no slot names (a replica held a version at least
    /// as high) are unused.
    fn finish(&mut self) -> Step<PutDone> {
        self.state = State::Finished;
        let mut done = std::mem::replace(&mut self.done, Self::empty_done());
        done.unused.extend(self.allocated());
        done.spares = std::mem::take(&mut self.spare_blocks);
        done.version = Some(self.version);
        Step::Done(done)
    }

    /// Notes this put's swap on replica `i` won over `old`.
    fn replaced(&mut self, i: usize, swap: &Swap, old: u64) {
        let delta = named_bytes(swap.swap) as i64 - named_bytes(old) as i64;
        self.done.named_bytes.push((swap.node, delta));
        self.done.installed.retain(|&(n, _)| n != swap.node);
        self.done.installed.push((swap.node, swap.swap));
        let bucket = self.replicas[i].bucket_at(self.h);
        self.done.seen.retain(|s| s.node != swap.node);
        self.done.seen.push(SlotSeen {
            node: swap.node,
            slot: (swap.at.saturating_sub(bucket) / 8) as usize,
            word: swap.swap,
            version: self.version,
            kind: self.kind,
        });
        if let (Some(s), Some(v)) = (Slot::from_word(old), swap.replacing) {
            self.done.replaced.push((swap.node, s.offset, v));
        }
    }

    /// The first step: with a current hint ([`Put::current`]), the publishing step itself;
    /// otherwise the buckets (and the hinted blocks), with a block allocated on every
    /// replica beside them (what is read does not change its size), so the allocation
    /// costs no round of its own. Spares are allocated beside either.
    fn first(&mut self, lookup: Lookup) -> Result<Step<PutDone>> {
        self.started = true;
        let spares: Vec<AllocFor> = self
            .spares_for
            .iter()
            .map(|&i| AllocFor::Spare(i))
            .collect();
        if let Some(seen) = self.current.take() {
            self.to_alloc = spares;
            let newest = seen.iter().map(|s| s.version).max();
            self.version = next_version(newest.max(self.floor), self.writer);
            let looked = Looked {
                held: seen
                    .iter()
                    .map(|s| super::lookup::Held {
                        answered: true,
                        bucket: Vec::new(),
                        current: Some((s.slot, s.word, s.version)),
                    })
                    .collect(),
                ..Looked::default()
            };
            return self.write(looked);
        }
        self.to_alloc = (0..self.replicas.len()).map(AllocFor::Own).collect();
        self.to_alloc.extend(spares);
        let reads = lookup.bucket_reads();
        self.state = State::Buckets { lookup };
        Ok(self.ask(read_ops(&reads)))
    }

    /// The next step, from the answers to the last one (none the first time).
    fn step(&mut self, answers: &[Answer]) -> Result<Step<PutDone>> {
        let answers = match self.allocs.take() {
            Some((at, wanted)) => {
                let (rest, allocs) = answers.split_at(at.min(answers.len()));
                self.allocated_now(&wanted, allocs)?;
                rest
            }
            None => answers,
        };
        let state = std::mem::replace(&mut self.state, State::Finished);
        match state {
            State::Buckets { lookup } if !self.started => self.first(lookup),
            State::Buckets { lookup } => self.read_step(lookup, &replies(answers)),
            State::Blocks { lookup } => self.looked(&lookup, &replies(answers)),
            State::Publishing { writes, swaps } => {
                let settled = self.settle(&swaps, answers);
                if let Some(e) = self.failed_write(&writes, answers) {
                    return Err(e);
                }
                if let Some(i) = settled.failed {
                    return Err(self.down(i, "a swap"));
                }
                if !self.copy && !settled.primary_won {
                    // Another put came first on the primary: look everything up again.
                    return self.again();
                }
                // The primary's swap is the put's linearization point; a replica whose
                // swap was lost is looked up again, and gets this put's version unless it
                // holds a higher one.
                self.backing = true;
                self.look_again(settled.lost)
            }
            State::Backups { swaps } => {
                let settled = self.settle(&swaps, answers);
                if let Some(i) = settled.failed {
                    return Err(self.down(i, "a replica's swap"));
                }
                self.rounds += 1;
                if self.rounds > MAX_ROUNDS && !settled.lost.is_empty() {
                    return Err(self.contended());
                }
                self.look_again(settled.lost)
            }
            State::Finished => Err(Error::OutcomeTaken),
        }
    }

    /// Looks up the replicas in `lost` again (their swaps were lost), or finishes.
    fn look_again(&mut self, lost: Vec<usize>) -> Result<Step<PutDone>> {
        if lost.is_empty() {
            return Ok(self.finish());
        }
        self.pending = lost;
        let lookup = self.lookup_pending();
        let reads = lookup.bucket_reads();
        self.state = State::Buckets { lookup };
        Ok(self.ask(read_ops(&reads)))
    }

    /// The primary moved on: look everything up again, reading beside the buckets the
    /// blocks the swaps found. The blocks are kept, but where a swap of this put won (a
    /// replica other than the primary), a slot names its block: a new one is allocated
    /// there beside the lookup, and the put made again replaces the old one like any.
    fn again(&mut self) -> Result<Step<PutDone>> {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            return Err(self.contended());
        }
        if !self.blocks.is_empty() {
            for i in 0..self.replicas.len() {
                if self.named[i] {
                    self.to_alloc.push(AllocFor::Renew(i));
                }
            }
        }
        self.pending = (0..self.replicas.len()).collect();
        let lookup = Lookup::new(&self.key, &self.replicas).hinted(&self.seen_words);
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

/// What the answers to a step's swaps said ([`Put::settle`]).
#[derive(Debug, Default)]
struct Settled {
    /// Replicas whose swap was lost (the slot held another word).
    lost: Vec<usize>,
    /// The first replica whose swap was not answered.
    failed: Option<usize>,
    /// The primary's swap won.
    primary_won: bool,
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
