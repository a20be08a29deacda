//! The control page of a region the soft NIC owns (the last page of its memfd).
//!
//! It publishes the region (rkey, PD, access, address, length) and a state word: a VALID bit
//! and a count of intra-host operations in flight. A peer on this host that mapped the memfd
//! checks its operations against this page ([`Page::grant`]) with the same check as every other
//! path; deregistration clears VALID, then waits for operations in flight ([`retract`]).

use super::access::Grant;
use crate::fabric::AccessFlags;
use crate::os::mapping::Mapping;
use crate::util::page_size;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Set in the state word while the region is registered.
pub(crate) const VALID: u64 = 1 << 63;
const STATE: usize = 0;
const RKEY: usize = 8;
const PD: usize = 16;
const ACCESS: usize = 24;
const ADDR: usize = 32;
const LEN: usize = 40;
/// How long deregistration waits for a peer's in-flight operation (it can only be missing if
/// the peer died mid-copy; the peer's mapping keeps the pages alive either way).
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// Bytes to allocate for a region of `len` bytes plus its control page.
pub(crate) fn len_with_control(len: usize) -> usize {
    let page = page_size();
    len.div_ceil(page) * page + page
}

/// Where the control page starts (the data ends there).
pub(crate) fn offset(m: &Mapping) -> usize {
    m.len() - page_size()
}

/// The control page's words, found and bounds-checked once for all of them (the
/// intra-host path reads several per operation).
#[derive(Clone, Copy)]
pub(crate) struct Page<'a> {
    words: &'a [AtomicU64; WORDS],
}

/// Words the page uses (STATE to LEN).
const WORDS: usize = LEN / 8 + 1;

/// The control page of `m`.
pub(crate) fn page(m: &Mapping) -> Page<'_> {
    page_at(m, offset(m))
}

/// The control page of `m`, which starts at `at` (its [`offset`], computed once by callers
/// that look at the page per operation).
pub(crate) fn page_at(m: &Mapping, at: usize) -> Page<'_> {
    m.word(at + LEN); // bounds: the last word is inside the mapping (asserts)
                      // SAFETY: the first and the last of the WORDS consecutive aligned words are inside the
                      // mapping (`word` checked both), so all are; they live as long as the borrow of `m`,
                      // and an array of atomics has the layout of its elements.
    let words = unsafe { &*(m.word(at) as *const AtomicU64 as *const [AtomicU64; WORDS]) };
    Page { words }
}

impl<'a> Page<'a> {
    fn word(self, field: usize) -> &'a AtomicU64 {
        &self.words[field / 8]
    }

    /// The state word (VALID and the in-flight count).
    pub(crate) fn state(self) -> &'a AtomicU64 {
        self.word(STATE)
    }

    /// What the page says the region under `rkey` grants (`None`: another key). Read after
    /// the state word, which the caller loaded with Acquire and found VALID.
    pub(crate) fn grant(self, rkey: u32) -> Option<Grant> {
        if self.word(RKEY).load(Ordering::Relaxed) != rkey as u64 {
            return None;
        }
        Some(Grant {
            base: self.word(ADDR).load(Ordering::Relaxed),
            len: self.word(LEN).load(Ordering::Relaxed),
            access: AccessFlags::from_bits_truncate(
                self.word(ACCESS).load(Ordering::Relaxed) as u32
            ),
            pd: self.word(PD).load(Ordering::Relaxed) as u32,
        })
    }
}

/// The state word (VALID and the in-flight count).
pub(crate) fn state(m: &Mapping) -> &AtomicU64 {
    page(m).state()
}

/// Publishes a registered region.
pub(crate) fn publish(m: &Mapping, rkey: u32, g: Grant) {
    let p = page(m);
    p.word(RKEY).store(rkey as u64, Ordering::Relaxed);
    p.word(PD).store(g.pd as u64, Ordering::Relaxed);
    p.word(ACCESS)
        .store(g.access.bits() as u64, Ordering::Relaxed);
    p.word(ADDR).store(g.base, Ordering::Relaxed);
    p.word(LEN).store(g.len, Ordering::Relaxed);
    p.state().store(VALID, Ordering::Release);
}

/// Withdraws a region: peers' later operations fail; waits for those already copying.
pub(crate) fn retract(m: &Mapping) {
    let state = state(m);
    state.fetch_and(!VALID, Ordering::AcqRel);
    let until = Instant::now() + DRAIN_LIMIT;
    while state.load(Ordering::Acquire) != 0 && Instant::now() < until {
        std::thread::yield_now();
    }
}
