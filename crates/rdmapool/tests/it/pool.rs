//! Pre-registered buffer pools: classes, real registrations, no registration on the
//! allocation path, exhaustion and growth, concurrency, bad input, no leaks.

use crate::support::*;
use rdmapool::buf::{BufferPool, PoolConfig, CLASSES};
use rdmapool::fabric::*;
use rdmapool::CoreError;
use rdmapool::Error;
use std::collections::HashSet;
use std::time::Duration;

#[test]
fn pooled_buffers_are_registered_memory_usable_for_rdma() {
    let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
    let (qa, _qb) = pair(&a, &b, &config());
    let pool = BufferPool::new(
        a.pd.clone(),
        PoolConfig {
            low_watermark: 0,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let target = b.pd.alloc_mr(4 << 20, AccessFlags::all_remote()).unwrap();
    for (i, &size) in CLASSES.iter().enumerate() {
        // Every class has memory as soon as `new` returns.
        let buf = pool
            .alloc(size)
            .unwrap_or_else(|e| panic!("class {size}: {e}"));
        let data = pattern(size, i as u8);
        buf.write_at(0, &data).unwrap();
        qa.post_send(&[write_wr(
            i as u64,
            target.remote_at(0).unwrap(),
            &[buf.sge(0, size as u32).unwrap()],
        )])
        .unwrap();
        assert!(one(&a.cq).is_ok(), "class {size}");
        let mut seen = vec![0u8; size];
        target.read_at(0, &mut seen).unwrap();
        assert!(seen == data, "class {size}");
    }
    // The classes below 2 MiB share one chunk, the 2 MiB class has its own.
    let s = pool.stats();
    assert_eq!((s.chunks, s.growths), (2, 0), "{s:?}");
    assert_eq!(s.bytes_registered, 4 << 20, "{s:?}");
}

#[test]
fn the_shared_first_chunk_gives_every_class_its_part() {
    let n = node();
    let pool = BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            low_watermark: 0,
            max_chunks: 2, // no growth: an exhausted class stays exhausted
            ..PoolConfig::default()
        },
    )
    .unwrap();
    // Halves of the shared 2 MiB chunk, largest class first; the smallest class gets what is
    // left (as much as the 1 KiB class). The 2 MiB class has a chunk of its own.
    let parts = [
        32 << 10,
        32 << 10,
        64 << 10,
        128 << 10,
        256 << 10,
        512 << 10,
        1 << 20,
    ];
    let mut seen = HashSet::new();
    let mut held = Vec::new();
    for (i, &size) in CLASSES.iter().enumerate() {
        let slots = parts.get(i).map_or(1, |p| p / size);
        for _ in 0..slots {
            let b = pool
                .alloc(size)
                .unwrap_or_else(|e| panic!("class {size}: {e}"));
            assert!(
                seen.insert(b.addr()),
                "class {size}: a slot handed out twice"
            );
            b.write_at(size - 1, &[i as u8]).unwrap();
            held.push(b);
        }
        assert!(
            matches!(pool.alloc(size), Err(Error::PoolExhausted { .. })),
            "class {size} has more than {slots} slots"
        );
    }
    // No two buffers overlap: each still holds the byte written at its end.
    for b in &held {
        let mut last = [0u8];
        b.read_at(b.len() - 1, &mut last).unwrap();
        let class = CLASSES.iter().position(|&c| c == b.len()).unwrap();
        assert_eq!(last[0], class as u8, "{b:?} was overwritten");
    }
    assert_eq!(pool.stats().chunks, 2);
}

#[test]
fn a_first_allocation_does_not_grow_a_default_pool() {
    let n = node();
    let pool = BufferPool::new(n.pd.clone(), PoolConfig::default()).unwrap();
    // The classes up to 16 KiB hold 128 to 8 buffers of the shared chunk: a first
    // allocation takes a batch of half of them into the thread's cache, which leaves at
    // least the low watermark (4), so nothing more is registered.
    for &size in &CLASSES[..4] {
        drop(pool.alloc(size).unwrap());
    }
    let s = pool.stats();
    assert_eq!((s.chunks, s.growths), (2, 0), "{s:?}");
}

#[test]
fn pool_buffers_are_local_only_unless_asked() {
    let (a, b) = (node_on(Transport::Auto), node_on(Transport::Auto));
    let (_qa, qb) = pair(&a, &b, &config());
    let pool = BufferPool::new(a.pd.clone(), PoolConfig::default()).unwrap();
    let buf = pool.alloc(4096).unwrap();
    let neighbour = pool.alloc(4096).unwrap();
    neighbour.write_at(0, b"secret").unwrap();
    // A peer given this buffer's key cannot use it to reach a chunk neighbour (nor the
    // buffer itself: the chunk grants no remote access).
    let src = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    src.write_at(0, b"INTRUDER").unwrap();
    let next_door = RemoteAddr {
        addr: neighbour.addr(),
        rkey: buf.rkey(),
    };
    qb.post_send(&[write_wr(1, next_door, &[src.sge(0, 8).unwrap()])])
        .unwrap();
    assert_eq!(one(&b.cq).status, WcStatus::RemAccessErr);
    let mut got = [0u8; 6];
    neighbour.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"secret");
}

