use super::*;
use rdmapool_pool::remote::sim::SimRegion;
use rdmapool_pool::remote::step::{drive_sim, Op};

fn layout() -> Layout {
    Layout::new(8 << 20, 1 << 20, 16).unwrap()
}

/// Runs machines in the order `turns` gives (each turn one operation of one machine).
fn run(region: &SimRegion, machines: &mut [FindRoot], turns: &[usize]) -> Vec<Index> {
    let mut answers: Vec<Vec<Answer>> = vec![Vec::new(); machines.len()];
    let now = Instant::now();
    let mut done: Vec<Option<Index>> = vec![None; machines.len()];
    let mut order = turns.iter().copied().chain((0..machines.len()).cycle());
    while done.iter().any(Option::is_none) {
        let m = order.next().unwrap_or(0) % machines.len();
        if done[m].is_some() {
            continue;
        }
        match machines[m]
            .advance(&mut (), now, &answers[m])
            .unwrap()
            .listed()
        {
            Step::Do(ops) => answers[m] = ops.iter().map(|op| region.apply(&op.io)).collect(),
            Step::Done(ix) => done[m] = Some(ix),
            other => panic!("{other:?}"),
        }
    }
    done.into_iter().map(Option::unwrap).collect()
}

#[test]
fn racing_clients_end_with_one_index_and_the_loser_gives_its_chunk_back() {
    let l = layout();
    // Every interleaving of two machines' first steps (the race is at the publish).
    for turns in [
        vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1],
        vec![0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        vec![1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
    ] {
        let region = SimRegion::new(l, 1);
        region.store(l.table_entry(0), 77); // a pool client holds chunk 0
        let mut m = [FindRoot::new(1, l, 5), FindRoot::new(1, l, 9)];
        let got = run(&region, &mut m, &turns);
        assert_eq!(got[0], got[1], "{turns:?}");
        let ix = got[0];
        assert_ne!(ix.chunk, 0, "a pool client's chunk is never taken");
        assert_eq!(region.load(ROOT_WORD), DURABLE_TAG | ix.chunk);
        assert_eq!(
            region.load(l.chunk(ix.chunk)),
            u64::from_le_bytes(INDEX_MAGIC)
        );
        let store_entries: Vec<u64> = (0..l.chunk_count)
            .map(|j| region.load(l.table_entry(j)))
            .filter(|e| e & DURABLE_TAG != 0)
            .collect();
        assert_eq!(store_entries.len(), 1, "{turns:?}: {store_entries:x?}");
        assert_eq!(ix.buckets, ((1 << 20) - 64) / 64);
        assert_eq!(ix.bucket(ix.buckets), ix.bucket(0));
    }
}

#[test]
fn a_client_finds_an_index_that_exists_and_refuses_a_damaged_root() {
    let l = layout();
    let mut m = FindRoot::new(1, l, 5);
    assert!(matches!(
        m.step(None),
        Ok(Step::One(Op {
            node: 1,
            io: Io::Read { at: ROOT_WORD, .. }
        }))
    ));
    assert_eq!(
        m.step(Some(&Answer::Word(DURABLE_TAG | 3))).unwrap(),
        Step::Done(Index::new(&l, 3))
    );
    for bad in [3, DURABLE_TAG | l.chunk_count] {
        let mut m = FindRoot::new(1, l, 5);
        m.step(None).unwrap();
        assert!(matches!(
            m.step(Some(&Answer::Bytes(bad.to_le_bytes().to_vec()))),
            Err(Error::Core(CoreError::Malformed {
                what: "store root word",
                ..
            }))
        ));
    }
}

#[test]
fn a_node_without_a_free_chunk_is_exhausted_typed() {
    let l = layout();
    let mut m = FindRoot::new(1, l, 5);
    m.step(None).unwrap();
    let mut step = m.step(Some(&Answer::Word(0)));
    for _ in 0..l.chunk_count {
        assert!(matches!(
            &step,
            Ok(Step::One(Op {
                io: Io::Cas { .. },
                ..
            }))
        ));
        step = m.step(Some(&Answer::Word(42)));
    }
    assert!(matches!(step, Err(Error::RemoteExhausted { .. })));
}

/// Runs one machine to its end.
fn run_one(region: &SimRegion, m: &mut FindRoot) -> Index {
    let mut clock = Instant::now();
    drive_sim(m, &mut (), &mut clock, |op| region.apply(&op.io)).unwrap()
}

#[test]
fn a_tenant_finds_its_own_index_among_its_store_chunks_and_never_anothers() {
    let l = layout();
    let magic = u64::from_le_bytes(INDEX_MAGIC);
    let region = SimRegion::new(l, 1);
    // Tenant 9 has no index yet; tenant 8's index is chunk 2, a data chunk of 9's is 3.
    region.store(l.table_entry(2), DURABLE_TAG | 8);
    region.store(l.chunk(2), magic);
    region.store(l.table_entry(3), DURABLE_TAG | 9);
    region.store(l.chunk(3), rdmapool_pool::remote::layout::CHUNK_MAGIC);
    let made = run_one(&region, &mut FindRoot::tenant(1, l, 9));
    assert_ne!(made.chunk, 2, "another tenant's index");
    assert_ne!(made.chunk, 3, "its own data chunk");
    assert_eq!(region.load(l.table_entry(made.chunk)), DURABLE_TAG | 9);
    assert_eq!(region.load(l.chunk(made.chunk)), magic);
    assert_eq!(region.load(ROOT_WORD), 0, "the root word is the server's");
    // Found again by a later run (a restart), without claiming anything.
    let before = region.bytes().clone();
    assert_eq!(run_one(&region, &mut FindRoot::tenant(1, l, 9)), made);
    assert!(*region.bytes() == before, "a second run changed the region");
    // Tenant 8 finds its own.
    assert_eq!(run_one(&region, &mut FindRoot::tenant(1, l, 8)).chunk, 2);
}
