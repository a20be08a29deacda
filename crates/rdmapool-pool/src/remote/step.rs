//! The one vocabulary of the pool's and the store's machines without I/O.
//!
//! A [`Machine`] says what it wants next as a [`Step`]: one-sided operations ([`Op`]: an
//! [`Io`] on a node's region) to perform at once, a time to be called again at, a wait for
//! another task of the client, or its result. It is then called again with the time
//! (`now`, a value: machines never read a clock) and one [`Answer`] per operation, in the
//! order it asked. Decisions live in the machines; a driver only performs.
//!
//! There is one real driver and one simulated one:
//! - [`Regions::perform`](crate::remote::regions::Regions::perform) performs a step's
//!   operations on the members' regions (every node's at once, reads in batches as deep as
//!   its send queue), and [`Regions::drive`](crate::remote::regions::Regions::drive) runs
//!   a machine to its end with it; the pool's own chunk and lease machines run on the same
//!   operations through the client's per-node driver, which also holds their book;
//! - [`SimRegion`](crate::remote::sim::SimRegion) (feature `sim`, and in this crate's
//!   tests) performs them on a region's bytes in memory, and [`drive_sim`] runs a machine
//!   on simulated regions in virtual time. The pool's simulated cluster, the chunk fuzz
//!   target and the store's simulations all use it.
//!
//! Machines built on it: the pool's chunk allocation, free and recovery, and the lease
//! slot's takeover; the store's index root, get, put (and repair's copies, which are puts).

use crate::Result;
use std::time::Instant;

/// A one-sided operation on a node's region (offsets from the region's start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Io {
    /// Compare-and-swap the word at `at` from `expected` to `swap`; answers
    /// [`Answer::Word`], the old value.
    Cas {
        /// The word's offset in the region (8-byte aligned).
        at: u64,
        /// The value it must hold.
        expected: u64,
        /// The value it then holds.
        swap: u64,
    },
    /// Add `add` (wrapping: a negative amount in two's complement) to the word at `at`;
    /// answers [`Answer::Word`], the old value.
    FetchAdd {
        /// The word's offset in the region (8-byte aligned).
        at: u64,
        /// The amount.
        add: u64,
    },
    /// Read `len` bytes at `at`; answers [`Answer::Bytes`].
    Read {
        /// The first byte's offset in the region.
        at: u64,
        /// How many bytes.
        len: u64,
    },
    /// Read `len` bytes at `at` straight into destination `into` of the step's payload
    /// (a registered buffer and an offset in it: a store get's value, READ into the
    /// caller's memory with no copy); answers [`Answer::Written`] once the bytes landed.
    ReadInto {
        /// The first byte's offset in the region.
        at: u64,
        /// How many bytes.
        len: u64,
        /// Which destination of the payload ([`Payload::Into`](crate::remote::regions::Payload::Into)).
        into: usize,
    },
    /// Write `bytes` at `at`, after every earlier operation of the same machine on the
    /// node; answers [`Answer::Written`].
    Write {
        /// Where, in the region.
        at: u64,
        /// What.
        bytes: Vec<u8>,
    },
    /// Write `head` at `at` and the driver's payload right after it (a store put's value:
    /// the machine never holds it, so it can be written from the caller's registered
    /// memory without a copy); answers [`Answer::Written`].
    WriteWithPayload {
        /// Where, in the region.
        at: u64,
        /// The bytes before the payload.
        head: Vec<u8>,
    },
    /// Allocate a block of `len` bytes in this client's durable chunks on the node
    /// ([`Regions::alloc`](crate::remote::regions::Regions::alloc)); answers
    /// [`Answer::Offset`].
    Alloc {
        /// Bytes.
        len: u64,
    },
}

/// An [`Io`] on node `node`'s region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The node.
    pub node: u32,
    /// The operation.
    pub io: Io,
}

/// What an [`Io`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A compare-and-swap's or a fetch-and-add's old value.
    Word(u64),
    /// A read's bytes.
    Bytes(Vec<u8>),
    /// A write landed.
    Written,
    /// An allocation's block, `None` when the node had no room.
    Offset(Option<u64>),
    /// The operation failed (its node is down, or it was refused); in a step of several
    /// operations only this one's answer says so.
    Failed,
}

