//! Round trips per store operation, counted by `StoreStats` (issue #43, docs/STORE.md
//! sections 5 and 6), whatever `r`: a put takes 1 from a current hint (the client's own
//! put or get of the key, lately), 2 for a fresh key or with an older hint, and one more
//! when it must read the key's block first; a get takes 1 with a current hint and 2
//! without. Counts, not times.

use super::*;

/// Store client `id` with `r` replicas on `servers`, with a grace period long enough that a
/// hint stays current however slow the machine (a hint is current for a quarter of it).
fn client(servers: &[&MemoryServer], id: u64, r: usize) -> Store {
    let cfg = StoreConfig {
        replicas: r,
        grace: Duration::from_secs(600),
        ..StoreConfig::default()
    };
    Store::new(pool(servers, id), cfg).expect("store")
}

/// The round trips `op` took on `st`: (puts, gets).
fn trips(st: &Store, op: impl FnOnce(&Store)) -> (u64, u64) {
    let before = st.stats();
    op(st);
    let after = st.stats();
    (
        after.put_round_trips - before.put_round_trips,
        after.get_round_trips - before.get_round_trips,
    )
}

#[test]
fn puts_and_gets_take_the_round_trips_the_store_promises() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let store = |id, r| client(&refs, id, r);
    let st = store(1, 2);
    let put = |k: &'static [u8], v: &'static [u8]| {
        move |st: &Store| {
            st.block_on(st.put(k, v)).unwrap();
        }
    };
    let get = |k: &'static [u8], want: &'static [u8]| {
        move |st: &Store| assert_eq!(st.block_on(st.get(k)).unwrap().as_deref(), Some(want))
    };
    // r = 2: lookup and allocation (and a spare block on each replica for the next put);
    // the blocks written and every replica swapped at once. The fence words are read
    // beside the swaps.
    assert_eq!(trips(&st, put(b"k", b"first")), (2, 0), "a fresh key");
    assert_eq!(
        trips(&st, put(b"k", b"second")),
        (1, 0),
        "with a current hint: write, swap and fence read on each replica in one list"
    );
    assert_eq!(
        trips(&st, get(b"k", b"second")),
        (0, 1),
        "a get with a current hint"
    );
    // Another client knows nothing of the key: its lookup reads the block in a round of
    // its own.
    let other = store(2, 2);
    assert_eq!(
        trips(&other, get(b"k", b"second")),
        (0, 2),
        "a get without a hint"
    );
    let fresh = store(3, 2);
    assert_eq!(
        trips(&fresh, put(b"k", b"third")),
        (3, 0),
        "a put without a hint"
    );
    // Its put left it a current hint and spares; the first client's hint is stale now
    // (another put came between): the stale hint costs its READ and nothing more.
    assert_eq!(trips(&fresh, put(b"k", b"fourth")), (1, 0));
    assert_eq!(trips(&st, get(b"k", b"fourth")), (0, 2), "a stale hint");
    assert_eq!(trips(&fresh, put(b"k", b"fifth")), (1, 0));
    // The first client's get left it a current hint and it has spares, but the other
    // client's put came between: its swaps are lost, a lookup reads the blocks they found,
    // then it publishes.
    assert_eq!(
        trips(&st, put(b"k", b"sixth")),
        (3, 0),
        "a stale current hint"
    );
    assert_eq!(trips(&st, get(b"k", b"sixth")), (0, 1));
    // r = 1 and r = 3: the same counts.
    for (id, r) in [(4, 1), (5, 3)] {
        let other = store(id, r);
        let key: &'static [u8] = if r == 1 { b"solo" } else { b"trio" };
        assert_eq!(
            trips(&other, put(key, b"one")),
            (2, 0),
            "a fresh key, r = {r}"
        );
        assert_eq!(
            trips(&other, put(key, b"two")),
            (1, 0),
            "a current hint, r = {r}"
        );
        assert_eq!(trips(&other, get(key, b"two")), (0, 1), "r = {r}");
    }
    // Removes are puts of tombstones: they read the key first (a remove of nothing writes
    // nothing), beside the buckets where the hint is.
    assert_eq!(
        trips(&st, |st| assert!(st.block_on(st.remove(b"k")).unwrap())),
        (2, 0),
        "a remove with a current hint"
    );
    assert_eq!(
        trips(&st, get_none(b"k")),
        (0, 1),
        "the tombstone, by its hint"
    );
}

