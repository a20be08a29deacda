//! Space: what writers that are gone left is reclaimed, and tombstones found clean twice a
//! hold apart are cleared.

use super::*;

#[test]
fn space_left_by_writers_that_are_gone_is_reclaimed_and_their_empty_chunks_given_back() {
    let lease = Duration::from_secs(1);
    let a = server(1, lease);
    let b = server(2, lease);
    let keys = 40;
    {
        let first = store(&[&a, &b], 7, 2);
        for i in 0..keys {
            let key = format!("k{i}");
            first
                .block_on(first.put(key.as_bytes(), &value(i, 3000)))
                .unwrap();
        }
        drop(first);
        // A second writer replaces every value, and goes away before its grace period
        // passed: the first writer's blocks stay allocated, named by no slot.
        let cfg = StoreConfig {
            grace: Duration::from_secs(60),
            ..StoreConfig::default()
        };
        let second = Store::new(pool(&[&a, &b], 8), cfg).unwrap();
        for i in 0..keys {
            let key = format!("k{i}");
            second
                .block_on(second.put(key.as_bytes(), &value(i + 100, 3000)))
                .unwrap();
        }
        assert_eq!(second.stats().retired, 2 * keys as u64);
    } // both clients go without a word; their leases run out
    wait_until("both writers' leases expire", || {
        a.stats().expired_clients + b.stats().expired_clients >= 4
    });
    let owned = || a.stats().chunks_owned + b.stats().chunks_owned;
    let before = owned();
    assert_eq!(
        before, 6,
        "on each server: the index, and a chunk of each writer"
    );
    // Unnamed too: each writer's spare block on each server, allocated for its next put
    // (docs/STORE.md section 6).
    let unnamed = 2 * keys + 2 * 2;
    let fixer = store(&[&a, &b], 9, 2);
    let first_look = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (first_look.reclaimed, first_look.reclaim_pending),
        (0, unnamed),
        "found, not freed yet: {first_look:?}"
    );
    assert_eq!(owned(), before);
    std::thread::sleep(Duration::from_millis(150)); // twice the grace period, and more
    let second_look = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (
            second_look.reclaimed,
            second_look.released,
            second_look.reclaim_pending
        ),
        (unnamed, 2, 0),
        "{second_look:?}"
    );
    assert_eq!(
        owned(),
        before - 2,
        "the first writer's chunks are the pool's again"
    );
    for i in 0..keys {
        let key = format!("k{i}");
        let got = fixer.block_on(fixer.get(key.as_bytes())).unwrap();
        assert_eq!(
            got,
            Some(value(i + 100, 3000)),
            "{key}: named blocks are kept"
        );
    }
    let again = fixer.block_on(fixer.repair()).unwrap();
    assert_eq!(
        (again.reclaimed, again.released, again.reclaim_pending),
        (0, 0, 0)
    );
}

#[test]
fn tombstones_found_clean_twice_a_hold_apart_are_cleared_and_free_their_slots() {
    let lease = Duration::from_secs(10);
    let a = server(1, lease);
    let b = server(2, lease);
    let cfg = StoreConfig {
        grace: Duration::from_millis(50),
        tombstone_hold: Duration::from_millis(100),
        ..StoreConfig::default()
    };
    let st = Store::new(pool(&[&a, &b], 1), cfg).unwrap();
    let keys = 30;
    for i in 0..keys {
        let key = format!("gone{i}");
        st.block_on(st.put(key.as_bytes(), b"soon removed"))
            .unwrap();
        assert!(st.block_on(st.remove(key.as_bytes())).unwrap());
    }
    st.block_on(st.put(b"kept", b"stays")).unwrap();
    let first = st.block_on(st.repair()).unwrap();
    assert_eq!(first.tombstones_cleared, 0, "noted, not cleared: {first:?}");
    std::thread::sleep(Duration::from_millis(150));
    let second = st.block_on(st.repair()).unwrap();
    assert_eq!(second.tombstones_cleared, 2 * keys, "{second:?}");
    let third = st.block_on(st.repair()).unwrap();
    assert_eq!(third.keys, 1, "only the kept key is left: {third:?}");
    for i in 0..keys {
        let key = format!("gone{i}");
        assert_eq!(st.block_on(st.locate(key.as_bytes())).unwrap(), [], "{key}");
        assert_eq!(st.block_on(st.get(key.as_bytes())).unwrap(), None);
    }
    // A key put again starts a new sequence; the kept key is untouched.
    assert_eq!(st.block_on(st.put(b"gone0", b"back")).unwrap().seq, 1);
    assert_eq!(st.block_on(st.get(b"kept")).unwrap().unwrap(), b"stays");
    assert_eq!(
        st.block_on(st.list(b"")).unwrap(),
        [b"gone0".to_vec(), b"kept".to_vec()]
    );
}

