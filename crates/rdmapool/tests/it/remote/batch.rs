//! Pool batches: many small operations per server in one list (one doorbell, one
//! completion), checked per operation, in RC order, across servers, and against a server
//! that dies.

use super::*;

/// The outcome's atomic value, or a panic saying which operation failed how.
fn old(o: &BatchOutcome<Mr<Shared>>, what: &str) -> u64 {
    match &o.result {
        Ok(Some(v)) => *v,
        other => panic!("{what}: {other:?}"),
    }
}

#[test]
fn a_batch_across_three_servers_matches_single_operations_and_runs_in_order() {
    let servers: Vec<MemoryServer> = (1..=3).map(|n| server(n, Duration::from_secs(2))).collect();
    let refs: Vec<&MemoryServer> = servers.iter().collect();
    let c = client(&refs, 11).unwrap();
    let buf = local(&c, 64 * 64);
    // 24 objects of 64 bytes, round-robin over the three servers.
    let objs: Vec<RemotePtr> = (0..24)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .collect();
    assert_eq!(objs.iter().map(|p| p.node).collect::<HashSet<_>>().len(), 3);
    for (i, p) in objs.iter().enumerate() {
        buf.write_at(i * 64, &[i as u8 + 1; 64]).unwrap();
        let _ = p;
    }
    // Per object: WRITE 64 bytes, FAA word 0 by i, CAS word 1 (expecting the written
    // pattern), READ it back, all in one batch: RC order on each server means the READ sees
    // the WRITE and both atomics.
    let mut batch = c.batch::<Mr<Shared>>();
    for (i, p) in objs.iter().enumerate() {
        let pattern = u64::from_le_bytes([i as u8 + 1; 8]);
        batch
            .write(*p, 0, Mr::share_range(&buf, i * 64, 64).unwrap(), 0, 64)
            .fetch_and_add(*p, 0, i as u64)
            .compare_and_swap(*p, 8, pattern, 0xfeed_0000 + i as u64)
            .read(
                *p,
                0,
                Mr::share_range(&buf, 24 * 64 + i * 64, 64).unwrap(),
                0,
                64,
            );
    }
    assert_eq!(batch.len(), 24 * 4);
    let out = c.block_on(batch.run());
    assert_eq!(out.len(), 24 * 4);
    for (i, chunk) in out.chunks(4).enumerate() {
        let pattern = u64::from_le_bytes([i as u8 + 1; 8]);
        assert!(
            matches!(chunk[0].result, Ok(None)),
            "write {i}: {:?}",
            chunk[0].result
        );
        assert!(chunk[0].buffer.is_some() && chunk[3].buffer.is_some());
        assert!(chunk[1].buffer.is_none() && chunk[2].buffer.is_none());
        assert_eq!(old(&chunk[1], "faa"), pattern, "FAA {i} saw the WRITE");
        assert_eq!(old(&chunk[2], "cas"), pattern, "CAS {i} saw the WRITE");
        assert!(matches!(chunk[3].result, Ok(None)));
        let mut got = [0u8; 64];
        buf.read_at(24 * 64 + i * 64, &mut got).unwrap();
        assert_eq!(
            u64::from_le_bytes(got[0..8].try_into().unwrap()),
            pattern + i as u64
        );
        assert_eq!(
            u64::from_le_bytes(got[8..16].try_into().unwrap()),
            0xfeed_0000 + i as u64
        );
        assert_eq!(&got[16..], &[i as u8 + 1; 48][..], "READ {i} saw the WRITE");
    }
    // The same state through single operations.
    for (i, p) in objs.iter().enumerate() {
        let pattern = u64::from_le_bytes([i as u8 + 1; 8]);
        assert_eq!(
            c.block_on(c.fetch_and_add(*p, 0, 0)).unwrap(),
            pattern + i as u64
        );
    }
    // More operations than a send queue holds: split into lists, still all done, in order.
    let counter = objs[0];
    let before = c.block_on(c.fetch_and_add(counter, 16, 0)).unwrap();
    let mut big = c.batch::<Mr<Shared>>();
    for _ in 0..1000 {
        big.fetch_and_add(counter, 16, 1);
    }
    let out = c.block_on(big.run());
    for (k, o) in out.iter().enumerate() {
        assert_eq!(
            old(o, "faa"),
            before + k as u64,
            "the 1000 FAAs ran in order"
        );
    }
    assert_eq!(
        c.block_on(c.fetch_and_add(counter, 16, 0)).unwrap(),
        before + 1000
    );
}

#[test]
fn a_batch_on_one_server_costs_one_completion_not_one_per_operation() {
    let s = server(1, Duration::from_secs(2));
    let c = client(&[&s], 12).unwrap();
    let p = c.block_on(c.alloc(64, None)).unwrap();
    let singles = c.engine_stats().completions;
    for _ in 0..64 {
        c.block_on(c.fetch_and_add(p, 0, 1)).unwrap();
    }
    let per_single = c.engine_stats().completions - singles;
    assert!(
        per_single >= 64,
        "each single FAA is its own completion: {per_single}"
    );
    let start = c.engine_stats().completions;
    let mut batch = c.batch::<Mr<Shared>>();
    for _ in 0..64 {
        batch.fetch_and_add(p, 0, 1);
    }
    let out = c.block_on(batch.run());
    assert!(out.iter().all(|o| matches!(o.result, Ok(Some(_)))));
    // One list of 64 (the pool's QPs hold more): one completion, plus at most a few lease
    // renewals that the client's own thread ran meanwhile.
    let batched = c.engine_stats().completions - start;
    assert!(
        batched < 8,
        "64 FAAs in one batch took {batched} completions"
    );
    assert_eq!(c.block_on(c.fetch_and_add(p, 0, 0)).unwrap(), 128);
}