/// The zero-copy get (`get_into`) takes 1 round with a current hint, as `get`; without
/// one, 3 (buckets, candidates' headers, the value into the buffer), which leave it a
/// hint. A stale hint, or a key removed meanwhile, costs its round and then reads right.
#[test]
fn a_get_into_memory_takes_one_round_from_a_hint() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let store = |id| client(&refs, id, 2);
    let (writer, reader) = (store(1), store(2));
    let buffer = |st: &Store| {
        let mr = st
            .pool()
            .pd()
            .alloc_mr(4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        rdmapool::fabric::Mr::share(&Arc::new(mr))
    };
    let (wout, rout) = (buffer(&writer), buffer(&reader));
    let into = |out: &rdmapool::fabric::Mr<rdmapool::fabric::Shared>,
                want: Option<&'static [u8]>| {
        let out = out.clone();
        move |st: &Store| {
            let n = st.block_on(st.get_into(b"page", &out)).unwrap();
            assert_eq!(n, want.map(<[u8]>::len));
            if let Some(want) = want {
                let mut got = vec![0u8; want.len()];
                out.read_at(0, &mut got).unwrap();
                assert_eq!(got, want);
            }
        }
    };
    writer
        .block_on(writer.put(b"page", b"kv page one"))
        .unwrap();
    assert_eq!(
        trips(&writer, into(&wout, Some(b"kv page one"))),
        (0, 1),
        "its own put's hint"
    );
    assert_eq!(
        trips(&reader, into(&rout, Some(b"kv page one"))),
        (0, 3),
        "no hint"
    );
    assert_eq!(
        trips(&reader, into(&rout, Some(b"kv page one"))),
        (0, 1),
        "the hint it found"
    );
    writer
        .block_on(writer.put(b"page", b"kv page two, longer"))
        .unwrap();
    assert_eq!(
        trips(&reader, into(&rout, Some(b"kv page two, longer"))),
        (0, 4),
        "a stale hint: its round, then the lookup"
    );
    assert!(writer.block_on(writer.remove(b"page")).unwrap());
    let (_, rounds) = trips(&reader, into(&rout, None));
    assert!(
        rounds >= 2,
        "a removed key: the hint's round, then the lookup ({rounds})"
    );
}

/// `get_into_many`: every key with a hint in one round for all of them; a key another
/// client changed meanwhile is looked up after, and every answer is the current value.
#[test]
fn gets_of_many_keys_into_memory_take_one_round_together() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let store = |id| client(&refs, id, 2);
    let (writer, other) = (store(1), store(2));
    let keys: Vec<Vec<u8>> = (0..16).map(|i| format!("page:{i}").into_bytes()).collect();
    let value = |i: usize, round: u8| vec![round; 100 + i * 10];
    for (i, k) in keys.iter().enumerate() {
        writer.block_on(writer.put(k, &value(i, 1))).unwrap();
    }
    let mr = Arc::new(
        writer
            .pool()
            .pd()
            .alloc_mr(16 * 4096, AccessFlags::LOCAL_WRITE)
            .unwrap(),
    );
    let outs: Vec<rdmapool::fabric::Mr<rdmapool::fabric::Shared>> = (0..16)
        .map(|i| rdmapool::fabric::Mr::share_range(&mr, i * 4096, 4096).unwrap())
        .collect();
    let out_refs: Vec<&rdmapool::fabric::Mr<rdmapool::fabric::Shared>> = outs.iter().collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let check = |st: &Store, want: &dyn Fn(usize) -> Option<Vec<u8>>| {
        let got = st.block_on(st.get_into_many(&key_refs, &out_refs));
        for (i, g) in got.into_iter().enumerate() {
            let want = want(i);
            assert_eq!(g.unwrap(), want.as_ref().map(Vec::len), "key {i}");
            if let Some(want) = want {
                let mut bytes = vec![0u8; want.len()];
                outs[i].read_at(0, &mut bytes).unwrap();
                assert_eq!(bytes, want, "key {i}");
            }
        }
    };
    assert_eq!(
        trips(&writer, |st| check(st, &|i| Some(value(i, 1)))),
        (0, 1),
        "sixteen keys, one round"
    );
    // Another client changes two keys: they are looked up; the fourteen others still
    // take the one round.
    other.block_on(other.put(&keys[3], &value(3, 2))).unwrap();
    assert!(other.block_on(other.remove(&keys[7])).unwrap());
    let want = |i: usize| match i {
        3 => Some(value(3, 2)),
        7 => None,
        _ => Some(value(i, 1)),
    };
    let (_, rounds) = trips(&writer, |st| check(st, &want));
    assert!(
        rounds > 1 && rounds <= 1 + 2 * 3,
        "one round, then two lookups: {rounds}"
    );
    assert_eq!(
        trips(&writer, |st| check(st, &want)),
        (0, 3),
        "key 7 is looked up (no value leaves no hint)"
    );
    // Buffers and keys must pair up.
    let short = writer.block_on(writer.get_into_many(&key_refs, &out_refs[..3]));
    assert!(short
        .iter()
        .all(|r| matches!(r, Err(Error::Core(CoreError::OutOfLimits { .. })))));
    // Buffers that overlap are refused: two keys' READs into the same bytes.
    let twice = [out_refs[0], out_refs[0]];
    let both = writer.block_on(writer.get_into_many(&key_refs[..2], &twice));
    assert!(both
        .iter()
        .all(|r| matches!(r, Err(Error::Core(CoreError::BadSetting { .. })))));
}

