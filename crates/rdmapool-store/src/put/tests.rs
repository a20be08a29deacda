use super::super::format::{block_len, KeyHash, Slot};
use super::super::lookup::Replica;
use super::super::sim::{Cluster, Race, Running};
use super::*;
use proptest::prelude::*;

#[test]
fn a_put_lands_on_every_replica_and_a_get_reads_it() {
    let mut c = Cluster::new(&[1, 2]);
    let done = Running::put(&c, b"k", b"hello", 7).run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 1, writer: 7 }));
    assert!(done.replaced.is_empty() && done.unused.is_empty());
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"hello");
    for node in [1, 2] {
        let fp = KeyHash::of(b"k").fingerprint();
        let held = c
            .bucket(node, b"k")
            .iter()
            .filter(|&&w| Slot::from_word(w).is_some_and(|s| s.fingerprint == fp))
            .count();
        assert_eq!(held, 1, "node {node}");
    }
    // Each replica answers alone.
    c.down.insert(1);
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"hello");
}

#[test]
fn an_overwrite_is_a_new_version_and_reports_the_blocks_it_replaced() {
    let mut c = Cluster::new(&[1, 2]);
    Running::put(&c, b"k", b"one", 7).run(&mut c).unwrap();
    let done = Running::put(&c, b"k", b"two", 3).run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 2, writer: 3 }));
    assert_eq!(done.replaced.len(), 2, "the old block on each replica");
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"two");
}

#[test]
fn a_remove_puts_a_tombstone_and_a_remove_of_nothing_writes_nothing() {
    let mut c = Cluster::new(&[1, 2]);
    let nothing = Running::remove(&c, b"k", 7).run(&mut c).unwrap();
    assert_eq!(nothing.version, None);
    Running::put(&c, b"k", b"v", 7).run(&mut c).unwrap();
    let gone = Running::remove(&c, b"k", 7).run(&mut c).unwrap();
    assert_eq!(gone.version, Some(Version { seq: 2, writer: 7 }));
    assert_eq!(c.get(b"k").unwrap(), None);
    let again = Running::remove(&c, b"k", 7).run(&mut c).unwrap();
    assert_eq!(again.version, None, "already removed");
    // A put after a remove continues the sequence.
    let back = Running::put(&c, b"k", b"w", 7).run(&mut c).unwrap();
    assert_eq!(back.version, Some(Version { seq: 3, writer: 7 }));
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"w");
}

#[test]
fn a_writer_that_dies_with_its_swaps_asked_changes_nothing_a_reader_sees_and_leaves_its_blocks() {
    let mut c = Cluster::new(&[1, 2]);
    Running::put(&c, b"k", b"old", 7).run(&mut c).unwrap();
    let mut dying = Running::put(&c, b"k", b"new", 8);
    assert!(!dying.put.published(), "only the lookup is asked");
    assert_eq!(
        dying.put.allocated().len(),
        0,
        "nothing allocated before the lookup's step is answered"
    );
    while !dying.next_is_swap() {
        dying.step(&mut c);
    }
    // The publishing step is asked and not performed: the writer dies here.
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"old");
    assert!(
        dying.put.published(),
        "its swaps may land: the version may become visible"
    );
    assert!(
        dying.put.allocated().is_empty(),
        "slots may name its blocks: none is the caller's to free"
    );
}

#[test]
fn a_backup_that_fails_while_the_primary_swaps_fails_the_put_as_published() {
    let mut c = Cluster::new(&[1, 2]);
    let mut p = Running::put(&c, b"k", b"v", 7);
    while !p.next_is_swap() {
        p.step(&mut c);
    }
    // Every replica's write and swap are one step; the backup fails under it.
    let backup = c.replicas[1].node;
    c.down.insert(backup);
    p.step(&mut c);
    assert!(p.put.published());
    let outcome = p.outcome.take().unwrap();
    assert!(matches!(outcome, Err(Error::NodeDown { node, .. }) if node == backup));
    assert!(
        p.put.allocated().is_empty(),
        "the backup's swap has no answer and may have landed: its block is left to repair"
    );
    c.down.clear();
    assert_eq!(
        c.get(b"k").unwrap().unwrap(),
        b"v",
        "visible on the primary"
    );
}

