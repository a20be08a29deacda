//! [`Free`]: the object a checked pointer names, and the chunk it empties.

use super::*;

/// Freeing the object a checked pointer names: its bit is cleared with CAS (refused when
/// clear already), from the word the book knows in this client's own chunks (one round
/// trip) or from a READ of it elsewhere (two); when that empties one of this client's
/// chunks, the chunk is given back (its magic zeroed, then its table entry released).
/// [`Free::together`] clears the bits of several objects of one bitmap word with one CAS.
/// The output is how many bits it cleared.
#[derive(Debug)]
pub(crate) struct Free {
    ptr: RemotePtr,
    object: Object,
    /// The bits to clear, all in `object`'s bitmap word.
    mask: u64,
    /// One object: a bit found clear is an error ([`Error::NotAllocated`]). Several: bits
    /// found clear are left (freed by another meanwhile), the others cleared.
    single: bool,
    /// How many bits its CAS cleared.
    cleared: u32,
    state: FreeState,
    ops: u64,
}

#[derive(Debug)]
enum FreeState {
    /// Read the bitmap word (the book did not know it).
    Start,
    /// Clearing the bits from the word's value `expected`.
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
        let mask = 1u64 << (object.number % 64);
        Self {
            ptr,
            object,
            mask,
            single: true,
            cleared: 0,
            state: FreeState::Start,
            ops: 0,
        }
    }

    /// Frees `objects` (from [`Book::check`] with `fresh`), whose bits are all in one
    /// bitmap word, with one CAS; `ptr` names the first (for errors). `None` when they are
    /// not all in one word, or none is given.
    pub(crate) fn together(ptr: RemotePtr, objects: &[Object]) -> Option<Self> {
        let first = *objects.first()?;
        let word = |o: &Object| (o.chunk, o.number / 64);
        if objects.iter().any(|o| word(o) != word(&first)) {
            return None;
        }
        let mask = objects.iter().fold(0, |m, o| m | 1u64 << (o.number % 64));
        Some(Self {
            mask,
            single: false,
            ..Self::new(ptr, first)
        })
    }
}

impl Machine for Free {
    type Output = u32;

    type Context = Book;