impl Answer {
    /// The bytes of a read (`None` for any other answer).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Answer::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The answer as 8-byte little-endian words: a read's bytes (a partial last word is
    /// dropped) or a compare-and-swap's old value; empty otherwise.
    pub fn words(&self) -> Vec<u64> {
        match self {
            Answer::Word(w) => vec![*w],
            Answer::Bytes(b) => b
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The first word of [`Answer::words`], 0 when there is none.
    pub fn word(&self) -> u64 {
        match self {
            Answer::Word(w) => *w,
            Answer::Bytes(b) => b
                .get(..8)
                .map_or(0, |w| u64::from_le_bytes(w.try_into().expect("8 bytes"))),
            _ => 0,
        }
    }

    /// Whether the operation failed.
    pub fn failed(&self) -> bool {
        matches!(self, Answer::Failed)
    }
}

/// What a machine wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<T> {
    /// Perform these at once (each node's in order, on its connection) and answer each, in
    /// this order.
    Do(Vec<Op>),
    /// Perform this one operation and answer it: [`Step::Do`] of one, without a list (the
    /// pool's machines ask one operation at a time, and a list per operation would cost
    /// them an allocation each).
    One(Op),
    /// Call again, with no answers, at this time or later.
    Sleep(Instant),
    /// Another task of this client holds what the machine needs (a chunk claim on the
    /// node): call again, with no answers, once it lets go.
    Wait,
    /// Finished.
    Done(T),
}

impl<T> Step<T> {
    /// A step of one operation.
    pub fn one(node: u32, io: Io) -> Self {
        Step::One(Op { node, io })
    }

    /// The same step, a single operation as a list of one ([`Step::Do`]): for drivers that
    /// perform lists only.
    pub fn listed(self) -> Self {
        match self {
            Step::One(op) => Step::Do(vec![op]),
            other => other,
        }
    }
}

/// A state machine without I/O (see the module's text).
pub trait Machine {
    /// What it ends with.
    type Output;
    /// What the driver lends it on each call (the node's chunk book for the pool's chunk
    /// machines; `()` for most).
    type Context;

    /// The next step, from the time and the answers to the last step's operations (none on
    /// the first call, and after [`Step::Sleep`] or [`Step::Wait`]).
    ///
    /// `now` is the driver's clock, read before the first call and after each sleep or
    /// wait at least; the drivers of machines that decide by time (the lease takeover, the
    /// store's) read it before every call.
    ///
    /// # Errors
    /// The machine's own verdicts (a node that failed it, a damaged record, contention);
    /// it has then ended, and must be [`abandon`](Machine::abandon)ed.
    fn advance(
        &mut self,
        cx: &mut Self::Context,
        now: Instant,
        answers: &[Answer],
    ) -> Result<Step<Self::Output>>;

    /// The machine is given up before its end (an error, or its driver's deadline): undo
    /// what it reserved in the context.
    fn abandon(&mut self, _cx: &mut Self::Context) {}
}

/// Runs `machine` to its end on simulated regions: `perform` performs each operation
/// (a [`SimRegion`](crate::remote::sim::SimRegion)'s [`apply`](crate::remote::sim::SimRegion::apply),
/// or a simulated cluster's), `clock` is the virtual time, moved on by each
/// [`Step::Sleep`]. A [`Step::Wait`] cannot end in a run of one machine: it is refused as
/// [`Error::Contended`](crate::Error::Contended).
///
/// # Errors
/// The machine's.
pub fn drive_sim<M: Machine>(
    machine: &mut M,
    cx: &mut M::Context,
    clock: &mut Instant,
    mut perform: impl FnMut(&Op) -> Answer,
) -> Result<M::Output> {
    let mut answers = Vec::new();
    loop {
        let step = machine.advance(cx, *clock, &answers).map(Step::listed);
        let step = match step {
            Ok(s) => s,
            Err(e) => {
                machine.abandon(cx);
                return Err(e);
            }
        };
        answers.clear();
        match step {
            Step::Do(ops) => answers = ops.iter().map(&mut perform).collect(),
            Step::One(_) => unreachable!("listed"),
            Step::Sleep(until) => *clock = (*clock).max(until),
            Step::Wait => {
                machine.abandon(cx);
                return Err(crate::Error::Contended {
                    what: "a simulated machine waiting for another task, with none running",
                    rounds: 1,
                });
            }
            Step::Done(out) => return Ok(out),
        }
    }
}