#[test]
fn a_full_bucket_is_a_typed_error() {
    let mut c = Cluster::new(&[1]);
    let h = KeyHash::of(b"k");
    let at = c.replicas[0].bucket_at(h) as usize;
    // Eight slots of other keys' fingerprints.
    let other = Slot::new(KeyHash(!h.0), 4 << 20, 64).unwrap().word();
    for i in 0..8 {
        c.regions[&1].bytes()[at + 8 * i..at + 8 * i + 8].copy_from_slice(&other.to_le_bytes());
    }
    let r = Running::put(&c, b"k", b"v", 7).run(&mut c);
    assert!(matches!(r, Err(Error::IndexFull { node: 1 })), "{r:?}");
}

/// Runs `puts` to their ends, their operations interleaved one at a time in the order
/// `order` picks (then the first unfinished): the highest version they took, and whose it
/// is. Each must succeed with a version of its own.
fn race(
    puts: &mut [Running],
    order: Vec<usize>,
    c: &mut Cluster,
) -> std::result::Result<(Version, usize), TestCaseError> {
    let writers = puts.len();
    let mut turns = order.into_iter();
    while puts.iter().any(|p| !p.finished()) {
        let w = turns.next().unwrap_or(0) % writers;
        let w = (w..w + writers)
            .map(|k| k % writers)
            .find(|&k| !puts[k].finished())
            .unwrap();
        puts[w].step_op(c);
    }
    let versions: Vec<Version> = puts
        .iter_mut()
        .map(|p| p.outcome.take().unwrap().unwrap().version.unwrap())
        .collect();
    let top = *versions.iter().max().unwrap();
    let winner = versions.iter().position(|&v| v == top).unwrap();
    let mut distinct = versions.clone();
    distinct.sort();
    distinct.dedup();
    prop_assert_eq!(distinct.len(), versions.len(), "versions {:?}", versions);
    Ok((top, winner))
}

proptest! {
    /// Two or three puts of one key, their operations interleaved one by one in any order
    /// (a step's operations land one at a time, others' between them): each ends with its
    /// own version, every replica ends naming the highest, and a get reads it. Over a
    /// planted value, the puts read its blocks early (hinted).
    #[test]
    fn racing_puts_end_in_one_winner_everywhere(order in proptest::collection::vec(0usize..3, 1..600), writers in 2usize..4, planted: bool) {
        let mut c = Cluster::new(&[1, 2, 3]);
        c.replicas.truncate(2); // r = 2 of the three nodes
        // A planted value's slot words are the writers' hints (read beside the buckets;
        // stale as soon as one of them wins).
        let hints = if planted {
            Running::put(&c, b"k", b"before", 99).run(&mut c).unwrap().installed
        } else {
            Vec::new()
        };
        let values: Vec<Vec<u8>> = (0..writers).map(|w| format!("value of {w}").into_bytes()).collect();
        let mut puts: Vec<Running> = (0..writers).map(|w| Running::put_hinted(&c, b"k", &values[w], w as u64 + 1, &hints)).collect();
        let (_, winner) = race(&mut puts, order, &mut c)?;
        prop_assert_eq!(c.get(b"k").unwrap().unwrap(), values[winner].clone());
        for node in [1, 2] {
            c.down = [3 - node].into();
            prop_assert_eq!(c.get(b"k").unwrap().unwrap(), values[winner].clone(), "node {} alone", node);
        }
    }
}

#[test]
fn a_put_hinted_where_the_key_is_looks_it_up_in_one_round() {
    let mut c = Cluster::new(&[1, 2]);
    let first = Running::put(&c, b"k", b"one", 7).run(&mut c).unwrap();
    let mut p = Running::put_hinted(&c, b"k", b"two", 8, &first.installed);
    p.step(&mut c); // buckets and both blocks at once
    assert!(
        !p.next_is_read(),
        "no second round of reads: the blocks came with the buckets"
    );
    let done = p.run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 2, writer: 8 }));
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"two");
}

