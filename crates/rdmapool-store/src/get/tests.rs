use super::super::format::{encode_block, KeyHash, Kind, Slot, Version};
use super::super::lookup::Src;
use super::super::sim::Cluster;
use super::*;
use std::time::Instant;

fn v(seq: u64, writer: u64) -> Version {
    Version { seq, writer }
}

#[test]
fn a_get_answers_the_newest_version_on_any_replica() {
    let mut c = Cluster::new(&[1, 2]);
    c.plant(1, b"k", b"first", v(1, 7));
    c.plant(2, b"k", b"second", v(2, 7));
    c.plant(1, b"other", b"x", v(5, 7));
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"second");
    assert_eq!(c.get(b"missing").unwrap(), None);
}

#[test]
fn a_get_falls_over_to_a_replica_that_answers() {
    let mut c = Cluster::new(&[1, 2]);
    c.plant(1, b"k", b"v", v(1, 7));
    c.plant(2, b"k", b"v", v(1, 7));
    c.down.insert(1);
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"v");
    c.down = [2].into();
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"v");
    c.down = [1, 2].into();
    assert!(matches!(c.get(b"k"), Err(Error::NodeDown { .. })));
}

#[test]
fn a_damaged_block_is_skipped_for_a_replica_that_verifies() {
    let mut c = Cluster::new(&[1, 2]);
    let at = c.plant(1, b"k", b"value", v(3, 7));
    c.plant(2, b"k", b"value", v(3, 7));
    // Flip a byte of the value in node 1's memory.
    c.regions[&1].bytes()[at as usize + 64 + 1 + 2] ^= 0x40;
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"value");
    // With the good replica down, the damaged copy is no answer and no "not found".
    c.down.insert(2);
    assert!(matches!(c.get(b"k"), Err(Error::NodeDown { .. })));
}

/// Issue #40: every copy damaged, every replica answering: `Damaged`, never "not found";
/// and so for a damaged copy beside a replica that never held the key (a client that
/// places the key over other servers since the good copy's server died).
#[test]
fn damaged_copies_are_never_not_found() {
    let mut c = Cluster::new(&[1, 2]);
    let at1 = c.plant(1, b"k", b"value", v(3, 7));
    let at2 = c.plant(2, b"k", b"value", v(3, 7));
    c.regions[&1].bytes()[at1 as usize + 64 + 1 + 2] ^= 0x40;
    c.regions[&2].bytes()[at2 as usize + 64 + 1 + 3] ^= 0x01;
    assert!(
        matches!(c.get(b"k"), Err(Error::Damaged { .. })),
        "{:?}",
        c.get(b"k")
    );

    let mut c = Cluster::new(&[1, 2]);
    let at1 = c.plant(1, b"k", b"value", v(3, 7));
    c.regions[&1].bytes()[at1 as usize + 64 + 1 + 2] ^= 0x40;
    assert!(
        matches!(c.get(b"k"), Err(Error::Damaged { .. })),
        "{:?}",
        c.get(b"k")
    );
}

#[test]
fn a_slot_naming_memory_outside_the_data_area_is_skipped() {
    let mut c = Cluster::new(&[1]);
    let h = KeyHash::of(b"k");
    let bucket = c.replicas[0].bucket_at(h) as usize;
    let bad = Slot::new(h, 8, 100).unwrap().word(); // in the region header
    c.regions[&1].bytes()[bucket..bucket + 8].copy_from_slice(&bad.to_le_bytes());
    assert_eq!(c.get(b"k").unwrap(), None);
    c.plant(1, b"k", b"real", v(1, 1));
    assert_eq!(c.get(b"k").unwrap().unwrap(), b"real");
}

