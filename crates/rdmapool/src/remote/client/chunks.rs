//! One node's chunks as this client knows them ([`Book`]), and allocation, free and
//! recovery as state machines without I/O ([`Alloc`], [`Free`], [`Recover`]), as
//! `takeover` is for the lease slot.
//!
//! A machine says which one-sided operation to make next ([`Next::Io`]) and decides from
//! what it returned ([`Answer`]), updating the book; `alloc.rs` performs the operations on
//! the node's QP, and the simulated cluster in `sim.rs` performs them on words in memory,
//! interleaving several clients, the server's reaper, freezes and restarts in virtual time.
//! The same machines run against arbitrary region contents in the `pool_chunks` fuzz target.
//!
//! The book is shared by every task of the client that uses the node; each call into a
//! machine holds it for the duration of that call only, never across an operation.

use super::super::layout::{self, is_class, ChunkShape, Layout};
use super::super::RemotePtr;
use super::ops::hash64;
use crate::{Error, Result};
use std::collections::HashMap;

/// Spreads `x` over 64 bits (splitmix64, as probe starts are spread from client ids): the
/// fuzz target's made-up words.
#[cfg(feature = "fuzzing")]
pub(crate) fn spread(x: u64) -> u64 {
    hash64(x)
}

/// A one-sided operation on the node's region (offsets from the region's start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Io {
    /// Compare-and-swap the word at `at` from `expected` to `swap`; answer the old value.
    Cas { at: u64, expected: u64, swap: u64 },
    /// Read `words` 8-byte words at `at`; answer them.
    Read { at: u64, words: usize },
    /// Write `bytes` at `at`, after every earlier operation of the same machine.
    Write { at: u64, bytes: Vec<u8> },
}

/// What an [`Io`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A CAS's old value, or a one-word read.
    Word(u64),
    /// A read of several words.
    Words(Vec<u64>),
    /// A write landed.
    Written,
}

impl Answer {
    fn words(self) -> Vec<u64> {
        match self {
            Answer::Word(w) => vec![w],
            Answer::Words(w) => w,
            Answer::Written => Vec::new(),
        }
    }

    fn word(self) -> u64 {
        match self {
            Answer::Word(w) => w,
            Answer::Words(w) => w.first().copied().unwrap_or(0),
            Answer::Written => 0,
        }
    }
}

/// What a machine wants next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next<T> {
    /// Perform this and feed back its answer.
    Io(Io),
    /// Another task of this client is claiming a chunk on the node: call again once the
    /// book's claim is released ([`Book::take_released`]).
    Wait,
    /// Finished.
    Done(T),
}