#[test]
fn a_batch_longer_than_the_send_queue_runs_as_lists_in_order() {
    // 600 FAAs on one word of one server: lists of the send queue's depth (256 by default)
    // on one QP, posted in order, so each FAA's old value is its place in the batch.
    let s = server(1, Duration::from_secs(2));
    let c = client(&[&s], 13).unwrap();
    let p = c.block_on(c.alloc(64, None)).unwrap();
    let start = c.engine_stats().completions;
    let mut batch = c.batch::<Mr<Shared>>();
    for _ in 0..600 {
        batch.fetch_and_add(p, 0, 1);
    }
    let out = c.block_on(batch.run());
    let olds: Vec<u64> = out
        .iter()
        .map(|o| match o.result {
            Ok(Some(old)) => old,
            ref other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(olds, (0..600).collect::<Vec<u64>>());
    let lists = c.engine_stats().completions - start;
    assert!(
        (3..8).contains(&lists),
        "600 FAAs in lists of 256 took {lists} completions"
    );
    assert_eq!(c.block_on(c.fetch_and_add(p, 0, 0)).unwrap(), 600);
}

#[test]
fn bad_operations_in_a_batch_get_their_own_typed_errors_and_the_others_run() {
    let s = server(1, Duration::from_secs(2));
    let c = client(&[&s], 13).unwrap();
    let buf = local(&c, 4096);
    let p = c.block_on(c.alloc(64, None)).unwrap();
    let stale = RemotePtr {
        incarnation: p.incarnation ^ 1,
        ..p
    };
    let misaligned = RemotePtr {
        offset: p.offset + 1,
        ..p
    };
    let unknown = RemotePtr { node: 77, ..p };
    let mut batch = c.batch::<Mr<Shared>>();
    batch
        .fetch_and_add(p, 0, 5)
        .write(p, 60, Mr::share(&buf), 0, 8) // past the object's 64 bytes
        .fetch_and_add(stale, 0, 1)
        .read(misaligned, 0, Mr::share(&buf), 0, 8)
        .fetch_and_add(unknown, 0, 1)
        .write(p, 0, Mr::share(&buf), 4090, 8) // past the local buffer
        .fetch_and_add(p, 0, 5);
    let out = c.block_on(batch.run());
    assert_eq!(old(&out[0], "first faa"), 0);
    assert!(
        matches!(
            out[1].result,
            Err(Error::OutOfBounds {
                offset: 60,
                len: 8,
                limit: 64
            })
        ),
        "{:?}",
        out[1].result
    );
    assert!(
        out[1].buffer.is_some(),
        "a refused WRITE gives its buffer back"
    );
    assert!(
        matches!(out[2].result, Err(Error::StalePointer { .. })),
        "{:?}",
        out[2].result
    );
    assert!(
        matches!(out[3].result, Err(Error::NotAllocated(_))),
        "{:?}",
        out[3].result
    );
    assert!(out[3].buffer.is_some());
    assert!(
        matches!(out[4].result, Err(Error::NodeDown { node: 77, .. })),
        "{:?}",
        out[4].result
    );
    assert!(
        matches!(
            out[5].result,
            Err(Error::Core(CoreError::OutOfRange {
                offset: 4090,
                len: 8,
                limit: 4096,
                ..
            }))
        ),
        "a local range past its buffer: {:?}",
        out[5].result
    );
    assert!(out[5].buffer.is_some());
    assert_eq!(
        old(&out[6], "last faa"),
        5,
        "the bad ones between did not stop it"
    );
    assert_eq!(c.block_on(c.fetch_and_add(p, 0, 0)).unwrap(), 10);
    // An empty batch is no operation at all.
    assert!(c.block_on(c.batch::<Mr<Shared>>().run()).is_empty());
}

#[test]
fn a_batch_with_operations_on_a_dead_server_fails_those_and_completes_the_rest() {
    let a = server(1, Duration::from_secs(2));
    let b = server(2, Duration::from_secs(2));
    let c = client(&[&a, &b], 14).unwrap();
    let ptrs: Vec<RemotePtr> = (0..4)
        .map(|_| c.block_on(c.alloc(64, None)).unwrap())
        .collect();
    let on_a = *ptrs.iter().find(|p| p.node == 1).unwrap();
    let on_b = *ptrs.iter().find(|p| p.node == 2).unwrap();
    drop(a);
    // Until the client has seen node 1 die, its operations there may still reach memory it
    // mapped (a stopped server serves what it exported, as a NIC would); once seen, every
    // batch fails them with NodeDown and never touches node 2's results.
    let mut seen_down = false;
    let until = Instant::now() + Duration::from_secs(30);
    let mut expect_b = c.block_on(c.fetch_and_add(on_b, 0, 0)).unwrap();
    while !seen_down {
        assert!(Instant::now() < until, "node 1 never reported down");
        let mut batch = c.batch::<Mr<Shared>>();
        batch
            .fetch_and_add(on_b, 0, 1)
            .fetch_and_add(on_a, 0, 1)
            .fetch_and_add(on_b, 0, 1);
        let out = c.block_on(batch.run());
        assert_eq!(old(&out[0], "b first"), expect_b);
        assert_eq!(old(&out[2], "b second"), expect_b + 1);
        expect_b += 2;
        match &out[1].result {
            Err(Error::NodeDown { node: 1, .. }) => seen_down = true,
            Ok(Some(_)) => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("node 1's operation: {other:?}"),
        }
    }
}
