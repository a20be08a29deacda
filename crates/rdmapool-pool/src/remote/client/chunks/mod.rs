//! One node's chunks as this client knows them ([`Book`]), and allocation, free and
//! recovery as state machines without I/O ([`Alloc`], [`Free`], [`Recover`]), as
//! `takeover` is for the lease slot.
//!
//! They are [`Machine`]s of the one vocabulary (`remote/step.rs`), with the node's book as
//! their context: a machine says which one-sided operation to make next ([`Step::Do`]) and
//! decides from what it returned ([`Answer`]), updating the book; `alloc.rs` performs the
//! operations on the node's QP, and the simulated cluster in `sim/` on a `SimRegion`,
//! interleaving several clients, the server's reaper, freezes and restarts in virtual time.
//! The same machines run against arbitrary region contents in the `pool_chunks` fuzz target.
//!
//! The book is shared by every task of the client that uses the node; each call into a
//! machine holds it for the duration of that call only, never across an operation.

use super::super::layout::{self, is_class, ChunkShape, Layout};
use super::super::RemotePtr;
use crate::remote::layout::hash64;
pub(crate) use crate::remote::step::{Answer, Io, Machine, Step};
use crate::{Error, Result};
use rustc_hash::FxHashMap;
use std::time::Instant;

mod alloc;
mod free;
mod recover;

pub(crate) use alloc::Alloc;
pub(crate) use free::Free;
pub(crate) use recover::Recover;

/// Spreads `x` over 64 bits (splitmix64, as probe starts are spread from client ids): the
/// fuzz target's made-up words.
#[cfg(feature = "fuzzing")]
pub(crate) fn spread(x: u64) -> u64 {
    hash64(x)
}

/// A chunk this client owns: its shape and what it knows of its bitmap (the client is the
/// only one that sets bits; others only clear them, so a set bit here may be stale, a clear
/// one never is).
#[derive(Debug, Clone)]
pub(crate) struct ChunkView {
    pub(crate) index: u64,
    pub(crate) shape: ChunkShape,
    pub(crate) bits: Vec<u64>,
    /// Objects reserved locally and not yet committed remotely.
    pub(crate) pending: u64,
}

impl ChunkView {
    fn new(index: u64, shape: ChunkShape, mut bits: Vec<u64>) -> Self {
        bits.resize(shape.object_count.div_ceil(64) as usize, 0);
        // Bits past the last object mean nothing (and a damaged bitmap may set them).
        if let Some(last) = bits.last_mut() {
            let tail = shape.object_count % 64;
            if tail != 0 {
                *last &= (1u64 << tail) - 1;
            }
        }
        Self {
            index,
            shape,
            bits,
            pending: 0,
        }
    }

    fn free_bit(&self) -> Option<u64> {
        for (w, &word) in self.bits.iter().enumerate() {
            if word != u64::MAX {
                let obj = w as u64 * 64 + (!word).trailing_zeros() as u64;
                if obj < self.shape.object_count {
                    return Some(obj);
                }
            }
        }
        None
    }

    fn live(&self) -> u64 {
        self.bits.iter().map(|w| w.count_ones() as u64).sum()
    }

    fn is_empty(&self) -> bool {
        self.pending == 0 && self.bits.iter().all(|&w| w == 0)
    }
}

/// One node's chunks as this client knows them.
#[derive(Debug)]
pub(crate) struct Book {
    id: u64,
    /// The node's id (the machines' operations name it).
    node: u32,
    incarnation: u64,
    layout: Layout,
    /// The chunks this client owns.
    chunks: Vec<ChunkView>,
    /// Size classes of chunks (chunk index -> object size): this client's own from the claim
    /// on (exact), others' as last read from their headers, so checking a pointer costs a
    /// lookup, and a READ only the first time a chunk of another client is used.
    shapes: FxHashMap<u64, u64>,
    /// A task of this client is claiming a chunk (one at a time).
    claiming: bool,
    /// The claim was released since [`Book::take_released`] last looked.
    released: bool,
    /// Bytes of this client's live objects.
    used: u64,
    /// Chunks this client owned in an earlier session on this same incarnation that the
    /// server took back when its lease lapsed: pointers into them are refused (unless this
    /// client owns the chunk again).
    lapsed: std::collections::HashSet<u64>,
}

