//! Evicting a key by clearing its slots (docs/STORE.md section 12), as a state machine
//! without I/O: look the key up on every replica (its buckets, then its candidate blocks),
//! and only if every replica names the sampled version, swap each replica's slot from that
//! word to 0, every replica at once. Ends with the blocks of the slots it cleared, to be
//! retired (freed after the grace period). A key read since it was sampled (a replica's
//! block has a newer access time or more reads than the sample saw) is left alone: a
//! client's eviction pool holds candidates for a while, and their ranks go stale.
//!
//! A put racing it finds its slot changed (its swap is lost) and looks the key up again; it
//! then writes above whatever a replica still holds, so a replica whose clear failed keeps
//! a version no older than the one sampled, and no put is overtaken
//! (`a_put_racing_an_eviction_is_never_overtaken`, below).

use crate::format::{peek, KeyHash, Version};
use crate::lookup::{read_ops, replies, Looked, Lookup, Read, Replica};
use rdmapool_pool::remote::step::{Answer, Io, Machine, Op, Step};
use rdmapool_pool::Result;
use std::time::Instant;

/// A block a [`Clear`] took out of its slot: node, incarnation, offset, and the bytes the
/// slot named ([`named_bytes`](crate::format::named_bytes) of its word).
pub(crate) type ClearedBlock = (u32, u64, u64, u64);

/// One key's eviction by clearing (see the module's text).
#[derive(Debug, Clone)]
pub(crate) struct Clear {
    key: Vec<u8>,
    version: Version,
    /// The access time and count the sample saw: a block read since is kept.
    sampled_access: Option<(u64, u64)>,
    replicas: Vec<Replica>,
    state: State,
}

#[derive(Debug, Clone)]
enum State {
    Start,
    Buckets(Lookup),
    Blocks(Lookup),
    Swaps(Vec<(usize, u64)>),
    Done,
}

impl Clear {
    /// The eviction of `key` at `version` (the version sampled) on its `replicas`.
    pub(crate) fn new(key: &[u8], version: Version, replicas: &[Replica]) -> Self {
        Self {
            key: key.to_vec(),
            version,
            sampled_access: None,
            replicas: replicas.to_vec(),
            state: State::Start,
        }
    }

    /// The same eviction, only of blocks not read since the sample saw them read last at
    /// `accessed_us`, `accesses` times.
    pub(crate) fn unless_read_since(mut self, accessed_us: u64, accesses: u64) -> Self {
        self.sampled_access = Some((accessed_us, accesses));
        self
    }

    /// Whether a block of the version found was read since the sample.
    fn read_since(&self, lookup: &Lookup, looked: &Looked, answers: &[Answer]) -> bool {
        let Some((at, count)) = self.sampled_access else {
            return false;
        };
        let replies = replies(answers);
        looked
            .found
            .iter()
            .zip(&looked.found_at)
            .filter(|(f, _)| f.block.version == self.version)
            .filter_map(|(_, &src)| lookup.bytes(src, &replies).and_then(peek))
            .any(|p| p.accessed_us > at || p.accesses > count)
    }

    fn ask(reads: &[Read]) -> Step<Vec<ClearedBlock>> {
        Step::Do(read_ops(reads))
    }
}

impl Machine for Clear {
    type Output = Vec<ClearedBlock>;
    type Context = ();