#[test]
fn a_put_with_a_floor_takes_a_version_above_it_whatever_it_finds() {
    // A put retried after its view changed under it (docs/STORE.md section 4): its new
    // version must beat the one it published under the old view, which its new replicas
    // may not hold.
    let mut c = Cluster::new(&[1, 2]);
    Running::put(&c, b"k", b"one", 7).run(&mut c).unwrap();
    let floor = Some(Version { seq: 9, writer: 7 });
    let put = Put::new(b"k", ValueDigest::of(b"two"), Kind::Value, 7, &c.replicas)
        .unwrap()
        .at_least(floor, false);
    let done = Running::start(put, b"two").run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 10, writer: 7 }));
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"two");
    // A floor below what is found changes nothing.
    let put = Put::new(b"k", ValueDigest::of(b"three"), Kind::Value, 3, &c.replicas)
        .unwrap()
        .at_least(Some(Version { seq: 1, writer: 9 }), false);
    let done = Running::start(put, b"three").run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 11, writer: 3 }));
}

#[test]
fn a_remove_with_a_floor_writes_its_tombstone_where_its_replicas_hold_nothing() {
    // Found in the multi-host history test (issue #40): while keys move to a new view's
    // placement, a remove whose new replicas held nothing yet answered "nothing to remove"
    // and wrote nothing, while the value sat on the previous placement; the move's repair
    // then brought it back. A floor above what the replicas hold is the key elsewhere.
    let c = Cluster::new(&[1, 2]);
    let floor = Some(Version { seq: 5, writer: 7 });
    let remove = |floor_removed| {
        Put::new(b"k", ValueDigest::of(b""), Kind::Tombstone, 3, &c.replicas)
            .unwrap()
            .at_least(floor, floor_removed)
    };
    let mut c2 = Cluster::new(&[1, 2]);
    let done = Running::start(remove(false), b"").run(&mut c2).unwrap();
    assert_eq!(
        done.version,
        Some(Version { seq: 6, writer: 3 }),
        "a tombstone above the value elsewhere"
    );
    assert_eq!(c2.get(b"k").unwrap(), None);
    // The floor is itself a tombstone (removed there already): nothing to remove.
    let mut c3 = Cluster::new(&[1, 2]);
    let done = Running::start(remove(true), b"").run(&mut c3).unwrap();
    assert_eq!(done.version, None);
    // No floor, nothing held: nothing to remove, as before.
    let mut c4 = Cluster::new(&[1, 2]);
    let plain = Put::new(b"k", ValueDigest::of(b""), Kind::Tombstone, 3, &c4.replicas).unwrap();
    assert_eq!(
        Running::start(plain, b"").run(&mut c4).unwrap().version,
        None
    );
}

/// Runs `p` to its end: its outcome, and the round trips it took.
fn run_counting(mut p: Running, c: &mut Cluster) -> (Result<PutDone>, u32) {
    while !p.finished() {
        p.step(c);
    }
    let trips = p.put.round_trips();
    (p.outcome.take().unwrap(), trips)
}

#[test]
fn a_put_takes_two_round_trips_whatever_r_and_one_more_without_a_hint() {
    let mut c = Cluster::new(&[1, 2]);
    let (first, trips) = run_counting(Running::put(&c, b"k", b"one", 7), &mut c);
    let first = first.unwrap();
    assert_eq!(trips, 2, "a fresh key: lookup, publish on both replicas");
    let hinted = Running::put_hinted(&c, b"k", b"two", 7, &first.installed);
    let (second, trips) = run_counting(hinted, &mut c);
    assert_eq!(trips, 2, "with a hint");
    let (_, trips) = run_counting(Running::put(&c, b"k", b"three", 7), &mut c);
    assert_eq!(
        trips, 3,
        "without a hint the block is read in a round of its own"
    );
    // A stale hint (the slot moved on) costs its READ, and the round it would have saved.
    let stale = Running::put_hinted(&c, b"k", b"four", 7, &second.unwrap().installed);
    assert_eq!(run_counting(stale, &mut c).1, 3);
    let mut three = Cluster::new(&[1, 2, 3]);
    assert_eq!(
        run_counting(Running::put(&three, b"k", b"v", 7), &mut three).1,
        2,
        "r = 3"
    );
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"four");
    let mut one = Cluster::new(&[1]);
    assert_eq!(
        run_counting(Running::put(&one, b"k", b"v", 7), &mut one).1,
        2,
        "r = 1"
    );
}

