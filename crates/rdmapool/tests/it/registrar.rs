//! The asynchronous registrar: futures on tokio, blocking waits, callbacks, cancellation in
//! every state, no leaks, fast failure on bad input.

use crate::support::*;
use rdmapool::fabric::AccessFlags;
use rdmapool::fabric::RegisteredMemory;
use rdmapool::mr::{RegState, Registrar, RegistrarConfig};
use rdmapool::CoreError;
use rdmapool::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const ALL: AccessFlags = AccessFlags::all_remote();

fn registrar(workers: usize) -> (Node, Registrar) {
    let n = node();
    let r = Registrar::new(
        n.pd.clone(),
        RegistrarConfig {
            workers,
            ..RegistrarConfig::default()
        },
    )
    .unwrap();
    (n, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_registrations_complete_as_futures_on_tokio() {
    let (n, reg) = registrar(2);
    let handles: Vec<_> = (0..32).map(|i| reg.submit(4096 * (i + 1), ALL)).collect();
    let mut mrs = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        let mr = h.await.unwrap();
        assert_eq!(mr.len(), 4096 * (i + 1));
        mr.write_at(0, b"usable").unwrap();
        mrs.push(mr);
    }
    assert_eq!(n.ctx.live_regions(), 32);
    let s = reg.stats();
    assert_eq!(
        (s.submitted, s.completed, s.failed, s.cancelled),
        (32, 32, 0, 0)
    );
    drop(mrs);
    assert_eq!(n.ctx.live_regions(), 0);
}

#[test]
fn callbacks_see_the_outcome_and_the_handle_still_delivers_it() {
    let (_n, reg) = registrar(1);
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let h = reg.submit_with(8192, ALL, move |r| {
        if let Ok(mr) = r {
            s2.store(mr.len(), Ordering::SeqCst);
        }
    });
    let mr = h.wait().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 8192);
    assert_eq!(mr.len(), 8192);
    assert_eq!(h.state(), RegState::Completed);
    assert!(!h.cancel(), "cancel after completion is refused");
    assert!(
        matches!(h.wait(), Err(Error::OutcomeTaken)),
        "the outcome is handed out once"
    );
}

#[test]
fn bad_requests_fail_fast_without_retries() {
    let (n, reg) = registrar(1);
    let zero = reg.submit(0, ALL);
    assert!(matches!(
        zero.wait(),
        Err(Error::Core(CoreError::OutOfLimits { value: 0, .. }))
    ));
    assert_eq!(zero.state(), RegState::Failed);
    let no_local_write = reg.submit(4096, AccessFlags::REMOTE_WRITE);
    assert!(matches!(
        no_local_write.wait(),
        Err(Error::Core(CoreError::BadAccess { .. }))
    ));
    // SAFETY: a null address is refused before anything touches it.
    let null = unsafe { reg.submit_raw(std::ptr::null_mut(), 64, ALL) };
    assert!(matches!(
        null.wait(),
        Err(Error::Core(CoreError::NullAddress { .. }))
    ));
    let s = reg.stats();
    assert_eq!((s.failed, s.retries), (3, 0));
    assert_eq!(n.ctx.live_regions(), 0);
}

#[test]
fn cancellation_in_every_state_never_leaks() {
    let (n, reg) = registrar(1);
    // Queued behind a large registration: cancelled while Posted, never registered.
    let big = reg.submit(64 << 20, ALL);
    let queued: Vec<_> = (0..20).map(|_| reg.submit(1 << 20, ALL)).collect();
    let mut cancelled = 0;
    for h in &queued {
        if h.cancel() {
            cancelled += 1;
            assert_eq!(h.state(), RegState::Cancelled);
            assert!(matches!(h.wait(), Err(Error::Cancelled)));
        }
    }
    assert!(cancelled > 0, "nothing was still queued to cancel");
    drop(big.wait().unwrap());
    // Cancel racing completion, and handles dropped while in flight.
    for i in 0..200 {
        let h = reg.submit(4096, ALL);
        if i % 2 == 0 {
            let _ = h.cancel();
        }
        drop(h);
    }
    // Let the worker drain, then nothing may stay registered.
    let last = reg.submit(4096, ALL);
    drop(last.wait().unwrap());
    let until = std::time::Instant::now() + WAIT;
    while n.ctx.live_regions() != 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        n.ctx.live_regions(),
        0,
        "a cancelled or dropped registration leaked"
    );
    let s = reg.stats();
    assert_eq!(s.submitted, s.completed + s.failed + s.cancelled, "{s:?}");
}

