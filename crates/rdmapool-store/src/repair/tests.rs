use super::*;
use crate::format::Kind;

fn e(node: u32, at: u64, seq: u64) -> Entry {
    Entry {
        node,
        at,
        word: at | 1,
        key: b"k".to_vec(),
        version: Version { seq, writer: 1 },
        kind: Kind::Value,
        expiry: crate::format::Expiry::NEVER,
    }
}

fn v(seq: u64) -> Option<Version> {
    Some(Version { seq, writer: 1 })
}

#[test]
fn a_lost_replica_is_copied_from_a_sound_one_and_nothing_is_cleared() {
    let entries = [e(1, 64, 3)];
    let p = plan(&entries, &[true], &[1, 2]);
    assert_eq!(p.version, v(3));
    assert_eq!(p.source, Some(0));
    assert_eq!(p.need, [2]);
    assert!(p.clear.is_empty());
}

#[test]
fn the_replicas_version_wins_over_a_newer_one_elsewhere_which_is_left_alone() {
    // Node 3 is no longer a replica; it names seq 9, the replicas name seq 2.
    let entries = [e(1, 64, 2), e(3, 64, 9), e(2, 64, 2)];
    assert_eq!(keep(&entries, &[1, 2]), v(2));
    let p = plan(&entries, &[true, false, true], &[1, 2]);
    assert!(p.need.is_empty());
    assert!(p.clear.is_empty());
    assert_eq!(p.conflicts, 1);
}

#[test]
fn a_key_no_replica_holds_is_moved_from_where_it_is_and_cleared_there() {
    let entries = [e(3, 64, 4), e(4, 128, 2)];
    assert_eq!(keep(&entries, &[1, 2]), v(4));
    let p = plan(&entries, &[true, false], &[1, 2]);
    assert_eq!(p.source, Some(0));
    assert_eq!(p.need, [1, 2]);
    assert_eq!(
        p.clear,
        [0, 1],
        "both non-replica entries, once the copies land"
    );
}

#[test]
fn older_versions_damaged_copies_and_duplicates_are_cleared() {
    let entries = [
        e(1, 64, 5),  // stays
        e(1, 128, 4), // older, on a replica
        e(2, 64, 5),  // damaged
        e(1, 192, 5), // a duplicate of the one that stays
    ];
    let p = plan(&entries, &[true, false, false, true], &[1, 2]);
    assert_eq!(p.source, Some(0));
    assert_eq!(p.need, [2], "its only copy is damaged");
    assert_eq!(p.clear, [1, 2, 3]);
}

#[test]
fn with_no_sound_copy_of_the_version_nothing_is_touched() {
    let entries = [e(1, 64, 5), e(2, 64, 4)];
    let p = plan(&entries, &[false, true], &[1, 2]);
    assert_eq!(p.version, v(5));
    assert_eq!(p.source, None);
    assert!(p.need.is_empty() && p.clear.is_empty());
}

#[test]
fn a_source_on_a_replica_is_preferred() {
    let entries = [e(3, 64, 5), e(1, 64, 5)];
    let p = plan(&entries, &[true, true], &[1, 2]);
    assert_eq!(p.source, Some(1));
    assert_eq!(p.need, [2]);
    assert_eq!(p.clear, [0]);
}

#[test]
fn entries_group_by_key() {
    let mut other = e(2, 64, 1);
    other.key = b"q".to_vec();
    let g = by_key(vec![e(1, 64, 1), other, e(2, 128, 1)]);
    assert_eq!(g.len(), 2);
    assert_eq!(g[&b"k"[..]].len(), 2);
}

mod simulated {
    use super::super::super::sim::{Cluster, Repairing, Running};
    use crate::format::{KeyHash, Slot, Version};
    use proptest::prelude::*;

    fn holds(c: &Cluster, node: u32, key: &[u8]) -> usize {
        let fp = KeyHash::of(key).fingerprint();
        c.bucket(node, key)
            .iter()
            .filter(|&&w| Slot::from_word(w).is_some_and(|s| s.fingerprint == fp))
            .count()
    }

    /// Each of `nodes` alone answers `value` for `key`.
    fn each_alone_answers(c: &mut Cluster, nodes: &[u32], key: &[u8], value: &[u8]) {
        let all = c.replicas.clone();
        for &n in nodes {
            c.replicas = vec![c.replica(n)];
            assert_eq!(
                c.get(key).unwrap().as_deref(),
                Some(value),
                "node {n} alone"
            );
        }
        c.replicas = all;
    }

    #[test]
    fn a_restarted_replica_gets_its_copy_back() {
        let mut c = Cluster::new(&[1, 2]);
        Running::put(&c, b"k", b"v", 7).run(&mut c).unwrap();
        c.wipe(2);
        assert_eq!(holds(&c, 2, b"k"), 0);
        let r = Repairing::new(b"k", &[1, 2], &[1, 2]).run(&mut c);
        assert_eq!(r.plan.unwrap().need, [2]);
        each_alone_answers(&mut c, &[1, 2], b"k", b"v");
        // A second repair finds nothing to do.
        let again = Repairing::new(b"k", &[1, 2], &[1, 2]).run(&mut c);
        let p = again.plan.unwrap();
        assert!(p.need.is_empty() && p.clear.is_empty(), "{p:?}");
    }