#[test]
fn a_fenced_put_reads_each_fence_word_right_after_its_swap_there_and_costs_no_round() {
    use crate::view::VIEW_AT;
    let mut c = Cluster::new(&[1, 2]);
    c.regions[&1].store(VIEW_AT, 5);
    c.regions[&2].store(VIEW_AT, 6);
    let put = Put::new(b"k", ValueDigest::of(b"v"), Kind::Value, 7, &c.replicas)
        .unwrap()
        .fenced(VIEW_AT);
    let (done, trips) = run_counting(Running::start(put, b"v"), &mut c);
    let done = done.unwrap();
    assert_eq!(trips, 2);
    let mut fences = done.fences.clone();
    fences.sort();
    assert_eq!(fences, vec![(1, Some(5)), (2, Some(6))]);
    // A newer version on the backup alone (a copy): the next put beats it on both, and
    // reads both fences again.
    let newer = Put::copy(
        b"k",
        ValueDigest::of(b"w"),
        Kind::Value,
        Version { seq: 9, writer: 1 },
        &c.replicas[1..],
    )
    .unwrap();
    Running::start(newer, b"w").run(&mut c).unwrap();
    let put = Put::new(b"k", ValueDigest::of(b"x"), Kind::Value, 7, &c.replicas)
        .unwrap()
        .at_least(Some(Version { seq: 1, writer: 7 }), false)
        .fenced(VIEW_AT);
    let done = Running::start(put, b"x").run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 10, writer: 7 }));
    assert_eq!(done.fences.len(), 2, "both swapped: {:?}", done.fences);
}

/// `done.seen` in the order of `replicas`.
fn seen_in(done: &PutDone, replicas: &[Replica]) -> Vec<SlotSeen> {
    replicas
        .iter()
        .filter_map(|r| done.seen.iter().find(|s| s.node == r.node).copied())
        .collect()
}

/// A block for `value` under `key` on each of `replicas`, allocated outside any put.
fn blocks_for(c: &mut Cluster, replicas: &[Replica], key: &[u8], value: &[u8]) -> Vec<u64> {
    replicas
        .iter()
        .map(|r| c.alloc(r.node, block_len(key, value.len() as u64)).unwrap())
        .collect()
}

#[test]
fn a_put_from_a_current_hint_publishes_in_one_round_trip_on_every_replica() {
    for nodes in [&[1u32][..], &[1, 2], &[1, 2, 3]] {
        let mut c = Cluster::new(nodes);
        let all: Vec<usize> = (0..nodes.len()).collect();
        let put = Put::new(b"k", ValueDigest::of(b"one"), Kind::Value, 7, &c.replicas)
            .unwrap()
            .spare(&all);
        let first = Running::start(put, b"one").run(&mut c).unwrap();
        assert_eq!(first.spares.len(), nodes.len(), "a spare on every replica");
        let blocks: Vec<u64> = c
            .replicas
            .iter()
            .map(|r| first.spares.iter().find(|s| s.0 == r.node).unwrap().1)
            .collect();
        let put = Put::new(b"k", ValueDigest::of(b"two"), Kind::Value, 7, &c.replicas)
            .unwrap()
            .current(&seen_in(&first, &c.replicas), &blocks)
            .spare(&all);
        assert!(put.publishes_first());
        let (done, trips) = run_counting(Running::start(put, b"two"), &mut c);
        let done = done.unwrap();
        assert_eq!(
            trips,
            1,
            "r = {}: write, swap and fence read in one list each",
            nodes.len()
        );
        assert_eq!(done.version, Some(Version { seq: 2, writer: 7 }));
        assert_eq!(
            done.replaced.len(),
            nodes.len(),
            "the old block on each replica"
        );
        assert!(done.unused.is_empty());
        assert_eq!(
            done.spares.len(),
            nodes.len(),
            "the next put's blocks, beside it"
        );
        for &node in nodes {
            c.down = nodes.iter().copied().filter(|&n| n != node).collect();
            assert_eq!(c.get(b"k").unwrap().unwrap(), b"two", "node {node} alone");
        }
    }
}

