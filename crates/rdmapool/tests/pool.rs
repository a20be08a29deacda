//! Pre-registered buffer pools: classes, real registrations, no registration on the
//! allocation path, exhaustion and growth, concurrency, bad input, no leaks.

mod common;
use common::*;
use rdmapool::buf::{BufferPool, PoolConfig, CLASSES};
use rdmapool::fabric::*;
use rdmapool::Error;
use std::collections::HashSet;
use std::time::Duration;

#[test]
fn pooled_buffers_are_registered_memory_usable_for_rdma() {
    let (a, b) = (node(), node());
    let (qa, _qb) = pair(&a, &b, &config(Transport::Auto));
    let pool = BufferPool::new(
        a.pd.clone(),
        PoolConfig {
            initial_chunks: CLASSES.len(),
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let target = b.pd.alloc_mr(4 << 20, AccessFlags::all_remote()).unwrap();
    for (i, &size) in CLASSES.iter().enumerate() {
        let buf = pool.alloc(size).unwrap();
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
}

#[test]
fn allocation_never_registers_and_buffers_come_back() {
    let n = node();
    let pool = BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            initial_chunks: 1,
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
    assert!(
        matches!(pool.alloc(200), Err(Error::QueueFull { .. })),
        "the class is exhausted"
    );
    let s = pool.stats();
    assert_eq!((s.in_use, s.empty), (8192, 1));
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
            initial_chunks: 0,
            max_chunks: 2,
            low_watermark: 1,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    // Nothing registered yet: the first alloc finds nothing and starts a chunk.
    assert!(matches!(pool.alloc(2 << 20), Err(Error::QueueFull { .. })));
    let first = pool.alloc_wait(2 << 20, WAIT).unwrap();
    let second = pool.alloc_wait(2 << 20, WAIT).unwrap();
    assert_ne!(first.addr(), second.addr());
    // At the chunk limit: waiting ends in a timeout, not a hang.
    assert!(matches!(
        pool.alloc_wait(2 << 20, Duration::from_millis(50)),
        Err(Error::TimedOut(_))
    ));
    assert_eq!(pool.stats().chunks, 2);
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
            initial_chunks: 2,
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
    assert!(matches!(pool.alloc(0), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        pool.alloc((2 << 20) + 1),
        Err(Error::InvalidArgument(_))
    ));
    let b = pool.alloc(100).unwrap();
    assert!(
        b.write_at(90, &[0; 11]).is_err(),
        "past the requested length"
    );
    assert!(b.sge(0, 101).is_err());
    assert!(BufferPool::new(
        n.pd.clone(),
        PoolConfig {
            initial_chunks: 3,
            max_chunks: 2,
            ..PoolConfig::default()
        }
    )
    .is_err());
}