    fn advance(
        &mut self,
        _: &mut (),
        _now: Instant,
        answers: &[Answer],
    ) -> Result<Step<Self::Output>> {
        let nothing = || Ok(Step::Done(Vec::new()));
        match std::mem::replace(&mut self.state, State::Done) {
            State::Start => {
                let lookup = Lookup::new(&self.key, &self.replicas);
                let step = Self::ask(&lookup.bucket_reads());
                self.state = State::Buckets(lookup);
                Ok(step)
            }
            State::Buckets(mut lookup) => {
                let reads = lookup.on_buckets(&replies(answers));
                self.state = State::Blocks(lookup);
                Ok(Self::ask(&reads))
            }
            State::Blocks(lookup) => {
                let looked = lookup.on_blocks(&replies(answers));
                if looked.unread
                    || looked.newest() != Some(self.version)
                    || self.read_since(&lookup, &looked, answers)
                {
                    return nothing();
                }
                let h = KeyHash::of(&self.key);
                let mut ops = Vec::with_capacity(self.replicas.len());
                let mut swaps = Vec::with_capacity(self.replicas.len());
                for (i, (r, held)) in self.replicas.iter().zip(&looked.held).enumerate() {
                    // Every replica must name the version: else another put or a repair
                    // is under way, and the key is left for a later eviction.
                    let Some((pos, word, version)) = held.current else {
                        return nothing();
                    };
                    if version != self.version {
                        return nothing();
                    }
                    ops.push(Op {
                        node: r.node,
                        io: Io::Cas {
                            at: r.bucket_at(h) + pos as u64 * 8,
                            expected: word,
                            swap: 0,
                        },
                    });
                    swaps.push((i, word));
                }
                self.state = State::Swaps(swaps);
                Ok(Step::Do(ops))
            }
            State::Swaps(swaps) => {
                let cleared = swaps
                    .iter()
                    .zip(answers)
                    .filter(|((_, word), a)| **a == Answer::Word(*word))
                    .filter_map(|(&(i, word), _)| {
                        let r = &self.replicas[i];
                        crate::format::Slot::from_word(word).map(|s| {
                            let bytes = crate::format::named_bytes(word);
                            (r.node, r.incarnation, s.offset, bytes)
                        })
                    })
                    .collect();
                Ok(Step::Done(cleared))
            }
            State::Done => nothing(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Cluster, Race, Reading, Running};
    use proptest::prelude::*;

    /// An eviction in progress in the simulation, its operations performed one at a time.
    struct Clearing<'a> {
        clear: &'a mut Clear,
        step: Option<Step<Vec<ClearedBlock>>>,
        answers: Vec<Answer>,
        cleared: Option<Vec<ClearedBlock>>,
    }

    impl<'a> Clearing<'a> {
        fn new(clear: &'a mut Clear) -> Self {
            let step = Some(clear.advance(&mut (), Instant::now(), &[]).unwrap());
            Self {
                clear,
                step,
                answers: Vec::new(),
                cleared: None,
            }
        }

        fn finished(&self) -> bool {
            self.cleared.is_some()
        }

        /// Performs the pending step's next operation alone (or takes the machine's end),
        /// and advances the machine once all of them are answered.
        fn step_op(&mut self, c: &mut Cluster) {
            match self.step.take() {
                None => {}
                Some(Step::Done(out)) => self.cleared = Some(out),
                Some(Step::Do(ops)) => {
                    if let Some(op) = ops.get(self.answers.len()) {
                        self.answers.push(c.answer(op));
                    }
                    self.step = Some(if self.answers.len() >= ops.len() {
                        let answers = std::mem::take(&mut self.answers);
                        self.clear
                            .advance(&mut (), Instant::now(), &answers)
                            .unwrap()
                    } else {
                        Step::Do(ops)
                    });
                }
                Some(other) => panic!(
                    "an eviction asks only for lists: {:?}",
                    std::mem::discriminant(&other)
                ),
            }
        }
    }

    /// Runs `clear` op by op beside `puts`, in the order `order` picks.
    fn interleave(
        c: &mut Cluster,
        clear: &mut Clear,
        puts: &mut [Running],
        order: Vec<usize>,
    ) -> Vec<ClearedBlock> {
        let mut clearing = Clearing::new(clear);
        let n = puts.len() + 1;
        let mut turns = order.into_iter();
        loop {
            if clearing.finished() && puts.iter().all(Running::finished) {
                break;
            }
            let live = |k: usize| {
                if k == puts.len() {
                    !clearing.finished()
                } else {
                    !puts[k].finished()
                }
            };
            let w = turns.next().unwrap_or(0) % n;
            let w = (w..w + n).map(|k| k % n).find(|&k| live(k)).unwrap();
            if w < puts.len() {
                puts[w].step_op(c);
            } else {
                clearing.step_op(c);
            }
        }
        clearing.cleared.unwrap()
    }

    #[test]
    fn an_eviction_alone_clears_every_replica_and_the_key_is_a_miss() {
        let mut c = Cluster::new(&[1, 2, 3]);
        c.replicas.truncate(2);
        let planted = Running::put(&c, b"k", b"cold", 7).run(&mut c).unwrap();
        let mut clear = Clear::new(b"k", planted.version.unwrap(), &c.replicas.clone());
        let cleared = interleave(&mut c, &mut clear, &mut [], Vec::new());
        assert_eq!(cleared.len(), 2);
        for node in 1..=2u32 {
            c.down = (1..=3).filter(|&n| n != node).collect();
            assert_eq!(c.get(b"k").unwrap(), None, "node {node} alone");
        }
        // An eviction of an older version than the newest clears nothing.
        c.down.clear();
        let newer = Running::put(&c, b"k", b"new", 7).run(&mut c).unwrap();
        let mut stale = Clear::new(
            b"k",
            Version {
                seq: newer.version.unwrap().seq - 1,
                writer: 7,
            },
            &c.replicas.clone(),
        );
        assert!(interleave(&mut c, &mut stale, &mut [], Vec::new()).is_empty());
        assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    }

    #[test]
    fn a_key_read_since_it_was_sampled_is_kept() {
        let mut c = Cluster::new(&[1, 2, 3]);
        c.replicas.truncate(2);
        let planted = Running::put(&c, b"k", b"hot", 7).run(&mut c).unwrap();
        let version = planted.version.unwrap();
        // Sampled with an access time of 1000 us and no reads counted; then a reader
        // stamps one replica's block at 2000 us (what a get's access note WRITEs).
        let (node, word) = planted.installed[1];
        let block = crate::format::Slot::from_word(word).unwrap().offset;
        let stamp = Op {
            node,
            io: Io::Write {
                at: block + crate::format::ACCESSED_AT,
                bytes: 2000u64.to_le_bytes().to_vec(),
            },
        };
        c.perform(&stamp, &[]);
        let replicas = c.replicas.clone();
        let mut sampled = Clear::new(b"k", version, &replicas).unless_read_since(1000, 0);
        assert!(interleave(&mut c, &mut sampled, &mut [], Vec::new()).is_empty());
        assert_eq!(c.get(b"k").unwrap().as_deref(), Some(&b"hot"[..]));
        // Sampled after that read, it goes.
        let mut sampled = Clear::new(b"k", version, &replicas).unless_read_since(2000, 0);
        assert_eq!(
            interleave(&mut c, &mut sampled, &mut [], Vec::new()).len(),
            2
        );
        assert_eq!(c.get(b"k").unwrap(), None);
    }

    proptest! {

        /// A get racing an eviction and one or two puts of the key (r = 2 or 3, hinted or
        /// not), started at any point, every machine's operations interleaved one at a
        /// time: it returns the planted value, a racing put's value, or nothing; never
        /// nothing or the planted value once a put was acknowledged before it began, and
        /// never the evicted value once the eviction cleared a slot before it began.
        #[test]
        fn a_get_racing_an_eviction_and_puts_never_returns_what_they_replaced(
            order in proptest::collection::vec(0usize..4, 1..600),
            get_at in 0usize..60,
            writers in 1usize..3,
            hinted: bool,
            r in 2usize..4,
        ) {
            let mut race = Race::new(r, writers, hinted);
            let planted = race.planted.version.unwrap();
            let replicas = race.c.replicas.clone();
            let mut clear = Clear::new(b"k", planted, &replicas);
            let mut clearing = Clearing::new(&mut clear);
            let mut get: Option<Reading> = None;
            // At the get's start: whether a racing put was acknowledged, and whether the
            // eviction had cleared a slot.
            let mut before_get = (false, false);
            let p = race.puts.len();
            let mut turns = order.into_iter();
            for turn in 0.. {
                if get.is_none() && turn >= get_at {
                    let acked = race
                        .puts
                        .iter()
                        .any(|r| r.outcome.as_ref().is_some_and(|o| o.is_ok()));
                    let evicted = clearing.cleared.as_ref().is_some_and(|c| !c.is_empty());
                    before_get = (acked, evicted);
                    get = Some(Reading::new(&race.c, b"k"));
                }
                let live = |k: usize| match k {
                    k if k < p => !race.puts[k].finished(),
                    k if k == p => !clearing.finished(),
                    _ => get.as_ref().is_some_and(|g| !g.finished()),
                };
                let n = p + 2;
                let w = turns.next().unwrap_or(0) % n;
                let Some(w) = (w..w + n).map(|k| k % n).find(|&k| live(k)) else {
                    if get.is_some() {
                        break;
                    }
                    continue;
                };
                if w < p {
                    race.puts[w].step_op(&mut race.c);
                } else if w == p {
                    clearing.step_op(&mut race.c);
                } else if let Some(g) = get.as_mut() {
                    g.step_op(&mut race.c);
                }
            }
            let got = get.unwrap().outcome.unwrap().unwrap();
            let (acked, evicted) = before_get;
            let planted_value: &[u8] = b"planted";
            match &got {
                Some(v) => prop_assert!(
                    v == planted_value || race.values.contains(v),
                    "a value no put wrote: {:?}",
                    v
                ),
                // An acknowledged put is never lost to an eviction of the older version.
                None => prop_assert!(!acked, "nothing, after a put was acknowledged"),
            }
            let planted_back = got.as_deref() == Some(planted_value);
            prop_assert!(!(acked && planted_back), "the planted value, after a put was acknowledged");
            prop_assert!(!(evicted && planted_back), "the evicted value, after its eviction cleared a slot");
        }

        /// An eviction by clearing racing one or two puts of the key (hinted or not, r = 2
        /// or 3), their operations interleaved one at a time in any order: every put ends
        /// with a version, and every replica, read alone, ends with the highest put's
        /// value: never the evicted value, never nothing.
        #[test]
        fn a_put_racing_an_eviction_is_never_overtaken(
            order in proptest::collection::vec(0usize..3, 1..600),
            writers in 1usize..3,
            hinted: bool,
            r in 2usize..4,
        ) {
            let mut race = Race::new(r, writers, hinted);
            let replicas = race.c.replicas.clone();
            let mut clear = Clear::new(b"k", race.planted.version.unwrap(), &replicas);
            interleave(&mut race.c, &mut clear, &mut race.puts, order);
            let (winner, _) = race.winner();
            for (node, got) in race.alone(r).into_iter().enumerate() {
                prop_assert_eq!(got, Some(winner.clone()), "node {} alone", node + 1);
            }
        }
    }
}