#[test]
fn a_put_from_a_stale_hint_is_made_again_above_the_version_it_did_not_see() {
    let mut c = Cluster::new(&[1, 2]);
    let first = Running::put(&c, b"k", b"one", 7).run(&mut c).unwrap();
    let seen = seen_in(&first, &c.replicas);
    // Another client's put comes between: the hint is stale on both replicas.
    Running::put(&c, b"k", b"other", 8).run(&mut c).unwrap();
    let replicas = c.replicas.clone();
    let blocks = blocks_for(&mut c, &replicas, b"k", b"two");
    let put = Put::new(b"k", ValueDigest::of(b"two"), Kind::Value, 7, &c.replicas)
        .unwrap()
        .current(&seen, &blocks);
    let (done, trips) = run_counting(Running::start(put, b"two"), &mut c);
    let done = done.unwrap();
    assert_eq!(
        done.version,
        Some(Version { seq: 3, writer: 7 }),
        "above the version the hint did not know"
    );
    assert_eq!(
        trips, 3,
        "the lost swaps, a lookup reading the blocks they found, the publish"
    );
    assert!(
        done.unused.is_empty(),
        "its blocks were used when made again"
    );
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"two");
}

#[test]
fn a_put_whose_backup_swap_won_while_the_primary_lost_is_made_again_in_new_blocks_there() {
    let mut c = Cluster::new(&[1, 2]);
    let first = Running::put(&c, b"k", b"one", 7).run(&mut c).unwrap();
    let seen = seen_in(&first, &c.replicas);
    let replicas = c.replicas.clone();
    // Another put swaps the primary alone first (a copy onto it, as a put's first swap).
    let other = Running::copy(
        &replicas[..1],
        b"k",
        b"other",
        Kind::Value,
        Version { seq: 2, writer: 8 },
    );
    other.run(&mut c).unwrap();
    let blocks = blocks_for(&mut c, &replicas, b"k", b"two");
    let put = Put::new(b"k", ValueDigest::of(b"two"), Kind::Value, 7, &replicas)
        .unwrap()
        .current(&seen, &blocks);
    let mut p = Running::start(put, b"two");
    p.step(&mut c); // the primary's swap lost, the backup's won
    assert!(p.put.published(), "visible on the backup");
    let renewing = p.pending_allocs();
    assert_eq!(
        renewing,
        vec![replicas[1].node],
        "a new block where a slot names the old"
    );
    let done = p.run(&mut c).unwrap();
    assert_eq!(done.version, Some(Version { seq: 3, writer: 7 }));
    assert!(
        done.replaced.iter().any(|&(n, at, v)| n == replicas[1].node
            && at == blocks[1]
            && v == Version { seq: 2, writer: 7 }),
        "its own first block on the backup is replaced like any: {:?}",
        done.replaced
    );
    for node in [1, 2] {
        c.down = [3 - node].into();
        assert_eq!(c.get(b"k").unwrap().unwrap(), b"two", "node {node} alone");
    }
}

proptest! {
    /// Puts of one key from current hints (one round trip when nothing came between),
    /// from plain hints and without, their operations interleaved one by one in any
    /// order, with r = 2 or 3: versions are distinct, every replica ends naming the
    /// highest, and a put made afterwards from the (now stale) hint goes above it.
    #[test]
    fn racing_puts_from_current_hints_end_in_one_winner_everywhere(
        order in proptest::collection::vec(0usize..3, 1..600),
        writers in 2usize..4,
        current in 0u8..8,
        r in 2usize..4,
    ) {
        let mut c = Cluster::new(&[1, 2, 3]);
        c.replicas.truncate(r);
        let planted = Running::put(&c, b"k", b"before", 99).run(&mut c).unwrap();
        let seen = seen_in(&planted, &c.replicas);
        let replicas = c.replicas.clone();
        let values: Vec<Vec<u8>> = (0..writers).map(|w| format!("value of {w}").into_bytes()).collect();
        let mut puts: Vec<Running> = (0..writers).map(|w| {
            if current & (1 << w) != 0 {
                let blocks = blocks_for(&mut c, &replicas, b"k", &values[w]);
                let put = Put::new(b"k", ValueDigest::of(&values[w]), Kind::Value, w as u64 + 1, &replicas)
                    .unwrap()
                    .current(&seen, &blocks);
                Running::start(put, &values[w])
            } else {
                Running::put_hinted(&c, b"k", &values[w], w as u64 + 1, &planted.installed)
            }
        }).collect();
        let (top, winner) = race(&mut puts, order, &mut c)?;
        for node in 1..=r as u32 {
            c.down = (1..=3).filter(|&n| n != node).collect();
            prop_assert_eq!(c.get(b"k").unwrap().unwrap(), values[winner].clone(), "node {} alone", node);
        }
        c.down.clear();
        // A late put from the planted (now stale) hint.
        let blocks = blocks_for(&mut c, &replicas, b"k", b"late");
        let put = Put::new(b"k", ValueDigest::of(b"late"), Kind::Value, 50, &replicas)
            .unwrap()
            .current(&seen, &blocks);
        let late = Running::start(put, b"late").run(&mut c).unwrap();
        prop_assert!(late.version.unwrap() > top, "{:?} after {:?}", late.version, top);
        for node in 1..=r as u32 {
            c.down = (1..=3).filter(|&n| n != node).collect();
            prop_assert_eq!(c.get(b"k").unwrap().unwrap(), b"late".to_vec(), "node {} alone", node);
        }
    }
}