/// Where a pointer's object is, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Object {
    pub(crate) chunk: u64,
    pub(crate) shape: ChunkShape,
    pub(crate) number: u64,
}

impl Object {
    /// The bitmap word holding its bit, and the bit.
    pub(crate) fn bit(&self, l: &Layout) -> (u64, u64) {
        (
            l.chunk(self.chunk) + layout::chunk::BITMAP + (self.number / 64) * 8,
            1u64 << (self.number % 64),
        )
    }
}

/// What [`Book::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The pointer names this object.
    Known(Object),
    /// Chunk `chunk`'s header must be read first: read its magic and object size, give them
    /// to [`Book::on_header`], then check again.
    ReadHeader { chunk: u64 },
}

impl Book {
    /// An empty book of client `id` for node `node` of `incarnation` laid out as `layout`.
    pub(crate) fn new(id: u64, node: u32, incarnation: u64, layout: Layout) -> Self {
        Self {
            id,
            node,
            incarnation,
            layout,
            chunks: Vec::new(),
            shapes: FxHashMap::default(),
            claiming: false,
            released: false,
            used: 0,
            lapsed: std::collections::HashSet::new(),
        }
    }

    /// This book follows `earlier`, the book of a session on the same incarnation that
    /// ended with the node down (this one was rebuilt by recovery): the chunks `earlier`
    /// owned that this one does not were taken back with a lapsed lease.
    pub(crate) fn follow(&mut self, earlier: &Book) {
        let lost = earlier
            .chunks
            .iter()
            .map(|c| c.index)
            .filter(|i| !self.chunks.iter().any(|c| c.index == *i));
        self.lapsed
            .extend(earlier.lapsed.iter().copied().chain(lost));
    }

    /// Bytes of this client's live objects on the node, as far as it knows.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// The chunks this client owns, with their shapes.
    pub(crate) fn owned(&self) -> Vec<(u64, ChunkShape)> {
        self.chunks.iter().map(|c| (c.index, c.shape)).collect()
    }

    /// Whether a claim was released since the last call (then tasks waiting on
    /// [`Step::Wait`] should be woken).
    pub(crate) fn take_released(&mut self) -> bool {
        std::mem::take(&mut self.released)
    }

