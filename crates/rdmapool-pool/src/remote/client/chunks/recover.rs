//! [`Recover`]: this id's chunks, found again after a restart.

use super::*;

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

    fn table(&mut self, node: u32, l: &Layout, first: u64) -> Step<()> {
        self.state = RecoverState::Table { first };
        let n = (l.chunk_count - first).min(TABLE_BATCH);
        Step::one(
            node,
            Io::Read {
                at: l.table_entry(first),
                len: n * layout::TABLE_ENTRY,
            },
        )
    }

    fn next_chunk(&mut self, node: u32, l: &Layout) -> Step<()> {
        match self.owned.pop() {
            Some(chunk) => {
                self.state = RecoverState::Header { chunk };
                Step::one(
                    node,
                    Io::Read {
                        at: l.chunk(chunk),
                        len: layout::chunk::BITMAP,
                    },
                )
            }
            None => Step::Done(()),
        }
    }
}

impl Machine for Recover {
    type Output = ();

    type Context = Book;

    fn advance(&mut self, book: &mut Book, _now: Instant, answers: &[Answer]) -> Result<Step<()>> {
        let l = book.layout;
        let node = book.node;
        let answer = book.answer(answers)?;
        let Some(answer) = answer else {
            return Ok(self.table(node, &l, 0));
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
                    return Ok(self.table(node, &l, next));
                }
                self.owned.reverse();
                Ok(self.next_chunk(node, &l))
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
                    return Ok(self.next_chunk(node, &l));
                }
                let shape = ChunkShape::new(l.chunk_size, size);
                self.state = RecoverState::Bitmap { chunk, shape };
                Ok(Step::one(
                    node,
                    Io::Read {
                        at: l.chunk(chunk) + layout::chunk::BITMAP,
                        len: shape.object_count.div_ceil(64) * 8,
                    },
                ))
            }
            RecoverState::Bitmap { chunk, shape } => {
                let view = ChunkView::new(chunk, shape, answer.words());
                book.used += view.live() * shape.object_size;
                book.shapes.insert(chunk, shape.object_size);
                book.chunks.retain(|c| c.index != chunk);
                book.chunks.push(view);
                Ok(self.next_chunk(node, &l))
            }
        }
    }
}
