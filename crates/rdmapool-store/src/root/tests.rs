use super::*;
use std::collections::HashMap;

/// A region as words, one operation at a time (as the pool's simulation has it).
struct Words {
    words: HashMap<u64, u64>,
}

impl Words {
    fn apply(&mut self, io: &Io) -> Answer {
        match io {
            Io::Cas { at, expected, swap } => {
                let w = self.words.entry(*at).or_insert(0);
                let old = *w;
                if old == *expected {
                    *w = *swap;
                }
                Answer::Word(old)
            }
            Io::Read { at, words: 1 } => Answer::Word(*self.words.get(at).unwrap_or(&0)),
            Io::Read { at, words } => Answer::Words(
                (0..*words as u64)
                    .map(|i| *self.words.get(&(at + 8 * i)).unwrap_or(&0))
                    .collect(),
            ),
            Io::Write { at, bytes } => {
                for (i, w) in bytes.chunks(8).enumerate() {
                    let mut b = [0u8; 8];
                    b[..w.len()].copy_from_slice(w);
                    self.words.insert(at + 8 * i as u64, u64::from_le_bytes(b));
                }
                Answer::Written
            }
        }
    }
}

fn layout() -> Layout {
    Layout::new(8 << 20, 1 << 20, 16).unwrap()
}

/// Runs machines in the order `turns` gives (each turn one operation of one machine).
fn run(region: &mut Words, machines: &mut [FindRoot], turns: &[usize]) -> Vec<Index> {
    let mut answers: Vec<Option<Answer>> = vec![None; machines.len()];
    let mut done: Vec<Option<Index>> = vec![None; machines.len()];
    let mut order = turns.iter().copied().chain((0..machines.len()).cycle());
    while done.iter().any(Option::is_none) {
        let m = order.next().unwrap_or(0) % machines.len();
        if done[m].is_some() {
            continue;
        }
        match machines[m].advance(answers[m].take()).unwrap() {
            RootStep::Io(io) => answers[m] = Some(region.apply(&io)),
            RootStep::Done(ix) => done[m] = Some(ix),
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
        let mut region = Words {
            words: HashMap::from([(l.table_entry(0), 77)]), // a pool client holds chunk 0
        };
        let mut m = [FindRoot::new(l, 5), FindRoot::new(l, 9)];
        let got = run(&mut region, &mut m, &turns);
        assert_eq!(got[0], got[1], "{turns:?}");
        let ix = got[0];
        assert_ne!(ix.chunk, 0, "a pool client's chunk is never taken");
        assert_eq!(region.words[&ROOT_WORD], DURABLE_TAG | ix.chunk);
        assert_eq!(
            region.words[&l.chunk(ix.chunk)],
            u64::from_le_bytes(INDEX_MAGIC)
        );
        let store_entries: Vec<u64> = (0..l.chunk_count)
            .map(|j| *region.words.get(&l.table_entry(j)).unwrap_or(&0))
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
    let mut m = FindRoot::new(l, 5);
    assert!(matches!(
        m.advance(None),
        Ok(RootStep::Io(Io::Read { at: ROOT_WORD, .. }))
    ));
    assert_eq!(
        m.advance(Some(Answer::Word(DURABLE_TAG | 3))).unwrap(),
        RootStep::Done(Index::new(&l, 3))
    );
    for bad in [3, DURABLE_TAG | l.chunk_count] {
        let mut m = FindRoot::new(l, 5);
        m.advance(None).unwrap();
        assert!(matches!(
            m.advance(Some(Answer::Word(bad))),
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
    let mut m = FindRoot::new(l, 5);
    m.advance(None).unwrap();
    let mut step = m.advance(Some(Answer::Word(0)));
    for _ in 0..l.chunk_count {
        assert!(matches!(step, Ok(RootStep::Io(Io::Cas { .. }))));
        step = m.advance(Some(Answer::Word(42)));
    }
    assert!(matches!(step, Err(Error::RemoteExhausted { .. })));
}

/// Runs one machine to its end.
fn run_one(region: &mut Words, m: &mut FindRoot) -> Index {
    run(region, std::slice::from_mut(m), &[])[0]
}

#[test]
fn a_tenant_finds_its_own_index_among_its_store_chunks_and_never_anothers() {
    let l = layout();
    let magic = u64::from_le_bytes(INDEX_MAGIC);
    let mut region = Words {
        words: HashMap::new(),
    };
    // Tenant 9 has no index yet; tenant 8's index is chunk 2, a data chunk of 9's is 3.
    region.words.insert(l.table_entry(2), DURABLE_TAG | 8);
    region.words.insert(l.chunk(2), magic);
    region.words.insert(l.table_entry(3), DURABLE_TAG | 9);
    region
        .words
        .insert(l.chunk(3), rdmapool_pool::remote::layout::CHUNK_MAGIC);
    let made = run_one(&mut region, &mut FindRoot::tenant(l, 9));
    assert_ne!(made.chunk, 2, "another tenant's index");
    assert_ne!(made.chunk, 3, "its own data chunk");
    assert_eq!(region.words[&l.table_entry(made.chunk)], DURABLE_TAG | 9);
    assert_eq!(region.words[&l.chunk(made.chunk)], magic);
    assert_eq!(
        region.words.get(&ROOT_WORD),
        None,
        "the root word is the server's"
    );
    // Found again by a later run (a restart), without claiming anything.
    let entries = region.words.len();
    assert_eq!(run_one(&mut region, &mut FindRoot::tenant(l, 9)), made);
    assert_eq!(region.words.len(), entries);
    // Tenant 8 finds its own.
    assert_eq!(run_one(&mut region, &mut FindRoot::tenant(l, 8)).chunk, 2);
}
