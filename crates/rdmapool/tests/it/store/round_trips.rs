//! Round trips per store operation, counted by `StoreStats` (issue #43, docs/STORE.md
//! sections 5 and 6), whatever `r`: a put takes 1 from a current hint (the client's own
//! put or get of the key, lately), 2 for a fresh key or with an older hint, and one more
//! when it must read the key's block first; a get takes 1 with a current hint and 2
//! without. Counts, not times.

use super::*;

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
    // A grace period long enough that a hint stays current however slow the machine
    // (a hint is current for a quarter of it).
    let store = |id, r| {
        let cfg = StoreConfig {
            replicas: r,
            grace: Duration::from_secs(600),
            ..StoreConfig::default()
        };
        Store::new(pool(&refs, id), cfg).expect("store")
    };
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

/// A get of `k` that finds nothing.
fn get_none(k: &'static [u8]) -> impl FnOnce(&Store) {
    move |st: &Store| assert_eq!(st.block_on(st.get(k)).unwrap(), None)
}
