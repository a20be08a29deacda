//! The simulated server region that the pool's and the store's simulations share (feature
//! `sim`, and in this crate's tests): a region's bytes in memory, one operation at a time,
//! performing the [`Io`] of the [`step`](crate::remote::step) vocabulary as a server's NIC
//! would. The pool's simulated cluster interleaves clients, the server's sweep and faults
//! on it; the chunk fuzz target wraps it in a server that lies; the store's simulations
//! keep one per node and allocate blocks beside it.

use crate::remote::layout::Layout;
use crate::remote::step::{Answer, Io};
use std::cell::{RefCell, RefMut};

/// One server's region (see the module's text). Shared by reference between the machines
/// and the simulated server: every access takes the bytes for that access alone.
#[derive(Debug)]
pub struct SimRegion {
    /// Its layout.
    pub layout: Layout,
    /// Its incarnation (a restarted server's region is another one).
    pub incarnation: u64,
    bytes: RefCell<Vec<u8>>,
}

impl SimRegion {
    /// A zeroed region laid out as `layout`, of incarnation `incarnation`.
    pub fn new(layout: Layout, incarnation: u64) -> Self {
        Self {
            layout,
            incarnation,
            bytes: RefCell::new(vec![0; layout.len as usize]),
        }
    }

    /// The region's bytes, to set a scene or look at it (not while an operation runs).
    pub fn bytes(&self) -> RefMut<'_, Vec<u8>> {
        self.bytes.borrow_mut()
    }

    /// Zeroes the region (its server restarted: nothing of its memory survives).
    pub fn wipe(&self) {
        self.bytes.borrow_mut().fill(0);
    }

    /// Whether `len` bytes at `at` lie inside the region.
    pub fn contains(&self, at: u64, len: u64) -> bool {
        at.checked_add(len)
            .is_some_and(|end| end <= self.layout.len)
    }

    /// The word at `at` (8-byte aligned, inside the region).
    ///
    /// # Panics
    /// Outside the region or unaligned: a simulation's own mistake.
    pub fn load(&self, at: u64) -> u64 {
        assert!(at.is_multiple_of(8), "unaligned word at {at}");
        let b = self.bytes.borrow();
        let at = at as usize;
        u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Sets the word at `at` (as [`SimRegion::load`]).
    ///
    /// # Panics
    /// As [`SimRegion::load`].
    pub fn store(&self, at: u64, value: u64) {
        assert!(at.is_multiple_of(8), "unaligned word at {at}");
        let at = at as usize;
        self.bytes.borrow_mut()[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// Performs `io` as the NIC would: [`Answer::Failed`] for an operation outside the
    /// region or a compare-and-swap of an unaligned word (the remote access error a real
    /// one gets). [`Io::Alloc`] and [`Io::WriteWithPayload`] are the client's, not the
    /// region's: a simulated cluster performs them (allocating beside the region, writing
    /// the payload it holds); here they fail.
    pub fn apply(&self, io: &Io) -> Answer {
        match io {
            Io::Cas { at, expected, swap } => {
                if !at.is_multiple_of(8) || !self.contains(*at, 8) {
                    return Answer::Failed;
                }
                let old = self.load(*at);
                if old == *expected {
                    self.store(*at, *swap);
                }
                Answer::Word(old)
            }
            Io::FetchAdd { at, add } => {
                if !at.is_multiple_of(8) || !self.contains(*at, 8) {
                    return Answer::Failed;
                }
                let old = self.load(*at);
                self.store(*at, old.wrapping_add(*add));
                Answer::Word(old)
            }
            Io::Read { at, len } => {
                if !self.contains(*at, *len) {
                    return Answer::Failed;
                }
                let b = self.bytes.borrow();
                Answer::Bytes(b[*at as usize..(*at + *len) as usize].to_vec())
            }
            Io::Write { at, bytes } => self.write(*at, &[bytes]),
            Io::WriteWithPayload { .. } | Io::ReadInto { .. } | Io::Alloc { .. } => Answer::Failed,
        }
    }

    /// Writes `parts`, one after another, at `at`: [`Answer::Written`], or
    /// [`Answer::Failed`] outside the region (a simulated cluster's
    /// [`Io::WriteWithPayload`]).
    pub fn write(&self, at: u64, parts: &[&[u8]]) -> Answer {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if !self.contains(at, len as u64) {
            return Answer::Failed;
        }
        let mut b = self.bytes.borrow_mut();
        let mut off = at as usize;
        for p in parts {
            b[off..off + p.len()].copy_from_slice(p);
            off += p.len();
        }
        Answer::Written
    }
}

impl crate::remote::sweep::Words for SimRegion {
    fn load(&self, at: u64) -> u64 {
        SimRegion::load(self, at)
    }
    fn store(&self, at: u64, value: u64) {
        SimRegion::store(self, at, value)
    }
    fn compare_exchange(&self, at: u64, current: u64, new: u64) -> bool {
        let ok = SimRegion::load(self, at) == current;
        if ok {
            SimRegion::store(self, at, new);
        }
        ok
    }
}
