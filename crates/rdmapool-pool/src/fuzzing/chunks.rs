//! `pool_chunks`: the pool client's recovery, allocation and free machines
//! (`remote::client::chunks`) against whatever a hostile or broken server's region holds
//! (chunk table, chunk headers, bitmaps: any words) and, now and then, answers that contradict
//! the region. Whatever they read, the machines must never panic, never ask for an operation
//! outside the region or at an unaligned word, always end (within their operation budget),
//! and only ever return an object that starts a slot of the requested size class inside a
//! chunk this client owns in its book.

use super::input::Input;
use crate::remote::client::chunks::Recover;
use crate::remote::client::chunks::{Alloc, Answer, Book, Checked, Free, Io, Machine, Step};
use crate::remote::layout::{self, size_class, Layout};
use crate::remote::sim::SimRegion;
use crate::remote::RemotePtr;

const ID: u64 = 7;
const CHUNK: u64 = 64 << 10;
/// Object sizes the program allocates (every kind of class of a 64 KiB chunk).
const SIZES: [u64; 6] = [1, 64, 200, 4096, 16 << 10, 40 << 10];

/// The region (the simulated one the pool's and the store's simulations share) behind a
/// server that lies now and then.
struct Node<'a> {
    layout: Layout,
    region: SimRegion,
    input: Input<'a>,
    /// Every `lie_every`-th answer is a lie (0: none), of the value `lie`.
    lie_every: u64,
    answers: u64,
}

impl Node<'_> {
    /// Performs `io`; every `lie_every`-th answer is replaced by made-up words.
    fn apply(&mut self, io: &Io) -> Answer {
        self.answers += 1;
        let lie = self.lie_every != 0 && self.answers.is_multiple_of(self.lie_every);
        match io {
            Io::Cas { at, .. } => {
                assert!(at.is_multiple_of(8), "unaligned operation at {at}");
                assert!(*at < self.layout.len, "operation at {at} past the region");
            }
            Io::Read { at, len } => {
                assert!(at.is_multiple_of(8), "unaligned read at {at}");
                assert!(
                    *len >= 8 && len.is_multiple_of(8) && *len <= CHUNK,
                    "a read of {len} bytes"
                );
                assert!(
                    at + len <= self.layout.len,
                    "a read past the region: {at}+{len}"
                );
            }
            Io::Write { at, bytes } => {
                assert!(at.is_multiple_of(8), "unaligned write at {at}");
                assert!(
                    bytes.len().is_multiple_of(8) && !bytes.is_empty(),
                    "a write of {}",
                    bytes.len()
                );
            }
            other => panic!("a pool machine asked for {other:?}"),
        }
        let answer = self.region.apply(io);
        assert!(!answer.failed(), "{io:?} failed on the simulated region");
        match answer {
            Answer::Word(_) if lie => Answer::Word(made_up(self.answers)),
            Answer::Bytes(b) if lie => Answer::Bytes(
                (0..b.len() as u64 / 8)
                    .flat_map(|i| made_up(self.answers + i).to_le_bytes())
                    .collect(),
            ),
            a => a,
        }
    }
}

/// A lie: a word a confused server might answer with (0, all ones, this id, any bits).
fn made_up(n: u64) -> u64 {
    let x = crate::remote::client::chunks::spread(n);
    match x % 4 {
        0 => 0,
        1 => u64::MAX,
        2 => ID,
        _ => x,
    }
}

/// Runs `m` to its end; panics if it does not end.
fn drive<M: Machine<Context = Book>>(
    node: &mut Node<'_>,
    book: &mut Book,
    mut m: M,
) -> Option<M::Output> {
    let mut answers = Vec::new();
    let now = std::time::Instant::now();
    for _ in 0..(2 * node.layout.chunk_count + 4096 + 8) {
        match m.advance(book, now, &answers) {
            Ok(Step::One(op)) => answers = vec![node.apply(&op.io)],
            Ok(Step::Do(ops)) => panic!("a chunk machine asks one operation at a time: {ops:?}"),
            Ok(Step::Sleep(_) | Step::Wait) => panic!("one task alone waited"),
            Ok(Step::Done(out)) => return Some(out),
            Err(_) => {
                m.abandon(book);
                return None;
            }
        }
    }
    panic!("a machine ran past its operation budget");
}

/// A word a damaged or hostile region might hold at a table entry or header field.
fn region_word(input: &mut Input<'_>, usual: u64) -> u64 {
    match input.u8() % 6 {
        0 => 0,
        1 => ID,
        2 => 8,
        3 => usual,
        4 => 1 << (input.u8() % 64),
        _ => input.u64(),
    }
}

/// What a program did (for the seed tests).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Summary {
    /// Chunks the first recovery found.
    pub(super) recovered: usize,
    /// Allocations made.
    pub(super) allocated: usize,
    /// Frees that completed.
    pub(super) freed: usize,
    /// Machines that gave up (their answers contradicted each other).
    pub(super) gave_up: usize,
}

