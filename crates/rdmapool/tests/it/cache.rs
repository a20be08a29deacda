//! The registration cache: sub-range hits, LRU eviction under caps, counters, explicit
//! invalidation, and never a stale registration after munmap + mmap at the same address.

use crate::support::*;
use rdmapool::fabric::RegisteredMemory;
use rdmapool::mr::{CacheConfig, RegCache};

const PAGE: usize = 4096;

/// An anonymous mapping owned by the test (so it can be unmapped and replaced).
fn map(len: usize) -> *mut u8 {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh anonymous mapping chosen by the kernel.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// Maps new memory exactly at `at` (just unmapped by the test), or None if another thread
/// took the address meanwhile. MAP_FIXED_NOREPLACE never clobbers someone else's mapping.
fn map_at(len: usize, at: usize) -> Option<*mut u8> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: NOREPLACE fails instead of replacing an existing mapping.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED && p as usize == at).then_some(p.cast())
}

fn unmap(p: *mut u8, len: usize) {
    // SAFETY: unmapping a mapping this test made.
    assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
}

#[test]
fn a_remapped_address_never_gets_the_old_registration() {
    let n = node();
    let cache = RegCache::new(n.pd.clone(), CacheConfig::default()).unwrap();
    if let Err(why) = cache.monitoring() {
        eprintln!("no memory monitor here ({why}): registrations are handed out uncached");
    }
    let len = 4 * PAGE;
    let p = map(len);
    // SAFETY: the mapping is live until unmapped below, after the handles are dropped.
    let first = unsafe { cache.get(p, len) }.unwrap();
    let old_keys = (first.lkey(), first.rkey());
    // SAFETY: as above.
    let again = unsafe { cache.get(p.wrapping_add(PAGE), PAGE) }.unwrap();
    if cache.monitoring().is_ok() {
        assert_eq!(
            (again.lkey(), again.rkey()),
            old_keys,
            "a covered sub-range is a hit"
        );
        assert_eq!(cache.stats().hits, 1);
    }
    drop((first, again));
    unmap(p, len);
    let Some(q) = map_at(len, p as usize) else {
        // Another test thread mapped something there first; the point cannot be made now,
        // and replacing its memory would corrupt it.
        eprintln!("the address was reused by another thread before the test could remap it");
        return;
    };
    // SAFETY: the new mapping is live until unmapped at the end.
    let fresh = unsafe { cache.get(q, len) }.unwrap();
    assert_ne!(
        (fresh.lkey(), fresh.rkey()),
        old_keys,
        "the stale registration was handed back"
    );
    // The new registration really is the new memory: write through it and read it back.
    fresh.write_at(0, b"new pages").unwrap();
    let mut seen = [0u8; 9];
    // SAFETY: reading our own live mapping.
    unsafe { std::ptr::copy_nonoverlapping(q, seen.as_mut_ptr(), 9) };
    assert_eq!(&seen, b"new pages");
    if cache.monitoring().is_ok() {
        assert!(cache.stats().invalidations >= 1, "{:?}", cache.stats());
    }
    drop(fresh);
    drop(cache);
    unmap(q, len);
    assert_eq!(n.ctx.live_regions(), 0, "nothing stays registered");
}

#[test]
fn least_recently_used_entries_are_evicted_under_the_caps() {
    let n = node();
    let cache = RegCache::new(
        n.pd.clone(),
        CacheConfig {
            max_entries: 2,
            ..CacheConfig::default()
        },
    )
    .unwrap();
    if cache.monitoring().is_err() {
        eprintln!("no memory monitor: nothing is cached, eviction cannot be shown");
        return;
    }
    let bufs: Vec<*mut u8> = (0..3).map(|_| map(PAGE)).collect();
    // SAFETY: each mapping is PAGE bytes and lives until the end of the test (unmapped
    // after every handle is dropped); the same holds for every `get` below.
    let a = unsafe { cache.get(bufs[0], PAGE) }.unwrap();
    // SAFETY: as above.
    let _b = unsafe { cache.get(bufs[1], PAGE) }.unwrap();
    // SAFETY: as above.
    let a2 = unsafe { cache.get(bufs[0], PAGE) }.unwrap(); // a is now the most recent
    assert_eq!(a.lkey(), a2.lkey());
    // SAFETY: as above.
    let _c = unsafe { cache.get(bufs[2], PAGE) }.unwrap(); // evicts b
    let s = cache.stats();
    assert_eq!(
        (s.live_entries, s.evictions, s.misses, s.hits),
        (2, 1, 3, 1),
        "{s:?}"
    );
    assert_eq!(s.bytes_pinned, 2 * PAGE as u64);
    // SAFETY: as above.
    let a3 = unsafe { cache.get(bufs[0], PAGE) }.unwrap();
    assert_eq!(a3.lkey(), a.lkey(), "a survived");
    // SAFETY: as above.
    let b2 = unsafe { cache.get(bufs[1], PAGE) }.unwrap();
    assert_ne!(b2.lkey(), _b.lkey(), "b was evicted and registered again");
    // Byte cap: one page fits.
    let small = RegCache::new(
        n.pd.clone(),
        CacheConfig {
            max_bytes: PAGE,
            ..CacheConfig::default()
        },
    )
    .unwrap();
    // SAFETY: as above.
    let _x = unsafe { small.get(bufs[0], PAGE) }.unwrap();
    // SAFETY: as above.
    let _y = unsafe { small.get(bufs[1], PAGE) }.unwrap();
    assert_eq!(
        (small.stats().live_entries, small.stats().evictions),
        (1, 1)
    );
    drop((a, a2, a3, b2, _b, _c, _x, _y, cache, small));
    for b in bufs {
        unmap(b, PAGE);
    }
    assert_eq!(n.ctx.live_regions(), 0);
}

#[test]
fn explicit_invalidation_and_bad_input() {
    let n = node();
    let cache = RegCache::new(n.pd.clone(), CacheConfig::default()).unwrap();
    let p = map(2 * PAGE);
    // SAFETY: the mapping lives until the end of the test.
    let a = unsafe { cache.get(p, 2 * PAGE) }.unwrap();
    cache.invalidate(p.wrapping_add(PAGE), 1);
    // SAFETY: as above.
    let b = unsafe { cache.get(p, PAGE) }.unwrap();
    assert_ne!(a.lkey(), b.lkey(), "an invalidated entry is not reused");
    a.write_at(0, b"still valid while held").unwrap();
    // SAFETY: a null range is refused before anything is touched.
    assert!(unsafe { cache.get(std::ptr::null(), 8) }.is_err());
    // SAFETY: an empty range is refused before anything is touched.
    assert!(unsafe { cache.get(p, 0) }.is_err());
    assert!(RegCache::new(
        n.pd.clone(),
        CacheConfig {
            max_entries: 0,
            ..CacheConfig::default()
        }
    )
    .is_err());
    drop((a, b, cache));
    unmap(p, 2 * PAGE);
    assert_eq!(n.ctx.live_regions(), 0);
}
