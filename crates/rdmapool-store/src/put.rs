//! A put (and a remove, which puts a tombstone) as a state machine without I/O
//! (docs/STORE.md section 6):
//!
//! 1. [`Lookup`] the key on every replica: the newest version anywhere is the one to beat.
//! 2. Allocate a block on every replica (once; a retried put reuses them), then WRITE each:
//!    header (version `(newest.seq + 1, writer)`), key, value.
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
use super::lookup::{Looked, Lookup, Replica};
use rdmapool_pool::{Error, Result};

mod steps;
pub(crate) use steps::{BlockAt, BlockWrite, PutDone, PutStep, Reply, Swap};

/// How many times a put starts again after losing its primary swap before it gives up.
pub(crate) const MAX_ROUNDS: u32 = 64;

#[derive(Debug)]
enum State {
    Buckets { lookup: Lookup },
    Blocks { lookup: Lookup },
    Allocated { looked: Looked },
    Written { looked: Looked },
    Primary { looked: Looked, swap: Swap },
    Backups { swaps: Vec<(usize, Swap)> },
    Finished,
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
    /// Blocks of an allocation step that failed on some replica.
    orphans: Vec<BlockAt>,
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
            published: false,
            copy: false,
            backing: false,
            version: Version { seq: 0, writer },
            floor: None,
            floor_removed: false,
            rounds: 0,
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
    /// error from [`Put::advance`] or its own deadline) while it is not
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

    fn read_step(&mut self, mut lookup: Lookup, replies: &[Option<&[u8]>]) -> Result<PutStep> {
        let buckets = replies.len().min(lookup.replica_count());
        self.first_failed(&replies[..buckets], "reading the key's bucket")?;
        let reads = lookup.on_buckets(replies);
        if reads.is_empty() {
            // No candidate, or every one read early beside the buckets.
            return self.looked(&lookup, &[]);
        }
        self.state = State::Blocks { lookup };
        Ok(PutStep::Read(reads))
    }

    /// From the candidate blocks' bytes (the last replies, or read early): what the
    /// replicas hold, then [`Put::decide`].
    fn looked(&mut self, lookup: &Lookup, replies: &[Option<&[u8]>]) -> Result<PutStep> {
        let looked = lookup.on_blocks(replies);
        if looked.unread {
            return Err(self.down(0, "reading a candidate block"));
        }
        if !self.backing && !self.copy {
            self.done.superseded = manifests(lookup, &looked, replies);
        }
        self.decide(looked)
    }

    /// From what the first lookup found: the version, then allocation or the writes.
    fn decide(&mut self, looked: Looked) -> Result<PutStep> {
        if self.backing {
            return self.backups(looked);
        }
        if self.copy {
            self.state = State::Allocated { looked };
            return Ok(PutStep::Alloc {
                nodes: self.replicas.iter().map(|r| r.node).collect(),
                len: self.block_len(),
            });
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
            return Ok(PutStep::Done(done));
        }
        self.version = next_version(newest.max(self.floor), self.writer);
        if self.blocks.is_empty() {
            self.state = State::Allocated { looked };
            return Ok(PutStep::Alloc {
                nodes: self.replicas.iter().map(|r| r.node).collect(),
                len: self.block_len(),
            });
        }
        self.write(looked)
    }

    fn empty_done() -> PutDone {
        PutDone {
            version: None,
            replaced: Vec::new(),
            unused: Vec::new(),
            superseded: Vec::new(),
            installed: Vec::new(),
        }
    }

    fn write(&mut self, looked: Looked) -> Result<PutStep> {
        let mut header = [0; HEADER_LEN];
        encode_header_for(
            &mut header,
            &self.key,
            &self.digest,
            self.version,
            self.kind,
        )?;
        let writes = self
            .replicas
            .iter()
            .zip(&self.blocks)
            .map(|(r, &at)| BlockWrite {
                node: r.node,
                at,
                header,
            })
            .collect();
        self.state = State::Written { looked };
        Ok(PutStep::Write(writes))
    }

