//! The control page of a region the soft NIC owns (the last page of its memfd).
//!
//! It publishes the region (rkey, PD, access, address, length) and a state word: a VALID bit
//! and a count of intra-host operations in flight. A peer on this host that mapped the memfd
//! checks its operations against this page ([`grant`]) with the same check as every other
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

fn word(m: &Mapping, field: usize) -> &AtomicU64 {
    m.word(offset(m) + field)
}

/// The state word (VALID and the in-flight count).
pub(crate) fn state(m: &Mapping) -> &AtomicU64 {
    word(m, STATE)
}

/// Publishes a registered region.
pub(crate) fn publish(m: &Mapping, rkey: u32, g: Grant) {
    word(m, RKEY).store(rkey as u64, Ordering::Relaxed);
    word(m, PD).store(g.pd as u64, Ordering::Relaxed);
    word(m, ACCESS).store(g.access.bits() as u64, Ordering::Relaxed);
    word(m, ADDR).store(g.base, Ordering::Relaxed);
    word(m, LEN).store(g.len, Ordering::Relaxed);
    state(m).store(VALID, Ordering::Release);
}

/// What the page says the region under `rkey` grants (`None`: another key). Read after the
/// state word, which the caller loaded with Acquire and found VALID.
pub(crate) fn grant(m: &Mapping, rkey: u32) -> Option<Grant> {
    if word(m, RKEY).load(Ordering::Relaxed) != rkey as u64 {
        return None;
    }
    Some(Grant {
        base: word(m, ADDR).load(Ordering::Relaxed),
        len: word(m, LEN).load(Ordering::Relaxed),
        access: AccessFlags::from_bits_truncate(word(m, ACCESS).load(Ordering::Relaxed) as u32),
        pd: word(m, PD).load(Ordering::Relaxed) as u32,
    })
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
