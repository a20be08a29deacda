//! A server's region in the simulation: words in memory, one operation at a time.

use super::super::chunks::{Answer, Io};
use crate::remote::layout::Layout;
use crate::remote::sweep::Words;
use std::cell::Cell;

/// One server's region: words in memory, every access atomic (one operation at a time).
pub(super) struct Region {
    pub(super) layout: Layout,
    pub(super) incarnation: u64,
    words: Vec<Cell<u64>>,
}

impl Region {
    pub(super) fn new(layout: Layout, incarnation: u64) -> Self {
        Self {
            layout,
            incarnation,
            words: (0..layout.len / 8).map(|_| Cell::new(0)).collect(),
        }
    }

    fn at(&self, at: u64) -> &Cell<u64> {
        assert!(at.is_multiple_of(8), "unaligned word at {at}");
        &self.words[(at / 8) as usize]
    }

    /// Performs `io` (panics if it leaves the region: a machine must never ask that).
    pub(super) fn apply(&self, io: &Io) -> Answer {
        match io {
            Io::Cas { at, expected, swap } => {
                let w = self.at(*at);
                let old = w.get();
                if old == *expected {
                    w.set(*swap);
                }
                Answer::Word(old)
            }
            Io::Read { at, words: 1 } => Answer::Word(self.at(*at).get()),
            Io::Read { at, words } => Answer::Words(
                (0..*words as u64)
                    .map(|i| self.at(at + i * 8).get())
                    .collect(),
            ),
            Io::Write { at, bytes } => {
                assert!(
                    bytes.len().is_multiple_of(8),
                    "a write of {} bytes",
                    bytes.len()
                );
                for (i, w) in bytes.chunks(8).enumerate() {
                    let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                    self.at(at + i as u64 * 8).set(v);
                }
                Answer::Written
            }
        }
    }
}

impl Words for Region {
    fn load(&self, at: u64) -> u64 {
        self.at(at).get()
    }
    fn store(&self, at: u64, value: u64) {
        self.at(at).set(value)
    }
    fn compare_exchange(&self, at: u64, current: u64, new: u64) -> bool {
        let w = self.at(at);
        let ok = w.get() == current;
        if ok {
            w.set(new);
        }
        ok
    }
}