    /// The swaps on the replicas still pending after the primary (or after a lost swap).
    fn backups(&mut self, looked: Looked) -> Result<PutStep> {
        let mut swaps = Vec::new();
        for (k, held) in looked.held.iter().enumerate() {
            let i = self.pending[k];
            match self.swap_for(i, held)? {
                Some(s) => swaps.push((i, s)),
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
        let step = PutStep::Swap(swaps.iter().map(|&(_, s)| s).collect());
        self.state = State::Backups { swaps };
        Ok(step)
    }

    fn finish(&mut self) -> PutStep {
        self.state = State::Finished;
        let mut done = std::mem::replace(&mut self.done, Self::empty_done());
        done.version = Some(self.version);
        PutStep::Done(done)
    }

    fn replaced(&mut self, swap: &Swap, old: u64) {
        self.done.installed.push((swap.node, swap.swap));
        if let (Some(s), Some(v)) = (Slot::from_word(old), swap.replacing) {
            self.done.replaced.push((swap.node, s.offset, v));
        }
    }

    /// The next step, from the answers to the last one ([`Reply::Start`] the first time).
    pub(crate) fn advance(&mut self, reply: Reply<'_>) -> Result<PutStep> {
        let state = std::mem::replace(&mut self.state, State::Finished);
        match (state, reply) {
            (State::Buckets { lookup }, Reply::Start) => {
                let reads = lookup.bucket_reads();
                self.state = State::Buckets { lookup };
                Ok(PutStep::Read(reads))
            }
            (State::Buckets { lookup }, Reply::Bytes(b)) => self.read_step(lookup, b),
            (State::Blocks { lookup }, Reply::Bytes(b)) => self.looked(&lookup, b),
            (State::Allocated { looked }, Reply::Offsets(offsets)) => {
                if let Some(i) = offsets.iter().position(Option::is_none) {
                    // Keep what was allocated, so the caller can free it.
                    self.orphans = (self.replicas.iter().zip(offsets))
                        .filter_map(|(r, o)| o.map(|o| (r.node, o)))
                        .collect();
                    return Err(self.down(i, "allocating a block"));
                }
                self.blocks = offsets.iter().flatten().copied().collect();
                self.write(looked)
            }
            (State::Written { looked }, Reply::Done(ok)) => {
                if let Some(i) = ok.iter().position(|&ok| !ok) {
                    return Err(self.down(i, "writing the block"));
                }
                if self.copy {
                    self.published = true;
                    self.backing = true;
                    return self.backups(looked);
                }
                let Some(swap) = self.swap_for(0, &looked.held[0])? else {
                    // The primary holds a newer version than the lookup's newest: it moved
                    // on meanwhile. Start again.
                    return self.again();
                };
                self.state = State::Primary { looked, swap };
                Ok(PutStep::Swap(vec![swap]))
            }
            (State::Primary { looked, swap }, Reply::Words(old)) => {
                let Some(&Some(old)) = old.first() else {
                    return Err(self.down(0, "the primary's swap"));
                };
                if old != swap.expected {
                    return self.again();
                }
                self.published = true;
                self.backing = true;
                self.replaced(&swap, old);
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
            (State::Backups { swaps }, Reply::Words(old)) => {
                for (k, &(i, s)) in swaps.iter().enumerate() {
                    match old.get(k).copied().flatten() {
                        None => return Err(self.down(i, "a replica's swap")),
                        Some(o) if o == s.expected => self.replaced(&s, o),
                        Some(_) => self.pending.push(i),
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
                Ok(PutStep::Read(reads))
            }
            (State::Finished, _) => Err(Error::OutcomeTaken),
            (state, reply) => Err(Error::Core(rdmapool_pool::CoreError::Malformed {
                what: "store put reply",
                reason: format!("{reply:?} does not answer {state:?}"),
            })),
        }
    }

    /// The primary moved on: look everything up again (the blocks are kept).
    fn again(&mut self) -> Result<PutStep> {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            return Err(self.contended());
        }
        let lookup = Lookup::new(&self.key, &self.replicas);
        let reads = lookup.bucket_reads();
        self.state = State::Buckets { lookup };
        Ok(PutStep::Read(reads))
    }

    fn contended(&self) -> Error {
        Error::Contended {
            what: "store put",
            rounds: MAX_ROUNDS,
        }
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