/// Runs one program (see the module docs).
pub(super) fn run(data: &[u8]) {
    execute(data);
}

/// Runs one program and says what it did.
pub(super) fn execute(data: &[u8]) -> Summary {
    let mut summary = Summary::default();
    let mut input = Input::new(data);
    let chunks = 1 + u64::from(input.u8() % 7);
    let slots = 1 + u64::from(input.u8() % 8);
    let layout = Layout::new((chunks + 1) * CHUNK, CHUNK, slots).expect("a valid layout");
    let mut words = vec![0u64; (layout.len / 8) as usize];
    // Table entries and chunk headers as the program says, bitmaps with stray bits.
    for c in 0..chunks {
        let entry = (layout.table_entry(c) / 8) as usize;
        words[entry] = region_word(&mut input, ID);
        let h = (layout.chunk(c) / 8) as usize;
        words[h] = region_word(&mut input, layout::CHUNK_MAGIC);
        words[h + 1] = region_word(&mut input, ID);
        let class = size_class(SIZES[input.u8() as usize % SIZES.len()], CHUNK).unwrap_or(64);
        words[h + 2] = region_word(&mut input, class);
        let count = layout::ChunkShape::new(CHUNK, class).object_count;
        words[h + 3] = region_word(&mut input, count);
        for w in 0..(input.u8() % 4) as usize {
            words[h + 4 + w] = region_word(&mut input, u64::MAX);
        }
    }
    let lie_every = u64::from(input.u8() % 8);
    let region = SimRegion::new(layout, 3);
    region.bytes().copy_from_slice(
        &words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let mut node = Node {
        layout,
        region,
        input,
        lie_every,
        answers: 0,
    };
    let incarnation = 3;
    let mut book = Book::new(ID, 1, incarnation, layout);
    drive(&mut node, &mut book, Recover::new());
    summary.recovered = book.owned().len();
    let check_owned = |book: &Book, offset: u64, class: u64| {
        let chunk = layout.chunk_of(offset).expect("an object in the data area");
        let (_, shape) = book
            .owned()
            .into_iter()
            .find(|(c, _)| *c == chunk)
            .expect("an object in a chunk this client owns");
        assert_eq!(shape.object_size, class, "an object of another class");
        let rel = offset - layout.chunk(chunk);
        assert!(shape.object_at(rel).is_some(), "not the start of an object");
    };
    for (chunk, shape) in book.owned() {
        assert!(chunk < layout.chunk_count);
        assert!(layout::is_class(shape.object_size, CHUNK));
    }
    let mut held: Vec<RemotePtr> = Vec::new();
    for _ in 0..32 {
        if node.input.is_empty() {
            break;
        }
        match node.input.u8() % 3 {
            0 => {
                let size = SIZES[node.input.u8() as usize % SIZES.len()];
                let class = size_class(size, CHUNK).expect("fits");
                let result = drive(&mut node, &mut book, Alloc::new(class));
                summary.gave_up += usize::from(result.is_none());
                if let Some(Some(offset)) = result {
                    summary.allocated += 1;
                    check_owned(&book, offset, class);
                    held.push(RemotePtr {
                        node: 1,
                        offset,
                        len: size,
                        incarnation,
                    });
                }
            }
            1 => {
                // Free something held, or a pointer the program makes up.
                let ptr = match (node.input.bool(), held.pop()) {
                    (true, Some(p)) => p,
                    _ => RemotePtr {
                        node: 1,
                        offset: node.input.u32() as u64 % (layout.len + 64),
                        len: u64::from(node.input.u16()),
                        incarnation: if node.input.u8() == 0 { 9 } else { incarnation },
                    },
                };
                let object = match book.check(ptr, true) {
                    Ok(Checked::Known(o)) => o,
                    Ok(Checked::ReadHeader { chunk }) => {
                        assert!(chunk < layout.chunk_count);
                        let at = layout.chunk(chunk);
                        let magic = node.apply(&Io::Read { at, len: 8 }).word();
                        let size = node
                            .apply(&Io::Read {
                                at: at + layout::chunk::OBJECT_SIZE,
                                len: 8,
                            })
                            .word();
                        match book.on_header(ptr, chunk, magic, size) {
                            Ok(o) => o,
                            Err(_) => continue,
                        }
                    }
                    Err(_) => continue,
                };
                assert!(object.chunk < layout.chunk_count);
                match drive(&mut node, &mut book, Free::new(ptr, object)) {
                    Some(_) => summary.freed += 1,
                    None => summary.gave_up += 1,
                }
            }
            _ => {
                // Recover again (a restart) into a fresh book.
                book = Book::new(ID, 1, incarnation, layout);
                drive(&mut node, &mut book, Recover::new());
                held.clear();
            }
        }
    }
    summary
}