    fn advance(&mut self, book: &mut Book, _now: Instant, answers: &[Answer]) -> Result<Step<u32>> {
        let l = book.layout;
        let node = book.node;
        over_budget(&mut self.ops, &l)?;
        let answer = book.answer(answers)?;
        let (at, _) = self.object.bit(&l);
        let bit = self.mask;
        let chunk_at = l.chunk(self.object.chunk);
        let ptr = self.ptr;
        let single = self.single;
        let clear = |expected: u64| {
            if expected & bit == 0 {
                if single {
                    return Err(Error::NotAllocated(format!("{ptr}: already free")));
                }
                // Every one freed by another meanwhile: nothing to clear.
                return Ok(Step::Done(0));
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
        let Some(answer) = answer else {
            // In a chunk of this client's the book knows the word: swap from it at once
            // (a word changed meanwhile fails the swap, whose answer is the word to try
            // next). Elsewhere, or if the book has the bit clear, read the word first.
            let number = self.object.number;
            let known = book
                .view(self.object.chunk)
                .map(|c| c.bits[(number / 64) as usize])
                .filter(|w| w & bit == bit);
            if let Some(expected) = known {
                self.state = FreeState::Clear { expected };
                return clear(expected);
            }
            self.state = FreeState::Start;
            return Ok(Step::one(node, Io::Read { at, len: 8 }));
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
                let cleared = (expected & bit).count_ones();
                let size = self.object.shape.object_size * u64::from(cleared);
                let chunk = self.object.chunk;
                let mut empty = false;
                if let Some(c) = book.view(chunk) {
                    c.bits[(number / 64) as usize] = expected & !bit;
                    empty = c.is_empty();
                    book.used = book.used.saturating_sub(size);
                }
                self.cleared = cleared;
                if !empty {
                    return Ok(Step::Done(cleared));
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
            FreeState::Release => Ok(Step::Done(self.cleared)),
        }
    }

    fn abandon(&mut self, _book: &mut Book) {
        // Nothing reserved: a bit cleared remotely whose answer was lost is seen clear by
        // the next look, and a chunk half given back stays this id's until its lease ends.
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Alloc, Checked, Recover};
    use super::*;
    use crate::remote::sim::SimRegion;
    use crate::remote::step::drive_sim;

    const CHUNK: u64 = 64 << 10;
    const INCARNATION: u64 = 3;

    /// Runs `m` on `region`; its output and how many round trips it took (these machines
    /// ask one operation a round).
    fn run<M: Machine<Context = Book>>(
        mut m: M,
        book: &mut Book,
        region: &SimRegion,
    ) -> (Result<M::Output>, usize) {
        let mut rounds = 0;
        let mut clock = Instant::now();
        let out = drive_sim(&mut m, book, &mut clock, |op| {
            rounds += 1;
            region.apply(&op.io)
        });
        (out, rounds)
    }

    fn ptr(offset: u64) -> RemotePtr {
        RemotePtr {
            node: 1,
            offset,
            len: 64,
            incarnation: INCARNATION,
        }
    }

    /// The object `ptr` names, as a free checks it (`fresh`), reading the chunk header
    /// from the region when the book asks.
    fn object(book: &mut Book, region: &SimRegion, p: RemotePtr) -> Object {
        match book.check(p, true).unwrap() {
            Checked::Known(o) => o,
            Checked::ReadHeader { chunk } => {
                let at = book.layout.chunk(chunk);
                let magic = region.load(at + layout::chunk::MAGIC);
                let size = region.load(at + layout::chunk::OBJECT_SIZE);
                book.on_header(p, chunk, magic, size).unwrap()
            }
        }
    }

    /// A region, the books of its owner (client 7, which allocated `n` objects of 64 bytes)
    /// and of another client (8), the objects, and their chunk's first bitmap word.
    struct Scene {
        region: SimRegion,
        owner: Book,
        other: Book,
        at: Vec<u64>,
        bitmap: u64,
    }

    fn scene(n: usize) -> Scene {
        let l = Layout::new(4 * CHUNK, CHUNK, 4).unwrap();
        let region = SimRegion::new(l, INCARNATION);
        let mut owner = Book::new(7, 1, INCARNATION, l);
        let mut other = Book::new(8, 1, INCARNATION, l);
        run(Recover::new(), &mut owner, &region).0.unwrap();
        run(Recover::new(), &mut other, &region).0.unwrap();
        let at: Vec<u64> = (0..n)
            .map(|_| run(Alloc::new(64), &mut owner, &region).0.unwrap().unwrap())
            .collect();
        let chunk = l.chunk_of(at[0]).unwrap();
        let bitmap = l.chunk(chunk) + layout::chunk::BITMAP;
        Scene {
            region,
            owner,
            other,
            at,
            bitmap,
        }
    }

    #[test]
    fn a_free_swaps_at_once_in_the_clients_own_chunk_and_reads_the_word_first_elsewhere() {
        let Scene {
            region,
            mut owner,
            mut other,
            at,
            bitmap,
        } = scene(4);
        assert_eq!(region.load(bitmap), 0b1111);

        // The owner's book knows the word: one round trip, the swap.
        let o = object(&mut owner, &region, ptr(at[0]));
        let (freed, rounds) = run(Free::new(ptr(at[0]), o), &mut owner, &region);
        assert!(freed.is_ok(), "{freed:?}");
        assert_eq!(rounds, 1);
        assert_eq!(region.load(bitmap), 0b1110);

        // Another client (any may free a durable block) reads the word, then swaps.
        let o = object(&mut other, &region, ptr(at[1]));
        let (freed, rounds) = run(Free::new(ptr(at[1]), o), &mut other, &region);
        assert!(freed.is_ok(), "{freed:?}");
        assert_eq!(rounds, 2);
        assert_eq!(region.load(bitmap), 0b1100);

        // The owner's word is stale now (bit 1 cleared by the other): its swap fails, and
        // the answer is the word it swaps from next. Nothing else is cleared.
        let o = object(&mut owner, &region, ptr(at[2]));
        let (freed, rounds) = run(Free::new(ptr(at[2]), o), &mut owner, &region);
        assert!(freed.is_ok(), "{freed:?}");
        assert_eq!(rounds, 2);
        assert_eq!(region.load(bitmap), 0b1000);

        // A second free of the same object is refused, whoever asks.
        let o = object(&mut owner, &region, ptr(at[2]));
        let (twice, _) = run(Free::new(ptr(at[2]), o), &mut owner, &region);
        assert!(matches!(twice, Err(Error::NotAllocated(_))), "{twice:?}");
        let o = object(&mut other, &region, ptr(at[0]));
        let (twice, _) = run(Free::new(ptr(at[0]), o), &mut other, &region);
        assert!(matches!(twice, Err(Error::NotAllocated(_))), "{twice:?}");
        assert_eq!(region.load(bitmap), 0b1000);
    }

    #[test]
    fn objects_of_one_bitmap_word_are_freed_together_with_one_swap() {
        let Scene {
            region,
            mut owner,
            mut other,
            at,
            bitmap,
        } = scene(70);
        assert_eq!(region.load(bitmap), u64::MAX);
        let freed = |(out, rounds): (Result<u32>, usize)| (out.unwrap(), rounds);
        let objects = |book: &mut Book, which: &[usize]| -> Vec<Object> {
            which
                .iter()
                .map(|&i| object(book, &region, ptr(at[i])))
                .collect()
        };

        // Three of the owner's objects in the first word: one swap, one round trip.
        let os = objects(&mut owner, &[0, 5, 9]);
        let m = Free::together(ptr(at[0]), &os).unwrap();
        assert_eq!(freed(run(m, &mut owner, &region)), (3, 1));
        assert_eq!(region.load(bitmap), !(1 | 1 << 5 | 1 << 9));

        // Another client, with one of its objects already free: it reads the word, swaps
        // the others' bits, and leaves the free one.
        let os = objects(&mut other, &[5, 6, 7]);
        let m = Free::together(ptr(at[5]), &os).unwrap();
        assert_eq!(freed(run(m, &mut other, &region)), (2, 2));
        assert_eq!(
            region.load(bitmap),
            !(1 | 1 << 5 | 1 << 6 | 1 << 7 | 1 << 9)
        );

        // All of them free already: nothing to swap.
        let os = objects(&mut other, &[0, 9]);
        let m = Free::together(ptr(at[0]), &os).unwrap();
        assert_eq!(freed(run(m, &mut other, &region)), (0, 1));

        // Objects of two words are not freed together.
        let os = objects(&mut owner, &[1, 65]);
        assert!(Free::together(ptr(at[1]), &os).is_none());
        assert!(Free::together(ptr(at[1]), &[]).is_none());
    }
}
