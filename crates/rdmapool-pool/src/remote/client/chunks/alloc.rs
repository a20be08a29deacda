//! [`Alloc`]: one object of a size class on one node.

use super::*;

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

    fn pick(&mut self, book: &mut Book) -> Step<Option<u64>> {
        if let Some((object, expected)) = book.reserve(self.class) {
            let (at, bit) = object.bit(&book.layout);
            self.state = AllocState::Commit { object, expected };
            return Step::one(
                book.node,
                Io::Cas {
                    at,
                    expected,
                    swap: expected | bit,
                },
            );
        }
        if !self.claimer {
            if book.claiming {
                self.state = AllocState::Pick;
                return Step::Wait;
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

    fn refresh_next(&mut self, book: &mut Book, mut rest: Vec<u64>) -> Step<Option<u64>> {
        let Some(chunk) = rest.pop() else {
            return self.claim_next(book, 0);
        };
        let shape = ChunkShape::new(book.layout.chunk_size, self.class);
        self.state = AllocState::Refresh { chunk, rest };
        Step::one(
            book.node,
            Io::Read {
                at: book.layout.chunk(chunk) + layout::chunk::BITMAP,
                len: shape.object_count.div_ceil(64) * 8,
            },
        )
    }

    fn claim_next(&mut self, book: &mut Book, k: u64) -> Step<Option<u64>> {
        let l = book.layout;
        if k >= l.chunk_count {
            self.drop_claim(book);
            return Step::Done(None);
        }
        let owned = book.chunks.len() as u64;
        let start = match self.state {
            AllocState::Claim { start, .. } => start,
            _ => hash64(book.id ^ owned.wrapping_mul(0x9e37)) % l.chunk_count,
        };
        self.state = AllocState::Claim { start, k };
        Step::one(
            book.node,
            Io::Cas {
                at: l.table_entry((start + k) % l.chunk_count),
                expected: 0,
                swap: book.id,
            },
        )
    }

    fn drop_claim(&mut self, book: &mut Book) {
        if std::mem::take(&mut self.claimer) {
            book.release_claim();
        }
    }
}

impl Machine for Alloc {
    type Output = Option<u64>;
    type Context = Book;

    fn advance(
        &mut self,
        book: &mut Book,
        _now: Instant,
        answers: &[Answer],
    ) -> Result<Step<Option<u64>>> {
        over_budget(&mut self.ops, &book.layout)?;
        let answer = book.answer(answers)?;
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
                    return Ok(Step::Done(Some(
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
                    Step::one(
                        book.node,
                        Io::Cas {
                            at,
                            expected: old,
                            swap: old | bit,
                        },
                    )
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
                Step::one(
                    book.node,
                    Io::Write {
                        at: l.chunk(chunk) + layout::chunk::BITMAP,
                        bytes: vec![0; header - layout::chunk::BITMAP as usize],
                    },
                )
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
                Step::one(
                    book.node,
                    Io::Write {
                        at: l.chunk(chunk),
                        bytes: h,
                    },
                )
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