    /// The answer to a machine's one operation (`None` on a call without answers); a
    /// failed operation fails the machine, as a failed operation does in the real driver.
    fn answer<'a>(&self, answers: &'a [Answer]) -> Result<Option<&'a Answer>> {
        match answers.first() {
            Some(Answer::Failed) => Err(Error::NodeDown {
                node: self.node,
                reason: "a one-sided operation on its chunks failed".into(),
            }),
            a => Ok(a),
        }
    }

    fn release_claim(&mut self) {
        self.claiming = false;
        self.released = true;
    }

    fn view(&mut self, chunk: u64) -> Option<&mut ChunkView> {
        self.chunks.iter_mut().find(|c| c.index == chunk)
    }

    /// `Err(StalePointer)` unless `ptr` names this node's incarnation (checked before any
    /// byte moves: a restarted server's new memory is never reached through a pointer into
    /// its predecessor's).
    ///
    /// Also `Err(LeaseLapsed)` for a pointer into a chunk this client lost with a lapsed
    /// lease in an earlier session on this incarnation ([`Book::follow`]).
    pub(crate) fn check_incarnation(&self, ptr: RemotePtr) -> Result<()> {
        if ptr.incarnation != self.incarnation {
            return Err(Error::StalePointer {
                node: ptr.node,
                incarnation: ptr.incarnation,
                current: self.incarnation,
            });
        }
        if !self.lapsed.is_empty() {
            if let Some(chunk) = self.layout.chunk_of(ptr.offset) {
                if self.lapsed.contains(&chunk) && !self.chunks.iter().any(|c| c.index == chunk) {
                    return Err(Error::LeaseLapsed {
                        node: ptr.node,
                        chunk,
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks that `ptr` names this node's incarnation, starts an object of an initialised
    /// chunk and is no longer than that object. A shape remembered from an earlier look that
    /// refuses `ptr` is read again (the chunk may have been given back and claimed for
    /// another size class since). With `fresh`, a chunk that is not this client's is always
    /// read (its header says whether it still holds objects).
    pub(crate) fn check(&self, ptr: RemotePtr, fresh: bool) -> Result<Checked> {
        self.check_incarnation(ptr)?;
        let l = &self.layout;
        let bad = |why: &str| Error::NotAllocated(format!("{ptr}: {why}"));
        let end = ptr.offset.checked_add(ptr.len);
        if ptr.offset < l.data_offset || end.is_none_or(|e| e > l.len) {
            return Err(bad(&format!("outside node {}'s pool", ptr.node)));
        }
        let chunk = l
            .chunk_of(ptr.offset)
            .ok_or_else(|| bad("not in a chunk"))?;
        let own = self
            .chunks
            .iter()
            .find(|c| c.index == chunk)
            .map(|c| c.shape);
        let cached = match (own, fresh) {
            (Some(shape), _) => Some(shape),
            (None, true) => None,
            (None, false) => self
                .shapes
                .get(&chunk)
                .map(|&size| ChunkShape::new(l.chunk_size, size)),
        };
        match cached {
            Some(shape) => match self.judge(ptr, chunk, shape) {
                Ok(o) => Ok(Checked::Known(o)),
                Err(e) if own.is_some() => Err(e),
                Err(_) => Ok(Checked::ReadHeader { chunk }),
            },
            None => Ok(Checked::ReadHeader { chunk }),
        }
    }

    /// Chunk `chunk`'s header as just read (`magic`, `object_size`): remembers its size
    /// class and checks `ptr` against it.
    pub(crate) fn on_header(
        &mut self,
        ptr: RemotePtr,
        chunk: u64,
        magic: u64,
        object_size: u64,
    ) -> Result<Object> {
        let bad = |why: &str| {
            Error::NotAllocated(format!("{ptr}: node {} chunk {chunk}: {why}", ptr.node))
        };
        if magic != layout::CHUNK_MAGIC {
            self.shapes.remove(&chunk);
            return Err(bad(
                "holds no objects (all freed, or taken back when the lease of the client that \
                 allocated them ran out)",
            ));
        }
        if !is_class(object_size, self.layout.chunk_size) {
            self.shapes.remove(&chunk);
            return Err(bad("its header is damaged"));
        }
        self.shapes.insert(chunk, object_size);
        self.judge(
            ptr,
            chunk,
            ChunkShape::new(self.layout.chunk_size, object_size),
        )
    }

    fn judge(&self, ptr: RemotePtr, chunk: u64, shape: ChunkShape) -> Result<Object> {
        let number = shape
            .object_at(ptr.offset - self.layout.chunk(chunk))
            .ok_or_else(|| Error::NotAllocated(format!("{ptr}: not the start of an object")))?;
        if ptr.len > shape.object_size {
            return Err(Error::OutOfBounds {
                offset: 0,
                len: ptr.len,
                limit: shape.object_size,
            });
        }
        Ok(Object {
            chunk,
            shape,
            number,
        })
    }

    /// Sets a free bit of an owned chunk of `class` in the view (reserved until committed).
    fn reserve(&mut self, class: u64) -> Option<(Object, u64)> {
        let c = self
            .chunks
            .iter_mut()
            .find(|c| c.shape.object_size == class && c.free_bit().is_some())?;
        let number = c.free_bit()?;
        let w = (number / 64) as usize;
        let expected = c.bits[w];
        c.bits[w] |= 1 << (number % 64);
        c.pending += 1;
        Some((
            Object {
                chunk: c.index,
                shape: c.shape,
                number,
            },
            expected,
        ))
    }
}

/// How many operations one allocation or free may take before the node's memory is judged
/// inconsistent: a claim probes each table entry once, and a bit's CAS clashes only as
/// often as other clients clear bits of its word; a server whose answers contradict each
/// other (damaged or hostile) could otherwise keep a machine going for ever.
pub(super) fn budget(l: &Layout) -> u64 {
    2 * l.chunk_count + 4096
}

pub(super) fn over_budget(ops: &mut u64, l: &Layout) -> Result<()> {
    *ops += 1;
    if *ops > budget(l) {
        return Err(Error::Core(crate::CoreError::Malformed {
            what: "pool node's memory",
            reason: format!(
                "its answers contradict each other: no decision after {} operations",
                budget(l)
            ),
        }));
    }
    Ok(())
}
