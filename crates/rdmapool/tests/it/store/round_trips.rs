//! Round trips per store operation, counted by `StoreStats` (issue #43, docs/STORE.md
//! sections 5 and 6): a put takes 3 with r = 2 and 2 with r = 1, for a fresh key or with a
//! current hint, and one more when it must read the key's block first; a get takes 1 with a
//! current hint and 2 without. Counts, not times.

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
    let st = store(&refs, 1, 2);
    let put = |k: &'static [u8], v: &'static [u8]| {
        move |st: &Store| {
            st.block_on(st.put(k, v)).unwrap();
        }
    };
    let get = |k: &'static [u8], want: &'static [u8]| {
        move |st: &Store| assert_eq!(st.block_on(st.get(k)).unwrap().as_deref(), Some(want))
    };
    // r = 2: lookup and allocation; the blocks written and the primary swapped; the backup
    // swapped. The fence words are read beside the swaps.
    assert_eq!(trips(&st, put(b"k", b"first")), (3, 0), "a fresh key");
    assert_eq!(
        trips(&st, put(b"k", b"second")),
        (3, 0),
        "with a current hint"
    );
    assert_eq!(
        trips(&st, get(b"k", b"second")),
        (0, 1),
        "a get with a current hint"
    );
    // Another client knows nothing of the key: its lookup reads the block in a round of
    // its own.
    let other = store(&refs, 2, 2);
    assert_eq!(
        trips(&other, get(b"k", b"second")),
        (0, 2),
        "a get without a hint"
    );
    let fresh = store(&refs, 3, 2);
    assert_eq!(
        trips(&fresh, put(b"k", b"third")),
        (4, 0),
        "a put without a hint"
    );
    // Its put left it a hint; the first client's is stale now (another put came between):
    // the stale hint costs its READ and nothing more.
    assert_eq!(trips(&fresh, put(b"k", b"fourth")), (3, 0));
    assert_eq!(trips(&st, get(b"k", b"fourth")), (0, 2), "a stale hint");
    // r = 1: one round fewer.
    let single = store(&refs, 4, 1);
    assert_eq!(
        trips(&single, put(b"solo", b"one")),
        (2, 0),
        "a fresh key, r = 1"
    );
    assert_eq!(
        trips(&single, put(b"solo", b"two")),
        (2, 0),
        "with a current hint, r = 1"
    );
    assert_eq!(trips(&single, get(b"solo", b"two")), (0, 1));
    // Removes are puts of tombstones (the get above left a current hint).
    assert_eq!(
        trips(&st, |st| assert!(st.block_on(st.remove(b"k")).unwrap())),
        (3, 0),
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
