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