#[test]
fn a_reclaim_writes_its_tombstone_over_the_expired_version_only() {
    let mut c = Cluster::new(&[1, 2]);
    let expired = Running::put(&c, b"k", b"old", 7).run(&mut c).unwrap();
    let e = expired.version;
    let reclaim = |c: &Cluster| {
        let put = Put::new(b"k", ValueDigest::of(b""), Kind::Tombstone, 0, &c.replicas)
            .unwrap()
            .only_over(e);
        Running::start(put, b"")
    };
    // A put came after the expired value: the reclaim writes nothing.
    Running::put(&c, b"k", b"new", 3).run(&mut c).unwrap();
    let none = reclaim(&c).run(&mut c).unwrap();
    assert_eq!(none.version, None);
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"new");
    // Over the expired value itself: a tombstone as writer 0, above it.
    let mut c = Cluster::new(&[1, 2]);
    Running::put(&c, b"k", b"old", 7).run(&mut c).unwrap();
    let gone = reclaim(&c).run(&mut c).unwrap();
    assert_eq!(gone.version, Some(Version { seq: 2, writer: 0 }));
    assert_eq!(
        gone.replaced.len(),
        2,
        "the expired block on each replica, to free"
    );
    assert_eq!(c.get(b"k").unwrap(), None);
}

proptest! {
    /// The reclaim of an expired value (a tombstone as writer 0, only over that version)
    /// racing one or two puts of the key, hinted or not, their operations interleaved one
    /// by one in any order, with r = 2 or 3: every put ends with a version of its own, and
    /// every replica, read alone, ends with the highest put's value; the reclaim never
    /// takes the place of a put.
    #[test]
    fn a_reclaim_racing_puts_never_overtakes_one(
        order in proptest::collection::vec(0usize..3, 1..600),
        writers in 1usize..3,
        hinted: bool,
        r in 2usize..4,
    ) {
        let mut race = Race::new(r, writers, hinted);
        let replicas = race.c.replicas.clone();
        let reclaim = Put::new(b"k", ValueDigest::of(b""), Kind::Tombstone, 0, &replicas)
            .unwrap()
            .only_over(race.planted.version);
        let mut all = std::mem::take(&mut race.puts);
        all.push(Running::start(reclaim, b""));
        let n = all.len();
        let mut turns = order.into_iter();
        while all.iter().any(|p| !p.finished()) {
            let w = turns.next().unwrap_or(0) % n;
            let w = (w..w + n).map(|k| k % n).find(|&k| !all[k].finished()).unwrap();
            all[w].step_op(&mut race.c);
        }
        let reclaimed = all.pop().unwrap().outcome.take().unwrap().unwrap().version;
        race.puts = all;
        let (winner, top) = race.winner();
        if let Some(t) = reclaimed {
            prop_assert!(t < top, "the reclaim's {:?} above the top put's {:?}", t, top);
        }
        for (node, got) in race.alone(r).into_iter().enumerate() {
            prop_assert_eq!(got, Some(winner.clone()), "node {} alone", node + 1);
        }
    }
}