    #[test]
    fn a_joined_server_takes_its_keys_and_the_one_it_displaced_lets_them_go() {
        let mut c = Cluster::new(&[1, 2, 3]);
        c.replicas.truncate(2); // the key's replicas were 1 and 2
        Running::put(&c, b"k", b"v", 7).run(&mut c).unwrap();
        // Node 3 joined and outranks 2 for this key.
        c.replicas = vec![c.replica(1), c.replica(3)];
        let r = Repairing::new(b"k", &[1, 2, 3], &[1, 3]).run(&mut c);
        assert_eq!(r.plan.as_ref().unwrap().need, [3]);
        assert_eq!(r.cleared, 1, "node 2's entry");
        assert_eq!(
            (holds(&c, 1, b"k"), holds(&c, 2, b"k"), holds(&c, 3, b"k")),
            (1, 0, 1)
        );
        each_alone_answers(&mut c, &[1, 3], b"k", b"v");
    }

    #[test]
    fn a_damaged_replica_is_rewritten_and_its_damaged_slot_cleared() {
        let mut c = Cluster::new(&[1, 2]);
        let v = Version { seq: 3, writer: 7 };
        c.plant(1, b"k", b"value", v);
        let at = c.plant(2, b"k", b"value", v);
        c.regions[&2].bytes()[at as usize + 64 + 1 + 2] ^= 0x40;
        let r = Repairing::new(b"k", &[1, 2], &[1, 2]).run(&mut c);
        assert_eq!(r.plan.as_ref().unwrap().need, [2]);
        assert_eq!(r.cleared, 1);
        assert_eq!(holds(&c, 2, b"k"), 1);
        each_alone_answers(&mut c, &[1, 2], b"k", b"value");
    }

    #[test]
    fn a_tombstone_is_repaired_too_so_a_removed_key_stays_removed() {
        let mut c = Cluster::new(&[1, 2]);
        Running::put(&c, b"k", b"v", 7).run(&mut c).unwrap();
        c.wipe(2);
        Running::put(&c, b"k", b"v", 7).run(&mut c).unwrap(); // seq 2 on both
        Running::remove(&c, b"k", 7).run(&mut c).unwrap(); // seq 3 on both
        c.wipe(1);
        Repairing::new(b"k", &[1, 2], &[1, 2]).run(&mut c);
        let all = c.replicas.clone();
        for n in [1, 2] {
            c.replicas = vec![c.replica(n)];
            assert_eq!(c.get(b"k").unwrap(), None, "node {n}");
            assert_eq!(holds(&c, n, b"k"), 1);
        }
        c.replicas = all;
    }

    proptest! {
        /// A put and a repair of the same key, their operations interleaved in any order,
        /// while node 2 (a replica before node 3 joined) still holds the old version and
        /// node 1 an older duplicate: every get in between answers the old or the new
        /// value, the put ends acknowledged, and after one more repair both replicas alone
        /// answer the new value and node 2 holds nothing.
        #[test]
        fn repair_during_a_put_loses_nothing(order in proptest::collection::vec(any::<bool>(), 1..200)) {
            let mut c = Cluster::new(&[1, 2, 3]);
            let (older, old) = (Version { seq: 1, writer: 9 }, Version { seq: 2, writer: 9 });
            c.plant(1, b"k", b"older", older);
            c.plant(1, b"k", b"old", old);
            c.plant(2, b"k", b"old", old);
            c.replicas = vec![c.replica(1), c.replica(3)];
            let mut put = Running::put(&c, b"k", b"new", 4);
            let mut repair = Repairing::new(b"k", &[1, 2, 3], &[1, 3]);
            let mut turns = order.into_iter();
            while !put.finished() || !repair.finished() {
                let repair_turn = turns.next().unwrap_or(false);
                if (repair_turn && !repair.finished()) || put.finished() {
                    repair.step(&mut c);
                } else {
                    put.step(&mut c);
                }
                let got = c.get(b"k").unwrap();
                prop_assert!(got.as_deref() == Some(&b"old"[..]) || got.as_deref() == Some(&b"new"[..]), "{:?}", got);
            }
            let done = put.outcome.take().unwrap().unwrap();
            prop_assert_eq!(done.version, Some(Version { seq: 3, writer: 4 }));
            Repairing::new(b"k", &[1, 2, 3], &[1, 3]).run(&mut c);
            each_alone_answers(&mut c, &[1, 3], b"k", b"new");
            prop_assert_eq!(holds(&c, 2, b"k"), 0);
            prop_assert_eq!(holds(&c, 1, b"k"), 1, "the older duplicate is cleared");
        }
    }
}
