//! [`Free`]: the object a checked pointer names, and the chunk it empties.

use super::*;

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

    type Context = Book;

    fn advance(&mut self, book: &mut Book, _now: Instant, answers: &[Answer]) -> Result<Step<()>> {
        let l = book.layout;
        let node = book.node;
        over_budget(&mut self.ops, &l)?;
        let answer = book.answer(answers)?;
        let (at, bit) = self.object.bit(&l);
        let chunk_at = l.chunk(self.object.chunk);
        let Some(answer) = answer else {
            self.state = FreeState::Start;
            return Ok(Step::one(node, Io::Read { at, len: 8 }));
        };
        let ptr = self.ptr;
        let clear = |expected: u64| {
            if expected & bit == 0 {
                return Err(Error::NotAllocated(format!("{ptr}: already free")));
            }
            Ok(Step::one(
                node,
                Io::Cas {
                    at,
                    expected,
                    swap: expected & !bit,
                },
            ))
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
                    return Ok(Step::Done(()));
                }
                // Nothing is allocated in it, and only this client allocates there: give
                // it back. Zeroing the magic first makes frees of its objects fail cleanly.
                book.chunks.retain(|c| c.index != chunk);
                book.shapes.remove(&chunk);
                self.state = FreeState::Invalidate;
                Ok(Step::one(
                    node,
                    Io::Cas {
                        at: chunk_at + layout::chunk::MAGIC,
                        expected: layout::CHUNK_MAGIC,
                        swap: 0,
                    },
                ))
            }
            FreeState::Invalidate => {
                self.state = FreeState::Release;
                Ok(Step::one(
                    node,
                    Io::Cas {
                        at: l.table_entry(self.object.chunk),
                        expected: book.id,
                        swap: 0,
                    },
                ))
            }
            FreeState::Release => Ok(Step::Done(())),
        }
    }

    fn abandon(&mut self, _book: &mut Book) {
        // Nothing reserved: a bit cleared remotely whose answer was lost is seen clear by
        // the next look, and a chunk half given back stays this id's until its lease ends.
    }
}