/// A state machine of this module: `advance` is called with `None` first, then with the
/// answer to each [`Next::Io`] it asked for (or again with `None` after [`Next::Wait`]).
pub(crate) trait Machine {
    /// What it ends with.
    type Output;
    /// The next step, from the answer to the last one.
    fn advance(&mut self, book: &mut Book, answer: Option<Answer>) -> Result<Next<Self::Output>>;
    /// The operation asked for failed, or the caller gave up on it (its answer will never
    /// come): undo what the machine reserved in the book.
    fn abandon(&mut self, book: &mut Book);
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
    incarnation: u64,
    layout: Layout,
    /// The chunks this client owns.
    chunks: Vec<ChunkView>,
    /// Size classes of chunks (chunk index -> object size): this client's own from the claim
    /// on (exact), others' as last read from their headers, so checking a pointer costs a
    /// lookup, and a READ only the first time a chunk of another client is used.
    shapes: HashMap<u64, u64>,
    /// A task of this client is claiming a chunk (one at a time).
    claiming: bool,
    /// The claim was released since [`Book::take_released`] last looked.
    released: bool,
    /// Bytes of this client's live objects.
    used: u64,
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
    /// An empty book of client `id` for the node of `incarnation` laid out as `layout`.
    pub(crate) fn new(id: u64, incarnation: u64, layout: Layout) -> Self {
        Self {
            id,
            incarnation,
            layout,
            chunks: Vec::new(),
            shapes: HashMap::new(),
            claiming: false,
            released: false,
            used: 0,
        }
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
    /// [`Next::Wait`] should be woken).
    pub(crate) fn take_released(&mut self) -> bool {
        std::mem::take(&mut self.released)
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
    pub(crate) fn check_incarnation(&self, ptr: RemotePtr) -> Result<()> {
        if ptr.incarnation != self.incarnation {
            return Err(Error::StalePointer {
                node: ptr.node,
                incarnation: ptr.incarnation,
                current: self.incarnation,
            });
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

/// Allocating one object of a size class on one node: a free bit of an owned chunk is set
/// with CAS; when every owned chunk of the class is full, the full ones are read again
/// (others may have freed objects in them), and only then is a new chunk claimed with CAS on
/// the table, its header written, and the bit set there. Ends with the object's offset, or
/// `None` when the node has no room.
#[derive(Debug)]
pub(crate) struct Alloc {
    class: u64,
    state: AllocState,
    /// This machine holds the book's claim.
    claimer: bool,
    /// The full chunks were read again already (once per allocation).
    refreshed: bool,
    /// Operations asked for so far (see [`budget`]).
    ops: u64,
}

/// How many operations one allocation or free may take before the node's memory is judged
/// inconsistent: a claim probes each table entry once, and a bit's CAS clashes only as
/// often as other clients clear bits of its word; a server whose answers contradict each
/// other (damaged or hostile) could otherwise keep a machine going for ever.
fn budget(l: &Layout) -> u64 {
    2 * l.chunk_count + 4096
}

fn over_budget(ops: &mut u64, l: &Layout) -> Result<()> {
    *ops += 1;
    if *ops > budget(l) {
        return Err(Error::Malformed {
            what: "pool node's memory",
            reason: format!(
                "its answers contradict each other: no decision after {} operations",
                budget(l)
            ),
        });
    }
    Ok(())
}

#[derive(Debug)]
enum AllocState {
    /// Pick a free bit (or start claiming).
    Pick,
    /// Setting `object`'s bit: the word was `expected`.
    Commit { object: Object, expected: u64 },
    /// Reading the bitmap of `chunk`, one of the full chunks; `rest` are still to read.
    Refresh { chunk: u64, rest: Vec<u64> },
    /// Claiming the table entry at probe position `k` from `start`.
    Claim { start: u64, k: u64 },
    /// Writing chunk `chunk`'s header: the zeroed bitmap first (`bitmap_done` false), then
    /// the shape and the magic.
    Init {
        chunk: u64,
        shape: ChunkShape,
        bitmap_done: bool,
    },
}

impl Alloc {
    /// Allocates an object of `class` (a [`layout::size_class`]).
    pub(crate) fn new(class: u64) -> Self {
        Self {
            class,
            state: AllocState::Pick,
            claimer: false,
            refreshed: false,
            ops: 0,
        }
    }

    fn pick(&mut self, book: &mut Book) -> Next<Option<u64>> {
        if let Some((object, expected)) = book.reserve(self.class) {
            let (at, bit) = object.bit(&book.layout);
            self.state = AllocState::Commit { object, expected };
            return Next::Io(Io::Cas {
                at,
                expected,
                swap: expected | bit,
            });
        }
        if !self.claimer {
            if book.claiming {
                self.state = AllocState::Pick;
                return Next::Wait;
            }
            book.claiming = true;
            self.claimer = true;
            if self.refreshed {
                return self.claim_next(book, 0);
            }
            self.refreshed = true;
            // Before claiming another chunk, look again at the full ones: other clients may
            // have freed objects in them (only clears happen behind our back).
            let full: Vec<u64> = book
                .chunks
                .iter()
                .filter(|c| c.shape.object_size == self.class && c.pending == 0)
                .map(|c| c.index)
                .collect();
            return self.refresh_next(book, full);
        }
        self.claim_next(book, 0)
    }

    fn refresh_next(&mut self, book: &mut Book, mut rest: Vec<u64>) -> Next<Option<u64>> {
        let Some(chunk) = rest.pop() else {
            return self.claim_next(book, 0);
        };
        let shape = ChunkShape::new(book.layout.chunk_size, self.class);
        self.state = AllocState::Refresh { chunk, rest };
        Next::Io(Io::Read {
            at: book.layout.chunk(chunk) + layout::chunk::BITMAP,
            words: shape.object_count.div_ceil(64) as usize,
        })
    }

    fn claim_next(&mut self, book: &mut Book, k: u64) -> Next<Option<u64>> {
        let l = book.layout;
        if k >= l.chunk_count {
            self.drop_claim(book);
            return Next::Done(None);
        }
        let owned = book.chunks.len() as u64;
        let start = match self.state {
            AllocState::Claim { start, .. } => start,
            _ => hash64(book.id ^ owned.wrapping_mul(0x9e37)) % l.chunk_count,
        };
        self.state = AllocState::Claim { start, k };
        Next::Io(Io::Cas {
            at: l.table_entry((start + k) % l.chunk_count),
            expected: 0,
            swap: book.id,
        })
    }

    fn drop_claim(&mut self, book: &mut Book) {
        if std::mem::take(&mut self.claimer) {
            book.release_claim();
        }
    }
}

impl Machine for Alloc {
    type Output = Option<u64>;

    fn advance(&mut self, book: &mut Book, answer: Option<Answer>) -> Result<Next<Option<u64>>> {
        over_budget(&mut self.ops, &book.layout)?;
        let state = std::mem::replace(&mut self.state, AllocState::Pick);
        let Some(answer) = answer else {
            return Ok(self.pick(book));
        };
        let l = book.layout;
        Ok(match state {
            AllocState::Pick => self.pick(book),
            AllocState::Commit { object, expected } => {
                let (at, bit) = object.bit(&l);
                let old = answer.word();
                let view = book.view(object.chunk);
                if old == expected {
                    if let Some(c) = view {
                        c.pending -= 1;
                        c.bits[(object.number / 64) as usize] = expected | bit;
                    }
                    book.used += object.shape.object_size;
                    self.drop_claim(book);
                    return Ok(Next::Done(Some(
                        l.chunk(object.chunk)
                            + object.shape.first_object
                            + object.number * object.shape.object_size,
                    )));
                }
                if old & bit == 0 {
                    // Only we set bits here: a clash means our view was stale the other way
                    // (bits others cleared); retry on what is really there.
                    self.state = AllocState::Commit {
                        object,
                        expected: old,
                    };
                    Next::Io(Io::Cas {
                        at,
                        expected: old,
                        swap: old | bit,
                    })
                } else {
                    // Set remotely although our view had it clear: the view lied (a damaged
                    // or hostile bitmap); the bit stays set in the view, pick another.
                    if let Some(c) = view {
                        c.pending -= 1;
                        c.bits[(object.number / 64) as usize] |= old;
                    }
                    self.pick(book)
                }
            }
            AllocState::Refresh { chunk, rest } => {
                let bits = answer.words();
                if let Some(c) = book.chunks.iter_mut().find(|c| c.index == chunk) {
                    if c.pending == 0 {
                        let fresh = ChunkView::new(chunk, c.shape, bits);
                        let before = c.live();
                        c.bits = fresh.bits;
                        let after = c.live();
                        let size = c.shape.object_size;
                        book.used = book
                            .used
                            .saturating_sub(before.saturating_sub(after) * size);
                    }
                }
                let room = book
                    .chunks
                    .iter()
                    .any(|c| c.shape.object_size == self.class && c.free_bit().is_some());
                if room {
                    self.drop_claim(book);
                    self.pick(book)
                } else {
                    self.refresh_next(book, rest)
                }
            }
            AllocState::Claim { start, k } => {
                self.state = AllocState::Claim { start, k };
                if answer.word() != 0 {
                    return Ok(self.claim_next(book, k + 1));
                }
                let chunk = (start + k) % l.chunk_count;
                let shape = ChunkShape::new(l.chunk_size, self.class);
                let header = shape.first_object as usize;
                self.state = AllocState::Init {
                    chunk,
                    shape,
                    bitmap_done: false,
                };
                Next::Io(Io::Write {
                    at: l.chunk(chunk) + layout::chunk::BITMAP,
                    bytes: vec![0; header - layout::chunk::BITMAP as usize],
                })
            }
            AllocState::Init {
                chunk,
                shape,
                bitmap_done: false,
            } => {
                let mut h = vec![0u8; layout::chunk::BITMAP as usize];
                for (field, value) in [
                    (layout::chunk::MAGIC, layout::CHUNK_MAGIC),
                    (layout::chunk::OWNER, book.id),
                    (layout::chunk::OBJECT_SIZE, shape.object_size),
                    (layout::chunk::OBJECT_COUNT, shape.object_count),
                ] {
                    let at = field as usize;
                    h[at..at + 8].copy_from_slice(&value.to_le_bytes());
                }
                self.state = AllocState::Init {
                    chunk,
                    shape,
                    bitmap_done: true,
                };
                Next::Io(Io::Write {
                    at: l.chunk(chunk),
                    bytes: h,
                })
            }
            AllocState::Init {
                chunk,
                shape,
                bitmap_done: true,
            } => {
                book.shapes.insert(chunk, shape.object_size);
                // (A view of it already there means the server said a chunk of ours was
                // free: its header and bitmap are the ones just written.)
                book.chunks.retain(|c| c.index != chunk);
                book.chunks.push(ChunkView::new(chunk, shape, Vec::new()));
                self.drop_claim(book);
                self.pick(book)
            }
        })
    }

    fn abandon(&mut self, book: &mut Book) {
        if let AllocState::Commit { object, .. } = self.state {
            let (_, bit) = object.bit(&book.layout);
            if let Some(c) = book.view(object.chunk) {
                c.pending -= 1;
                // Whether the CAS landed is unknown: a clear bit is tried again later (and
                // the CAS then finds it set if it did).
                c.bits[(object.number / 64) as usize] &= !bit;
            }
        }
        // A claimed table entry whose header was never written stays this id's until its
        // lease ends (recovery skips it): a leak bounded by the failed claims.
        self.state = AllocState::Pick;
        self.drop_claim(book);
    }
}

/// Freeing the object a checked pointer names: its bit is cleared with CAS (refused when
/// clear already); when that empties one of this client's chunks, the chunk is given back
/// (its magic zeroed, then its table entry released).
#[derive(Debug)]
pub(crate) struct Free {
    ptr: RemotePtr,
    object: Object,
    state: FreeState,
    ops: u64,
}

#[derive(Debug)]
enum FreeState {
    /// Read the bitmap word.
    Start,
    /// Clearing the bit from the word's value `expected`.
    Clear { expected: u64 },
    /// Zeroing the emptied chunk's magic.
    Invalidate,
    /// Releasing its table entry.
    Release,
}

impl Free {
    /// Frees `object`, which `ptr` names (from [`Book::check`] with `fresh`, or
    /// [`Book::on_header`]).
    pub(crate) fn new(ptr: RemotePtr, object: Object) -> Self {
        Self {
            ptr,
            object,
            state: FreeState::Start,
            ops: 0,
        }
    }
}

impl Machine for Free {
    type Output = ();

    fn advance(&mut self, book: &mut Book, answer: Option<Answer>) -> Result<Next<()>> {
        let l = book.layout;
        over_budget(&mut self.ops, &l)?;
        let (at, bit) = self.object.bit(&l);
        let chunk_at = l.chunk(self.object.chunk);
        let Some(answer) = answer else {
            self.state = FreeState::Start;
            return Ok(Next::Io(Io::Read { at, words: 1 }));
        };
        let ptr = self.ptr;
        let clear = |expected: u64| {
            if expected & bit == 0 {
                return Err(Error::NotAllocated(format!("{ptr}: already free")));
            }
            Ok(Next::Io(Io::Cas {
                at,
                expected,
                swap: expected & !bit,
            }))
        };
        match self.state {
            FreeState::Start => {
                let expected = answer.word();
                self.state = FreeState::Clear { expected };
                clear(expected)
            }
            FreeState::Clear { expected } => {
                let old = answer.word();
                if old != expected {
                    self.state = FreeState::Clear { expected: old };
                    return clear(old);
                }
                let number = self.object.number;
                let size = self.object.shape.object_size;
                let chunk = self.object.chunk;
                let mut empty = false;
                if let Some(c) = book.view(chunk) {
                    c.bits[(number / 64) as usize] = expected & !bit;
                    empty = c.is_empty();
                    book.used = book.used.saturating_sub(size);
                }
                if !empty {
                    return Ok(Next::Done(()));
                }
                // Nothing is allocated in it, and only this client allocates there: give
                // it back. Zeroing the magic first makes frees of its objects fail cleanly.
                book.chunks.retain(|c| c.index != chunk);
                book.shapes.remove(&chunk);
                self.state = FreeState::Invalidate;
                Ok(Next::Io(Io::Cas {
                    at: chunk_at + layout::chunk::MAGIC,
                    expected: layout::CHUNK_MAGIC,
                    swap: 0,
                }))
            }
            FreeState::Invalidate => {
                self.state = FreeState::Release;
                Ok(Next::Io(Io::Cas {
                    at: l.table_entry(self.object.chunk),
                    expected: book.id,
                    swap: 0,
                }))
            }
            FreeState::Release => Ok(Next::Done(())),
        }
    }

    fn abandon(&mut self, _book: &mut Book) {
        // Nothing reserved: a bit cleared remotely whose answer was lost is seen clear by
        // the next look, and a chunk half given back stays this id's until its lease ends.
    }
}

/// Finding, after a restart, the chunks the table says this id owns, and rebuilding their
/// views from their headers and bitmaps. A chunk whose header is not valid (never
/// initialised, taken back, damaged, or naming another owner) is not used.
#[derive(Debug)]
pub(crate) struct Recover {
    state: RecoverState,
    /// Owned chunks still to read, last first.
    owned: Vec<u64>,
}

#[derive(Debug)]
enum RecoverState {
    /// Reading the table from entry `first`.
    Table { first: u64 },
    /// Reading chunk `chunk`'s header.
    Header { chunk: u64 },
    /// Reading chunk `chunk`'s bitmap.
    Bitmap { chunk: u64, shape: ChunkShape },
}

/// Table entries read at once (one READ per entry made connecting take a round trip per
/// chunk: longer than a lease on a slow link).
const TABLE_BATCH: u64 = 4096;

impl Recover {
    /// Recovers into an empty book.
    pub(crate) fn new() -> Self {
        Self {
            state: RecoverState::Table { first: 0 },
            owned: Vec::new(),
        }
    }

    fn table(&mut self, l: &Layout, first: u64) -> Next<()> {
        self.state = RecoverState::Table { first };
        let n = (l.chunk_count - first).min(TABLE_BATCH);
        Next::Io(Io::Read {
            at: l.table_entry(first),
            words: (n * layout::TABLE_ENTRY / 8) as usize,
        })
    }

    fn next_chunk(&mut self, l: &Layout) -> Next<()> {
        match self.owned.pop() {
            Some(chunk) => {
                self.state = RecoverState::Header { chunk };
                Next::Io(Io::Read {
                    at: l.chunk(chunk),
                    words: (layout::chunk::BITMAP / 8) as usize,
                })
            }
            None => Next::Done(()),
        }
    }
}

impl Machine for Recover {
    type Output = ();

    fn advance(&mut self, book: &mut Book, answer: Option<Answer>) -> Result<Next<()>> {
        let l = book.layout;
        let Some(answer) = answer else {
            return Ok(self.table(&l, 0));
        };
        match self.state {
            RecoverState::Table { first } => {
                let per_entry = (layout::TABLE_ENTRY / 8) as usize;
                let words = answer.words();
                for (i, entry) in words.chunks(per_entry).enumerate() {
                    if entry[0] == book.id {
                        self.owned.push(first + i as u64);
                    }
                }
                let next = first + TABLE_BATCH;
                if next < l.chunk_count {
                    return Ok(self.table(&l, next));
                }
                self.owned.reverse();
                Ok(self.next_chunk(&l))
            }
            RecoverState::Header { chunk } => {
                let h = answer.words();
                let field = |f: u64| h.get((f / 8) as usize).copied().unwrap_or(0);
                let size = field(layout::chunk::OBJECT_SIZE);
                let valid = field(layout::chunk::MAGIC) == layout::CHUNK_MAGIC
                    && field(layout::chunk::OWNER) == book.id
                    && is_class(size, l.chunk_size)
                    && field(layout::chunk::OBJECT_COUNT)
                        == ChunkShape::new(l.chunk_size, size).object_count;
                if !valid {
                    return Ok(self.next_chunk(&l));
                }
                let shape = ChunkShape::new(l.chunk_size, size);
                self.state = RecoverState::Bitmap { chunk, shape };
                Ok(Next::Io(Io::Read {
                    at: l.chunk(chunk) + layout::chunk::BITMAP,
                    words: shape.object_count.div_ceil(64) as usize,
                }))
            }
            RecoverState::Bitmap { chunk, shape } => {
                let view = ChunkView::new(chunk, shape, answer.words());
                book.used += view.live() * shape.object_size;
                book.shapes.insert(chunk, shape.object_size);
                book.chunks.retain(|c| c.index != chunk);
                book.chunks.push(view);
                Ok(self.next_chunk(&l))
            }
        }
    }

    fn abandon(&mut self, _book: &mut Book) {}
}
