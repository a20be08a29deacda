//! A node's index root (docs/STORE.md section 2): find the node's index chunk, or make it,
//! as a state machine without I/O (the pool's `chunks` machines are the model: it asks for
//! one one-sided operation at a time and decides from the answer).
//!
//! 1. READ the root word (region offset 24). Non-zero: it names the index chunk; done.
//! 2. Claim a free chunk `j` for the store: `CAS(entry j, 0 → 2^63 | writer)`, probing from
//!    a hash of the writer's id.
//! 3. Zero the chunk in pieces of 1 MiB, then WRITE the index magic at its start (the same
//!    connection, so in order).
//! 4. Publish: `CAS(root, 0 → 2^63 | j)`. Lost to another client: give the chunk back
//!    (`CAS(entry j, 2^63 | writer → 0)`) and use the winner's.
//!
//! A client that dies between 2 and 4 leaves a store chunk of its own that no root names;
//! repair frees such chunks of writers whose lease has expired (section 8).
//!
//! On an **isolated** node ([`FindRoot::tenant`]) each tenant has an index of its own and
//! the root word is the server's (read-only): the machine READs the chunk table, then the
//! first word of each chunk the table gives the tenant's store (`2^63 | writer`), lowest
//! first; the one that starts with the index magic is the tenant's index. With none, it
//! claims a chunk for the tenant's store (through the server), zeroes it and WRITEs the
//! magic: nothing to publish, as the tenant's own chunks are the root. Only one client runs
//! as a tenant id at a time (the server's record gives an id one lease slot), and a `Store`
//! makes its indexes one at a time, so no two indexes of one tenant are made at once.

use rdmapool_pool::remote::layout::{hash64, Layout};
use rdmapool_pool::remote::step::{Answer, Io, Machine, Step};
use rdmapool_pool::{CoreError, Error, Result};
use std::time::Instant;

/// Bit 63 of a chunk-table entry or of the root word: the store's.
pub(crate) use rdmapool_pool::remote::layout::DURABLE_TAG;
/// The root word's offset in the region.
pub(crate) const ROOT_WORD: u64 = 24;
/// The first 8 bytes of an index chunk; its buckets start at [`INDEX_START`].
pub(crate) const INDEX_MAGIC: [u8; 8] = *b"RDSIDX01";
/// Offset of bucket 0 in the index chunk.
pub(crate) const INDEX_START: u64 = 64;
/// Bytes zeroed by one WRITE while making an index.
const ZERO_PIECE: u64 = 1 << 20;

/// The node's index: which chunk holds it, and how many buckets it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Index {
    /// The index chunk's number.
    pub(crate) chunk: u64,
    /// Region offset of bucket 0.
    pub(crate) start: u64,
    /// Buckets (64 bytes each).
    pub(crate) buckets: u64,
}

impl Index {
    fn new(layout: &Layout, chunk: u64) -> Self {
        Self {
            chunk,
            start: layout.chunk(chunk) + INDEX_START,
            buckets: (layout.chunk_size - INDEX_START) / 64,
        }
    }

    /// Region offset of bucket `b`.
    pub(crate) fn bucket(&self, b: u64) -> u64 {
        self.start + (b % self.buckets.max(1)) * 64
    }
}

#[derive(Debug, Clone)]
enum State {
    Start,
    /// Isolated: reading the chunk table.
    Table,
    /// Isolated: reading the first word of the tenant's store chunk `candidates[i]`.
    Look {
        candidates: Vec<u64>,
        i: usize,
    },
    ReadRoot,
    Claim {
        probe: u64,
    },
    Zero {
        chunk: u64,
        at: u64,
    },
    Magic {
        chunk: u64,
    },
    Publish {
        chunk: u64,
    },
    Release {
        winner: u64,
    },
}

/// Finds or makes a node's index (see the module's text).
#[derive(Debug, Clone)]
pub(crate) struct FindRoot {
    node: u32,
    layout: Layout,
    writer: u64,
    /// An isolated node: the tenant's own index, found in its own chunks.
    tenant: bool,
    state: State,
}

impl FindRoot {
    /// The machine for node `node`, laid out as `layout`, run by client `writer`.
    pub(crate) fn new(node: u32, layout: Layout, writer: u64) -> Self {
        Self {
            node,
            layout,
            writer,
            tenant: false,
            state: State::Start,
        }
    }

    /// The machine for tenant `writer`'s own index on an isolated node (module docs).
    pub(crate) fn tenant(node: u32, layout: Layout, writer: u64) -> Self {
        Self {
            tenant: true,
            ..Self::new(node, layout, writer)
        }
    }

    /// Isolated: the next of the tenant's store chunks to look at, or a claim of a new one.
    fn look(&mut self, candidates: Vec<u64>, i: usize) -> Result<Step<Index>> {
        match candidates.get(i) {
            Some(&chunk) => {
                self.state = State::Look { candidates, i };
                Ok(Step::one(
                    self.node,
                    Io::Read {
                        at: self.layout.chunk(chunk),
                        len: 8,
                    },
                ))
            }
            None => self.claim(0),
        }
    }

    fn tag(&self) -> u64 {
        DURABLE_TAG | self.writer
    }

    fn entry(&self, probe: u64) -> u64 {
        let n = self.layout.chunk_count;
        (hash64(self.writer ^ 0x5354_4f52_4549_4458).wrapping_add(probe)) % n
    }