/// A get of `k` that finds nothing.
fn get_none(k: &'static [u8]) -> impl FnOnce(&Store) {
    move |st: &Store| assert_eq!(st.block_on(st.get(k)).unwrap(), None)
}

#[test]
fn puts_of_many_keys_take_the_round_trips_of_one_put_together() {
    let lease = Duration::from_secs(10);
    let s: Vec<MemoryServer> = (1..=3).map(|n| server(n, lease)).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = client(&refs, 1, 2);
    let names: Vec<String> = (0..16).map(|i| format!("batch-{i}")).collect();
    let keys: Vec<&[u8]> = names.iter().map(|k| k.as_bytes()).collect();
    let first: Vec<Vec<u8>> = (0..16).map(|i| value(i, 100 + i)).collect();
    let values: Vec<&[u8]> = first.iter().map(Vec::as_slice).collect();
    let completions = || st.pool().engine_stats().completions;
    let (puts, _) = trips(&st, |st| {
        for r in st.block_on(st.put_many(&keys, &values)) {
            assert_eq!(r.unwrap().seq, 1);
        }
    });
    // 16 fresh keys in the 2 rounds of one fresh key's put: a list per server and round.
    // Beside them the batch allocated spare blocks for as many puts.
    assert_eq!(puts, 2, "round trips of 16 fresh keys put together");
    // Overwritten together: each key's hint is current and has its spares, so the batch
    // publishes in the one round of a single put from a current hint.
    let second: Vec<Vec<u8>> = (0..16).map(|i| value(i + 50, 80)).collect();
    let values: Vec<&[u8]> = second.iter().map(Vec::as_slice).collect();
    let before = completions();
    let (puts, _) = trips(&st, |st| {
        for r in st.block_on(st.put_many(&keys, &values)) {
            assert_eq!(r.unwrap().seq, 2);
        }
    });
    let batched = completions() - before;
    assert_eq!(puts, 1, "round trips of 16 overwrites put together");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            st.block_on(st.get(k)).unwrap().unwrap(),
            second[i],
            "{}",
            names[i]
        );
    }
    // One by one, the same 16 overwrites (each from a current hint and spares): a round
    // trip each.
    let before = completions();
    let (puts, _) = trips(&st, |st| {
        for (k, v) in keys.iter().zip(&values) {
            st.block_on(st.put(k, v)).unwrap();
        }
    });
    let single = completions() - before;
    assert_eq!(puts, 16, "round trips of 16 overwrites one by one");
    // The batch's completions: its servers' lists, and one per spare block allocated for
    // the next batch (allocations are not batched yet).
    eprintln!("put_many of 16 overwrites: {batched} completions, one by one: {single}");
}
