//! A get as a state machine without I/O (docs/STORE.md section 5): READ the key's bucket on
//! every replica at once, then READ every candidate block at once, then answer with the
//! newest block that verifies. A replica that fails is skipped; the get fails only when
//! every replica failed.
//!
//! The machine never holds the bytes it is given: it answers with where the value is (which
//! read, which range), so the caller's READs can land in registered buffers and the value
//! is never copied by the store.

use super::decide::{candidates, newest, verify, Found, SLOTS_PER_BUCKET};
use super::format::{decode_block, KeyHash, Reject};
use super::root::Index;
use crate::remote::layout::Layout;
use crate::{Error, Result};

/// A replica as the get sees it: its node, layout and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replica {
    pub(crate) node: u32,
    pub(crate) layout: Layout,
    pub(crate) index: Index,
}

/// A READ of `len` bytes at region offset `at` of `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) node: u32,
    pub(crate) at: u64,
    pub(crate) len: u64,
}

/// What the get wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GetStep {
    /// Perform these READs (all at once) and pass their bytes back in the same order
    /// (`None` for a read that failed).
    Read(Vec<Read>),
    /// Finished: the newest verified block, as found in the last reads (`read` is its
    /// position in them), or `None` when no replica holds the key.
    Done(Option<(usize, Found)>),
}

enum State {
    Start,
    Buckets,
    Blocks {
        reads: Vec<(u32, usize, u64)>,
        bucket_failed: bool,
    },
    Finished,
}

/// A get of one key (see the module's text).
pub(crate) struct Get {
    key: Vec<u8>,
    h: KeyHash,
    replicas: Vec<Replica>,
    state: State,
}

impl Get {
    /// The get of `key` from `replicas` (best first).
    pub(crate) fn new(key: &[u8], replicas: Vec<Replica>) -> Self {
        Self {
            key: key.to_vec(),
            h: KeyHash::of(key),
            replicas,
            state: State::Start,
        }
    }

    /// The next step, from the bytes of the last step's reads (empty the first time).
    pub(crate) fn advance(&mut self, replies: &[Option<&[u8]>]) -> Result<GetStep> {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Start => {
                self.state = State::Buckets;
                Ok(GetStep::Read(
                    self.replicas
                        .iter()
                        .map(|r| Read {
                            node: r.node,
                            at: r.index.bucket(self.h.bucket(r.index.buckets)),
                            len: SLOTS_PER_BUCKET as u64 * 8,
                        })
                        .collect(),
                ))
            }
            State::Buckets => {
                if replies.iter().all(Option::is_none) {
                    return Err(self.failed("no replica's bucket could be read"));
                }
                let mut reads = Vec::new();
                let mut plan = Vec::new();
                for (r, reply) in self.replicas.iter().zip(replies) {
                    let Some(bytes) = reply else { continue };
                    let words: Vec<u64> = bytes
                        .chunks_exact(8)
                        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
                        .collect();
                    for (slot, s) in candidates(self.h, &words) {
                        // A slot naming memory outside the data area is damage: skip it.
                        let Some(chunk) = r.layout.chunk_of(s.offset) else {
                            continue;
                        };
                        let chunk_end = r.layout.chunk(chunk) + r.layout.chunk_size;
                        plan.push((r.node, slot, s.word()));
                        reads.push(Read {
                            node: r.node,
                            at: s.offset,
                            len: s.read_len().min(chunk_end - s.offset),
                        });
                    }
                }
                if reads.is_empty() {
                    return Ok(GetStep::Done(None));
                }
                self.state = State::Blocks {
                    reads: plan,
                    bucket_failed: replies.iter().any(Option::is_none),
                };
                Ok(GetStep::Read(reads))
            }
            State::Blocks {
                reads,
                bucket_failed,
            } => {
                let found = verify(
                    &self.key,
                    reads
                        .iter()
                        .zip(replies)
                        .filter_map(|(&(node, slot, word), b)| b.map(|b| (node, slot, word, b))),
                );
                let Some(best) = newest(&found).cloned() else {
                    // Not "not found" when a candidate could not be read, or when one was
                    // damaged (the key's, failing its checksum) and a replica did not answer.
                    let damaged = replies.iter().any(|b| {
                        matches!(
                            b.map(|b| decode_block(b, &self.key)),
                            Some(Err(Reject::Checksum))
                        )
                    });
                    if replies.iter().any(Option::is_none) {
                        return Err(self.failed("a candidate block could not be read"));
                    }
                    if damaged && bucket_failed {
                        return Err(self
                            .failed("the only copy that answered is damaged (checksum mismatch)"));
                    }
                    return Ok(GetStep::Done(None));
                };
                // Its position among the reads, for the caller to find the bytes.
                let i = reads
                    .iter()
                    .position(|&(n, s, _)| n == best.node && s == best.slot)
                    .unwrap_or(0);
                Ok(GetStep::Done(Some((i, best))))
            }
            State::Finished => Err(Error::OutcomeTaken),
        }
    }

    fn failed(&self, reason: &str) -> Error {
        Error::NodeDown {
            node: self.replicas.first().map_or(0, |r| r.node),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests;
