//! A get as a state machine without I/O (docs/STORE.md section 5): a [`Lookup`] of the key
//! on every replica at once, then the newest block that verifies. A replica that fails is
//! skipped; the get fails when no copy could be read, and when the only copies of the key
//! it found are damaged (never "not found" for them).
//!
//! The machine never holds the bytes it is given: it answers with where the value is (which
//! read, which range), so the caller's READs can land in registered buffers and the value
//! is never copied by the store.

use super::decide::{newest, Found};
use super::lookup::{read_ops, replies, Lookup, Replica, Src};
use rdmapool_pool::remote::step::{Answer, Machine, Step};
use rdmapool_pool::{Error, Result};
use std::time::Instant;

/// How a get ended: the newest verified block and where its bytes are (a position in the
/// last step's reads, or an early read: [`Get::take_early`]), or `None` when no replica
/// holds the key.
pub(crate) type Got = Option<(Src, Found)>;

enum State {
    Start,
    Buckets,
    Blocks { bucket_failed: bool },
    Finished,
}

/// A get of one key (see the module's text).
pub(crate) struct Get {
    lookup: Lookup,
    first: u32,
    state: State,
    /// Every verified block of the key the get found, once done.
    found: Vec<Found>,
    /// Replicas of the key left out because they are down (read around: as replicas
    /// whose bucket could not be read).
    missing: bool,
}

impl Get {
    /// The get of `key` from `replicas` (best first).
    #[cfg(test)]
    pub(crate) fn new(key: &[u8], replicas: &[Replica]) -> Self {
        Self::hinted(key, replicas, &[])
    }

    /// A get that also reads, beside the buckets, the blocks at `hints` (`(node, slot
    /// word)` where the key was last seen, [`Lookup::hinted`]): one round of reads when
    /// they are still current.
    pub(crate) fn hinted(key: &[u8], replicas: &[Replica], hints: &[(u32, u64)]) -> Self {
        Self {
            lookup: Lookup::new(key, replicas).hinted(hints),
            first: replicas.first().map_or(0, |r| r.node),
            state: State::Start,
            found: Vec::new(),
            missing: false,
        }
    }

    /// The same get, knowing that `count` more replicas of the key are down and left out
    /// of `replicas`: a damaged copy is then `NodeDown`, not `Damaged` (theirs may be
    /// sound).
    pub(crate) fn missing(mut self, count: usize) -> Self {
        self.missing = count > 0;
        self
    }

    /// Every verified block of the key the get found (once done).
    pub(crate) fn found(&self) -> &[Found] {
        &self.found
    }

    /// The bytes of an early read the answer named ([`Src::Early`]).
    pub(crate) fn take_early(&mut self, e: usize) -> Vec<u8> {
        self.lookup.take_early(e)
    }

    /// The next step, from the bytes of the last step's reads (empty the first time).
    fn step(&mut self, replies: &[Option<&[u8]>]) -> Result<Step<Got>> {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Start => {
                self.state = State::Buckets;
                Ok(Step::Do(read_ops(&self.lookup.bucket_reads())))
            }
            State::Buckets => {
                if replies
                    .iter()
                    .take(self.lookup.replica_count())
                    .all(Option::is_none)
                {
                    return Err(self.failed("no replica's bucket could be read"));
                }
                let reads = self.lookup.on_buckets(replies);
                let bucket_failed = self.missing
                    || replies
                        .iter()
                        .take(self.lookup.replica_count())
                        .any(Option::is_none);
                if reads.is_empty() {
                    // Nothing to read: no candidate, or every one read early.
                    return self.blocks(&[], bucket_failed);
                }
                self.state = State::Blocks { bucket_failed };
                Ok(Step::Do(read_ops(&reads)))
            }
            State::Blocks { bucket_failed } => self.blocks(replies, bucket_failed),
            State::Finished => Err(Error::OutcomeTaken),
        }
    }

    fn blocks(&mut self, replies: &[Option<&[u8]>], bucket_failed: bool) -> Result<Step<Got>> {
        let looked = self.lookup.on_blocks(replies);
        let Some(best) = newest(&looked.found) else {
            // Never "not found" when a candidate could not be read, or when one was the
            // key's but damaged (failing its checksum): `NodeDown` while a replica did not
            // answer (its copy may be sound), `Damaged` when every replica answered.
            if looked.unread {
                return Err(self.failed("a candidate block could not be read"));
            }
            if looked.damaged && bucket_failed {
                return Err(
                    self.failed("the only copy that answered is damaged (checksum mismatch)")
                );
            }
            if looked.damaged {
                return Err(Error::Damaged {
                    key: String::from_utf8_lossy(self.lookup.key()).into_owned(),
                    reason: "every copy of it that was found fails its checksum".into(),
                });
            }
            return Ok(Step::Done(None));
        };
        let at = looked
            .found
            .iter()
            .position(|f| f == best)
            .map_or(Src::Read(0), |k| looked.found_at[k]);
        let best = best.clone();
        self.found = looked.found;
        Ok(Step::Done(Some((at, best))))
    }

    fn failed(&self, reason: &str) -> Error {
        Error::NodeDown {
            node: self.first,
            reason: reason.into(),
        }
    }
}

impl Machine for Get {
    type Output = Got;
    type Context = ();

    fn advance(&mut self, _: &mut (), _now: Instant, answers: &[Answer]) -> Result<Step<Got>> {
        self.step(&replies(answers))
    }
}

#[cfg(test)]
mod tests;