    /// The chunk a root word names, if it is well formed for this layout.
    fn named(&self, root: u64) -> Result<Index> {
        let chunk = root & !DURABLE_TAG;
        if root & DURABLE_TAG == 0 || chunk >= self.layout.chunk_count {
            return Err(Error::Core(CoreError::Malformed {
                what: "store root word",
                reason: format!("{root:#x} names no chunk of {}", self.layout.chunk_count),
            }));
        }
        Ok(Index::new(&self.layout, chunk))
    }

    fn claim(&mut self, probe: u64) -> Result<Step<Index>> {
        if probe >= self.layout.chunk_count {
            return Err(Error::RemoteExhausted {
                size: self.layout.chunk_size,
            });
        }
        self.state = State::Claim { probe };
        Ok(Step::one(
            self.node,
            Io::Cas {
                at: self.layout.table_entry(self.entry(probe)),
                expected: 0,
                swap: self.tag(),
            },
        ))
    }

    fn zero(&mut self, chunk: u64, at: u64) -> Step<Index> {
        let len = ZERO_PIECE.min(self.layout.chunk_size - at);
        self.state = State::Zero { chunk, at };
        Step::one(
            self.node,
            Io::Write {
                at: self.layout.chunk(chunk) + at,
                bytes: vec![0; len as usize],
            },
        )
    }

    /// The next step, from the answer to the last one (`None` the first time).
    fn step(&mut self, answer: Option<&Answer>) -> Result<Step<Index>> {
        if answer.is_some_and(Answer::failed) {
            return Err(Error::NodeDown {
                node: self.node,
                reason: "an operation on its store index root failed".into(),
            });
        }
        let word = |a: Option<&Answer>| match a {
            Some(Answer::Word(w)) => Ok(*w),
            Some(Answer::Bytes(b)) if b.len() == 8 => Ok(a.map_or(0, Answer::word)),
            other => Err(Error::Core(CoreError::Malformed {
                what: "store root answer",
                reason: format!("a word was expected, got {other:?}"),
            })),
        };
        match std::mem::replace(&mut self.state, State::Start) {
            State::Start if self.tenant => {
                self.state = State::Table;
                Ok(Step::one(
                    self.node,
                    Io::Read {
                        at: self.layout.table_entry(0),
                        len: self.layout.chunk_count * 16,
                    },
                ))
            }
            State::Table => {
                let entries = match answer {
                    Some(a @ Answer::Bytes(_)) => a.words(),
                    other => {
                        return Err(Error::Core(CoreError::Malformed {
                            what: "store root answer",
                            reason: format!("the chunk table was expected, got {other:?}"),
                        }))
                    }
                };
                let mine: Vec<u64> = entries
                    .iter()
                    .step_by(2)
                    .enumerate()
                    .filter(|&(_, &e)| e == self.tag())
                    .map(|(j, _)| j as u64)
                    .collect();
                self.look(mine, 0)
            }
            State::Look { candidates, i } => {
                if word(answer)? == u64::from_le_bytes(INDEX_MAGIC) {
                    return Ok(Step::Done(Index::new(&self.layout, candidates[i])));
                }
                self.look(candidates, i + 1)
            }
            State::Start => {
                self.state = State::ReadRoot;
                Ok(Step::one(
                    self.node,
                    Io::Read {
                        at: ROOT_WORD,
                        len: 8,
                    },
                ))
            }
            State::ReadRoot => match word(answer)? {
                0 => self.claim(0),
                root => Ok(Step::Done(self.named(root)?)),
            },
            State::Claim { probe } => match word(answer)? {
                0 => Ok(self.zero(self.entry(probe), 0)),
                _ => self.claim(probe + 1),
            },
            State::Zero { chunk, at } => {
                let next = at + ZERO_PIECE;
                if next < self.layout.chunk_size {
                    return Ok(self.zero(chunk, next));
                }
                self.state = State::Magic { chunk };
                Ok(Step::one(
                    self.node,
                    Io::Write {
                        at: self.layout.chunk(chunk),
                        bytes: INDEX_MAGIC.to_vec(),
                    },
                ))
            }
            State::Magic { chunk } if self.tenant => {
                Ok(Step::Done(Index::new(&self.layout, chunk)))
            }
            State::Magic { chunk } => {
                self.state = State::Publish { chunk };
                Ok(Step::one(
                    self.node,
                    Io::Cas {
                        at: ROOT_WORD,
                        expected: 0,
                        swap: DURABLE_TAG | chunk,
                    },
                ))
            }
            State::Publish { chunk } => match word(answer)? {
                0 => Ok(Step::Done(Index::new(&self.layout, chunk))),
                winner => {
                    self.named(winner)?;
                    self.state = State::Release { winner };
                    Ok(Step::one(
                        self.node,
                        Io::Cas {
                            at: self.layout.table_entry(chunk),
                            expected: self.tag(),
                            swap: 0,
                        },
                    ))
                }
            },
            State::Release { winner } => {
                word(answer)?;
                Ok(Step::Done(self.named(winner)?))
            }
        }
    }
}

impl Machine for FindRoot {
    type Output = Index;
    type Context = ();

    fn advance(&mut self, _: &mut (), _now: Instant, answers: &[Answer]) -> Result<Step<Index>> {
        self.step(answers.first())
    }
}

#[cfg(test)]
mod tests;