#[test]
fn allocation_never_registers_and_buffers_come_back() {
    let n = node();
    let pool = BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            largest: 256,
            low_watermark: 0,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let regions = n.ctx.live_regions();
    let mut live = Vec::new();
    let mut addrs = HashSet::new();
    // One 2 MiB chunk of 256-byte slots: 8192 buffers.
    for _ in 0..(2 << 20) / 256 {
        let b = pool.alloc(200).unwrap();
        assert!(addrs.insert(b.addr()), "a slot was handed out twice");
        live.push(b);
    }
    assert_eq!(
        n.ctx.live_regions(),
        regions,
        "allocation registered memory"
    );
    match pool.alloc(200) {
        Err(Error::PoolExhausted { class: 256, .. }) => {}
        other => panic!("the class is exhausted, yet: {other:?}"),
    }
    let s = pool.stats();
    assert_eq!((s.in_use, s.empty, s.growths), (8192, 1, 1), "{s:?}");
    drop(live);
    assert_eq!(pool.stats().in_use, 0);
    let again = pool.alloc(256).unwrap();
    assert!(addrs.contains(&again.addr()), "freed slots are reused");
}

#[test]
fn an_exhausted_class_grows_through_the_registrar() {
    let n = node();
    let pool = BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            chunks_per_class: 0,
            max_chunks: 2,
            low_watermark: 1,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    // Nothing registered yet: the first alloc finds nothing and starts a chunk.
    assert!(matches!(
        pool.alloc(2 << 20),
        Err(Error::PoolExhausted {
            class: 0x20_0000,
            max_chunks: 2,
            ..
        })
    ));
    let first = pool.alloc_wait(2 << 20, WAIT).unwrap();
    let second = pool.alloc_wait(2 << 20, WAIT).unwrap();
    assert_ne!(first.addr(), second.addr());
    // At the chunk limit: waiting ends in a timeout, not a hang.
    assert!(matches!(
        pool.alloc_wait(2 << 20, Duration::from_millis(50)),
        Err(Error::TimedOut(_))
    ));
    assert_eq!(pool.stats().chunks, 2);
    // `empty` counts allocations that found no slot, once each, not every retry of a
    // waiting one: at most one per call above, and at least the first and the last.
    let empty = pool.stats().empty;
    assert!((2..=4).contains(&empty), "empty = {empty} after 4 calls");
    drop((first, second, pool));
    assert_eq!(
        n.ctx.live_regions(),
        0,
        "the pool's chunks are deregistered with it"
    );
}

#[test]
fn many_threads_allocate_and_free_without_sharing_a_slot() {
    let n = node();
    let pool = BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            chunks_per_class: 2,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let seen = shared_set();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (pool, seen) = (pool.clone(), seen.clone());
            s.spawn(move || {
                for _ in 0..2000u32 {
                    let b = pool.alloc_wait(1000, WAIT).unwrap();
                    assert!(
                        seen.lock().unwrap().insert(b.addr()),
                        "slot shared between live buffers"
                    );
                    b.write_at(0, &[t; 8]).unwrap();
                    let mut back = [0u8; 8];
                    b.read_at(0, &mut back).unwrap();
                    assert_eq!(back, [t; 8], "another thread wrote into my buffer");
                    seen.lock().unwrap().remove(&b.addr());
                }
            });
        }
    });
    assert_eq!(pool.stats().in_use, 0);
}

fn shared_set() -> std::sync::Arc<std::sync::Mutex<HashSet<u64>>> {
    std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()))
}

#[test]
fn bad_requests_are_refused() {
    let n = node();
    let pool = BufferPool::new(n.pd.clone(), PoolConfig::default()).unwrap();
    assert!(matches!(
        pool.alloc(0),
        Err(Error::Core(CoreError::OutOfLimits {
            value: 0,
            min: 1,
            ..
        }))
    ));
    assert!(matches!(
        pool.alloc((2 << 20) + 1),
        Err(Error::Core(CoreError::OutOfLimits { min: 1, .. }))
    ));
    let b = pool.alloc(100).unwrap();
    assert!(
        b.write_at(90, &[0; 11]).is_err(),
        "past the requested length"
    );
    assert!(b.sge(0, 101).is_err());
    let small = BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            largest: 4096,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    assert_eq!(
        small.stats().chunks,
        1,
        "256 B, 1 KiB and 4 KiB classes share one chunk"
    );
    assert!(matches!(
        small.alloc(4097),
        Err(Error::Core(CoreError::OutOfLimits { value: 4097, .. }))
    ));
    assert!(BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            chunks_per_class: 1,
            max_chunks: 1,
            ..PoolConfig::default()
        }
    )
    .is_err());
}