#[test]
fn puts_that_outrun_the_grace_period_wait_for_the_blocks_they_replaced() {
    // Three small servers (4 MiB, 1 MiB chunks) and 96 KiB values put again and again on
    // one key: every put replaces a version whose two blocks wait out a 3 s grace period,
    // so the replaced blocks fill the servers within about 15 puts (far less than 3 s on
    // any provider: on soft the 15th put fails without the wait). A put that finds no room
    // waits for them, frees them and succeeds: none fails, and the key reads back as the
    // last put wrote it.
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3)
        .map(|n| server_of(n, lease, 4 << 20, SocketAddr::new(listen_ip(), 0)).unwrap())
        .collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = Store::new(
        pool(&refs, 21),
        StoreConfig {
            replicas: 2,
            grace: Duration::from_secs(3),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    for i in 0..24 {
        let v = value(i, 96 << 10);
        st.block_on(st.put(b"hot", &v))
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let stats = st.stats();
    assert_eq!(stats.puts, 24);
    assert!(
        stats.waits_for_room > 0,
        "the servers never filled, so nothing was tested: {stats:?}"
    );
    assert_eq!(
        st.block_on(st.get(b"hot")).unwrap(),
        Some(value(23, 96 << 10))
    );
}

#[test]
fn a_put_frees_a_few_due_blocks_beside_itself_and_flush_retired_the_rest() {
    // 40 keys replaced once retire 80 blocks (r = 2); on a slow device some come due, and
    // are freed, while the later puts run or in the flush after them, so the count left is
    // read, not assumed. Once
    // the grace period has passed for all of them, one put starts freeing 32 of them beside
    // itself (all of them if fewer) and retires 2 of its own; flush_retired frees every one
    // due, and waits for those under way.
    let lease = Duration::from_secs(10);
    let (a, b) = (server(1, lease), server(2, lease));
    let st = store(&[&a, &b], 7, 2);
    let keys = 40;
    for round in 0..2 {
        for i in 0..keys {
            let key = format!("k{i}");
            st.block_on(st.put(key.as_bytes(), &value(i + round, 100)))
                .unwrap();
        }
    }
    // Frees started during the loop (on a slow device, where some came due) finish here,
    // with any other due by now, so none is under way when the put below starts its own.
    st.block_on(st.flush_retired());
    let waiting = st.stats().retired;
    assert!(waiting <= 2 * keys as u64, "{waiting} retired");
    std::thread::sleep(Duration::from_millis(120)); // past the 50 ms grace period
    let freed_before = st.stats().freed;
    st.block_on(st.put(b"k0", &value(7, 100))).unwrap();
    let left = waiting - waiting.min(32) + 2;
    assert_eq!(
        st.stats().retired,
        left,
        "one put started freeing min(32, {waiting}) due blocks beside itself and retired its 2"
    );
    std::thread::sleep(Duration::from_millis(120));
    // Those it started and did not wait for finish here, with every one due.
    st.block_on(st.flush_retired());
    assert_eq!(
        st.stats().freed - freed_before,
        waiting.min(32) + left,
        "every due block freed"
    );
    assert_eq!(st.stats().retired, 0);
    for i in 0..keys {
        let key = format!("k{i}");
        let want = if i == 0 {
            value(7, 100)
        } else {
            value(i + 1, 100)
        };
        assert_eq!(
            st.block_on(st.get(key.as_bytes())).unwrap(),
            Some(want),
            "{key}"
        );
    }
}