#[test]
fn dropping_the_registrar_cancels_what_is_still_queued() {
    let (n, reg) = registrar(1);
    let first = reg.submit(32 << 20, ALL);
    let rest: Vec<_> = (0..10).map(|_| reg.submit(1 << 20, ALL)).collect();
    drop(reg);
    let mut outcomes = vec![first.wait().map(drop)];
    outcomes.extend(rest.iter().map(|h| h.wait().map(drop)));
    for (i, o) in outcomes.iter().enumerate() {
        assert!(
            o.is_ok() || matches!(o, Err(Error::Cancelled)),
            "request {i}: {o:?}"
        );
        let st = if i == 0 {
            first.state()
        } else {
            rest[i - 1].state()
        };
        assert!(st.is_final(), "request {i} left in {st:?}");
    }
    assert_eq!(n.ctx.live_regions(), 0);
}

#[test]
fn huge_page_regions_are_aligned_report_their_backing_and_register() {
    use rdmapool::mr::{HugeBacking, HugeOptions, HugeRegion, HUGE_PAGE};
    for bad in [0, 4096, HUGE_PAGE + 1] {
        assert!(
            matches!(
                HugeRegion::alloc(bad, HugeOptions::default()),
                Err(Error::Core(CoreError::BadSetting { .. }))
            ),
            "{bad}"
        );
    }
    let region = HugeRegion::alloc(
        4 * HUGE_PAGE,
        HugeOptions {
            try_hugetlb: true,
            pretouch_threads: 2,
        },
    )
    .unwrap();
    assert_eq!(region.as_ptr() as usize % HUGE_PAGE, 0, "2 MiB aligned");
    let reserved: usize = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if reserved < 4 {
        assert_eq!(
            region.backing(),
            HugeBacking::Thp,
            "no reserved pages: THP fallback"
        );
    }
    let (n, reg) = registrar(1);
    // SAFETY: `region` outlives the registration (dropped at the end of this test, after mr).
    let mr = unsafe { reg.submit_raw(region.as_ptr(), region.len(), ALL) }
        .wait()
        .unwrap();
    assert_eq!(mr.addr() as usize, region.as_ptr() as usize);
    mr.write_at(HUGE_PAGE * 3, b"huge").unwrap();
    drop(mr);
    assert_eq!(n.ctx.live_regions(), 0);
    eprintln!(
        "backing {:?}, THP bytes {}",
        region.backing(),
        region.thp_bytes()
    );
}

/// The context's metrics see exactly what the registrar, cache and pool built on it did, as
/// their own statistics say, in the snapshot and in the Prometheus text.
#[test]
fn the_context_metrics_agree_with_the_registrar_cache_and_pool() {
    use rdmapool::buf::{BufferPool, PoolConfig};
    use rdmapool::mr::{CacheConfig, RegCache};
    let (n, reg) = registrar(1);
    for len in [4096, 1 << 20] {
        drop(reg.submit(len, ALL).wait().unwrap());
    }
    let cache = RegCache::new(n.pd.clone(), CacheConfig::default()).unwrap();
    let buf = vec![0u8; 8192];
    // SAFETY: `buf` outlives the handles.
    let (_h1, _h2) = unsafe {
        (
            cache.get(buf.as_ptr(), 4096).unwrap(),
            cache.get(buf.as_ptr(), 100).unwrap(),
        )
    };
    let pool = BufferPool::new(n.pd.clone(), PoolConfig::default()).unwrap();
    let _b = pool.alloc(256).unwrap();
    let (r, c, p) = (reg.stats(), cache.stats(), pool.stats());
    let s = n.ctx.metrics().snapshot();
    assert_eq!(r.completed, 2);
    assert_eq!((s.cache_hits, s.cache_misses), (c.hits, c.misses));
    assert_eq!((s.pool_allocations, s.pool_in_use), (1, 1));
    assert_eq!(s.pool_chunks, p.chunks);
    // Every registration on the context: the registrar's two, one per cache miss (a miss
    // registers whether or not its range can be watched: `uncached` counts the misses that
    // could not, as under valgrind, where userfaultfd is not available), and the pool's
    // chunks.
    assert!(c.uncached <= c.misses, "{c:?}");
    assert_eq!(s.registrations, 2 + c.misses + p.chunks, "{s:?}");
    let text = s.to_prometheus();
    for needle in [
        format!("rdmapool_registrations_total {}\n", s.registrations),
        "rdmapool_pool_allocations_total 1\n".to_string(),
        format!("rdmapool_cache_hits_total {}\n", c.hits),
    ] {
        assert!(text.contains(&needle), "missing {needle:?} in\n{text}");
    }
    if cache.monitoring().is_ok() {
        assert_eq!((c.hits, c.misses), (1, 1));
    }
}