/// A get that read the bucket, then a remove (and the space reused at once, as if the grace
/// period had passed), then the get's block read: the get answers "removed", never the
/// bytes that now fill the old block.
#[test]
fn a_remove_during_a_get_is_seen_whole_or_not_at_all() {
    use super::super::format::encode_block;
    use super::super::sim::Running;
    let mut c = Cluster::new(&[1, 2]);
    Running::put(&c, b"k", b"old value", 7).run(&mut c).unwrap();
    let mut g = Get::new(b"k", &c.replicas);
    let Step::Do(buckets) = g.advance(&mut (), Instant::now(), &[]).unwrap() else {
        panic!("a get reads buckets first")
    };
    let answers: Vec<Answer> = buckets.iter().map(|op| c.answer(op)).collect();
    let Step::Do(blocks) = g.advance(&mut (), Instant::now(), &answers).unwrap() else {
        panic!("then the candidate blocks")
    };
    // Now the remove, and the old blocks' memory reused by another key.
    let done = Running::remove(&c, b"k", 8).run(&mut c).unwrap();
    assert_eq!(done.replaced.len(), 2);
    for &(node, at, _) in &done.replaced {
        let other = encode_block(
            b"q",
            b"someone else's",
            Version { seq: 1, writer: 9 },
            Kind::Value,
        )
        .unwrap();
        c.regions[&node].bytes()[at as usize..at as usize + other.len()].copy_from_slice(&other);
    }
    let answers: Vec<Answer> = blocks.iter().map(|op| c.answer(op)).collect();
    assert_eq!(
        g.advance(&mut (), Instant::now(), &answers).unwrap(),
        Step::Done(None)
    );
    assert_eq!(
        c.get(b"k").unwrap(),
        None,
        "and a later get sees the tombstone"
    );
}

/// Runs a hinted get on the cluster: the value (a tombstone is None), and how many rounds
/// of reads it took.
fn hinted_get(c: &Cluster, key: &[u8], hints: &[(u32, u64)]) -> (Option<Vec<u8>>, usize) {
    let mut g = Get::hinted(key, &c.replicas, hints);
    let mut answers: Vec<Answer> = Vec::new();
    let mut rounds = 0;
    loop {
        match g.advance(&mut (), Instant::now(), &answers).unwrap() {
            Step::Do(ops) => {
                rounds += 1;
                answers = ops.iter().map(|op| c.answer(op)).collect();
            }
            Step::Done(None) => return (None, rounds),
            Step::Done(Some((_, f))) if f.block.tombstone => return (None, rounds),
            Step::Done(Some((at, f))) => {
                let b = match at {
                    Src::Read(i) => answers[i].bytes().unwrap().to_vec(),
                    Src::Early(e) => g.take_early(e),
                };
                return (Some(b[f.block.value].to_vec()), rounds);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_get_hinted_where_the_key_still_is_takes_one_round_and_a_stale_hint_two() {
    use super::super::sim::Running;
    let mut c = Cluster::new(&[1, 2]);
    let first = Running::put(&c, b"k", b"first", 7).run(&mut c).unwrap();
    assert_eq!(first.installed.len(), 2, "the slot words of both replicas");
    let (got, rounds) = hinted_get(&c, b"k", &first.installed);
    assert_eq!((got.as_deref(), rounds), (Some(&b"first"[..]), 1));
    // Without hints, two rounds; after an overwrite, the old hints are stale: two rounds,
    // and the new value.
    assert_eq!(hinted_get(&c, b"k", &[]).1, 2);
    let second = Running::put(&c, b"k", b"second", 8).run(&mut c).unwrap();
    let (got, rounds) = hinted_get(&c, b"k", &first.installed);
    assert_eq!((got.as_deref(), rounds), (Some(&b"second"[..]), 2));
    // A hint on one replica only: the other's block is read in a second round.
    let (got, rounds) = hinted_get(&c, b"k", &second.installed[..1]);
    assert_eq!((got.as_deref(), rounds), (Some(&b"second"[..]), 2));
    // Hints for another node, or naming memory outside the data area, are ignored.
    let (got, _) = hinted_get(&c, b"k", &[(9, second.installed[0].1), (1, 5)]);
    assert_eq!(got.as_deref(), Some(&b"second"[..]));
    // The old block's memory reused for another key (the grace period passed): a hint to it
    // is verified like any read, never taken for the key.
    for &(node, at, _) in &second.replaced {
        let other = encode_block(b"q", b"someone else", v(1, 9), Kind::Value).unwrap();
        c.regions[&node].bytes()[at as usize..at as usize + other.len()].copy_from_slice(&other);
    }
    let (got, _) = hinted_get(&c, b"k", &first.installed);
    assert_eq!(got.as_deref(), Some(&b"second"[..]));
    // After a remove, the hints of the value find the tombstone.
    let gone = Running::remove(&c, b"k", 9).run(&mut c).unwrap();
    assert_eq!(hinted_get(&c, b"k", &second.installed).0, None);
    assert_eq!(hinted_get(&c, b"k", &gone.installed), (None, 1));
}