#[test]
fn a_large_region_registers_in_chunks_and_no_object_straddles_two() {
    use rdmapool::mr::{HugeOptions, HugeRegion, HUGE_PAGE};
    let (n, reg) = registrar(2);
    let region = HugeRegion::alloc(8 * HUGE_PAGE, HugeOptions::default()).unwrap();
    let max_mr = n.ctx.device().max_mr_size;
    // SAFETY: `region` outlives `chunked`, dropped first below.
    let chunked =
        unsafe { reg.register_chunked(region.as_ptr(), region.len(), 3 * HUGE_PAGE, max_mr) }
            .unwrap();
    assert_eq!(chunked.len(), 3, "8 huge pages in chunks of 3");
    assert_eq!(chunked[2].len(), 2 * HUGE_PAGE);
    let inside =
        rdmapool::mr::region_for(&chunked, region.as_ptr().wrapping_add(HUGE_PAGE), 4096).unwrap();
    assert_eq!(inside.addr(), region.as_ptr() as u64);
    let across = region.as_ptr().wrapping_add(3 * HUGE_PAGE - 8);
    assert!(
        rdmapool::mr::region_for(&chunked, across, 16).is_err(),
        "a range across two registrations is refused"
    );
    assert!(
        rdmapool::mr::region_for(&chunked, region.as_ptr().wrapping_add(8 * HUGE_PAGE), 1).is_err()
    );
    // A device limit smaller than the chunk wins.
    // SAFETY: as above.
    let capped = unsafe {
        reg.register_chunked(
            region.as_ptr(),
            region.len(),
            8 * HUGE_PAGE,
            2 * HUGE_PAGE as u64,
        )
    }
    .unwrap();
    assert_eq!(capped.len(), 4);
    drop((chunked, capped));
    assert_eq!(n.ctx.live_regions(), 0);
}

#[test]
fn batched_ranges_coalesce_and_each_caller_keeps_its_own_range() {
    let (n, reg) = registrar(2);
    let a = vec![0u8; 64 << 10];
    let b = vec![0u8; 8 << 10];
    // Three slices of `a` (adjacent and overlapping) and one of `b`: two registrations.
    let ranges = [
        (a.as_ptr(), 4096),
        (b.as_ptr(), 100),
        (a[4096..].as_ptr(), 8192),
        (a[6000..].as_ptr(), 1000),
    ];
    // SAFETY: `a` and `b` outlive the handles, dropped before them.
    let got = unsafe { reg.register_batch(&ranges, ALL) }.unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(
        got[0].lkey(),
        got[2].lkey(),
        "adjacent ranges share one registration"
    );
    assert_eq!(
        got[0].lkey(),
        got[3].lkey(),
        "overlapping ranges share one registration"
    );
    assert_ne!(got[0].lkey(), got[1].lkey());
    assert_eq!(reg.stats().completed, 2, "four ranges, two registrations");
    assert_eq!(
        (got[2].addr(), got[2].len()),
        (a[4096..].as_ptr() as u64, 8192)
    );
    assert!(got[1].sge(0, 100).is_ok());
    assert!(
        got[1].sge(0, 101).is_err(),
        "a caller cannot reach past its own range"
    );
    // SAFETY: a null range is refused before anything is registered.
    assert!(unsafe { reg.register_batch(&[(std::ptr::null(), 8)], ALL) }.is_err());
    drop(got);
    assert_eq!(n.ctx.live_regions(), 0);
}

#[test]
fn a_pre_registration_ring_has_buffers_ready_before_they_are_needed() {
    use rdmapool::mr::PreRegRing;
    let (n, reg) = registrar(2);
    let mut ring = PreRegRing::new(&reg, 4, 1 << 20, ALL).unwrap();
    let until = std::time::Instant::now() + WAIT;
    while ring.ready() < 4 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(ring.ready(), 4, "registered ahead of use");
    let taken: Vec<_> = (0..10).map(|_| ring.take().unwrap()).collect();
    assert!(taken.iter().all(|m| m.len() == 1 << 20));
    assert_eq!(
        reg.stats().submitted,
        14,
        "every take submits a replacement"
    );
    assert!(PreRegRing::new(&reg, 0, 4096, ALL).is_err());
    drop((taken, ring));
    drop(reg);
    assert_eq!(
        n.ctx.live_regions(),
        0,
        "replacements still in the ring are cancelled or dropped"
    );
}

#[test]
fn a_registrar_dropped_at_once_never_hangs() {
    // Its workers check the shutdown flag and then wait for work; a flag set between the
    // two, outside the queue's lock, woke nobody and the drop's join hung forever (seen at
    // the exit of `rdma-tool monitor` in a CI run). Many short lives give that window a
    // chance; the bound only catches a hang.
    let n = node();
    let (done, finished) = std::sync::mpsc::channel();
    let pd = n.pd.clone();
    std::thread::spawn(move || {
        for _ in 0..300 {
            let r = Registrar::new(
                pd.clone(),
                RegistrarConfig {
                    workers: 4,
                    ..RegistrarConfig::default()
                },
            )
            .unwrap();
            drop(r);
        }
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("dropping a registrar hung");
}
