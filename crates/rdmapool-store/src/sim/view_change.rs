//! The view change and its fence in the simulated cluster (docs/STORE.md section 4, issue
//! #40): a writer that places a key by view 1 puts or removes it while a changer installs
//! view 2 on the servers one at a time and then repairs the key onto view 2's placement;
//! the writer reads its replicas' fence words after its swaps (as `Store` does) and,
//! finding a newer view, makes the put anew under it with a version above the one it
//! published and the newest on either placement (a writer may also know view 2 from the
//! start). Every interleaving of the writer's steps with the changer's ends with the
//! acknowledged put's value (none after a remove) read under view 2, and under both
//! placements while the key moves.

use super::{Cluster, Repairing, Running};
use crate::format::{Block, Kind, ValueDigest, Version};
use crate::get::Get;
use crate::lookup::{Replica, Src};
use crate::put::Put;
use crate::view::VIEW_AT;
use proptest::prelude::*;
use rdmapool_pool::remote::step::{Answer, Machine, Step};
use std::time::Instant;

const KEY: &[u8] = b"moving key";
const OLD: [u32; 2] = [1, 2];
const NEW: [u32; 2] = [3, 4];

fn fence(c: &Cluster, node: u32) -> u64 {
    c.regions[&node].load(VIEW_AT)
}

fn set_fence(c: &mut Cluster, node: u32, number: u64) {
    c.regions[&node].store(VIEW_AT, number);
}

fn replicas(c: &Cluster, nodes: &[u32]) -> Vec<Replica> {
    nodes.iter().map(|&n| c.replica(n)).collect()
}

/// A get of `KEY` over `nodes`: the newest block found (a tombstone too) and its value.
fn read(c: &Cluster, nodes: &[u32]) -> Option<(Block, Vec<u8>)> {
    let rs = replicas(c, nodes);
    let mut g = Get::new(KEY, &rs);
    let mut answers: Vec<Answer> = Vec::new();
    loop {
        match g
            .advance(&mut (), Instant::now(), &answers)
            .unwrap()
            .listed()
        {
            Step::Do(ops) => answers = ops.iter().map(|op| c.answer(op)).collect(),
            Step::One(_) | Step::Sleep(_) | Step::Wait => answers.clear(),
            Step::Done(None) => return None,
            Step::Done(Some((at, f))) => {
                let b = match at {
                    Src::Read(i) => answers[i].bytes().unwrap().to_vec(),
                    Src::Early(e) => g.take_early(e),
                };
                let value = b[f.block.value.clone()].to_vec();
                return Some((f.block, value));
            }
        }
    }
}

/// A get of `KEY` over `nodes` (a tombstone: none).
fn get(c: &Cluster, nodes: &[u32]) -> Option<Vec<u8>> {
    read(c, nodes).and_then(|(block, value)| (!block.tombstone).then_some(value))
}

/// The newest version of `KEY` over `nodes`, and whether it is a tombstone (a put's
/// floor while keys move, as `Store::newest_anywhere` finds it).
fn newest(c: &Cluster, nodes: &[u32]) -> Option<(Version, bool)> {
    read(c, nodes).map(|(block, _)| (block.version, block.tombstone))
}

/// The writer: its put (or remove) under the view it believes, the fence check after it,
/// and the put anew under view 2 when the check finds it. Under view 2 (keys moving) its
/// version also beats the newest on either placement, as `Store`'s does.
struct Writer {
    running: Running,
    kind: Kind,
    view: u64,
    /// Its put, once acknowledged.
    acknowledged: bool,
    fenced: bool,
}

impl Writer {
    /// A writer of `value` (`Kind::Tombstone`: a remove) that places the key by view 2
    /// from the start when `knows_new`, else by view 1.
    fn start(c: &Cluster, value: &[u8], kind: Kind, knows_new: bool) -> Self {
        let (view, running) = if knows_new {
            (2, Self::under_new(c, value, kind, None))
        } else {
            let put = Put::new(KEY, ValueDigest::of(value), kind, 7, &replicas(c, &OLD)).unwrap();
            (1, Running::start(put, value))
        };
        Self {
            running,
            kind,
            view,
            acknowledged: false,
            fenced: false,
        }
    }

    /// The put under view 2 while keys move: above `own` (its version under view 1, if
    /// it published one) and the newest on either placement.
    fn under_new(c: &Cluster, value: &[u8], kind: Kind, own: Option<Version>) -> Running {
        let (mut floor, mut removed) = (own, false);
        if let Some((v, tombstone)) = newest(c, &[NEW, OLD].concat()) {
            if floor.is_none_or(|f| v > f) {
                floor = Some(v);
                removed = tombstone && own.is_none();
            }
        }
        let put = Put::new(KEY, ValueDigest::of(value), kind, 7, &replicas(c, &NEW))
            .unwrap()
            .at_least(floor, removed);
        Running::start(put, value)
    }

    fn done(&self) -> bool {
        self.acknowledged
    }

    fn step(&mut self, c: &mut Cluster, value: &[u8]) {
        if self.acknowledged {
            return;
        }
        if !self.running.finished() {
            self.running.step(c);
            return;
        }
        let done = self.running.outcome.take().unwrap().unwrap();
        let placed = if self.view == 1 { OLD } else { NEW };
        if placed.iter().all(|&n| fence(c, n) <= self.view) {
            self.acknowledged = true;
            return;
        }
        // Made under an old view: not acknowledged; anew under view 2, above its version.
        self.fenced = true;
        self.view = 2;
        self.running = Self::under_new(c, value, self.kind, done.version);
    }
}

/// The changer: view 2's fence on each server in turn, then the repair of the key onto
/// view 2's placement, keeping the newest on either placement.
struct Changer {
    installed: usize,
    repair: Option<Repairing>,
}

impl Changer {
    fn done(&self) -> bool {
        self.repair.as_ref().is_some_and(Repairing::finished)
    }

    fn step(&mut self, c: &mut Cluster) {
        if self.installed < 4 {
            self.installed += 1;
            set_fence(c, self.installed as u32, 2);
            return;
        }
        let all = [1, 2, 3, 4];
        let readable = [NEW, OLD].concat();
        self.repair
            .get_or_insert_with(|| Repairing::moving(KEY, &all, &NEW, &readable))
            .step(c);
    }
}

proptest! {
    #[test]
    fn no_put_acknowledged_under_an_old_view_is_lost_by_a_view_change(
        turns in proptest::collection::vec(any::<bool>(), 1..120),
        remove in any::<bool>(),
        knows_new in any::<bool>(),
    ) {
        let mut c = Cluster::new(&[1, 2, 3, 4]);
        for n in [1, 2, 3, 4] {
            set_fence(&mut c, n, 1);
        }
        // The key as view 1 holds it before.
        for n in OLD {
            c.plant(n, KEY, b"before", Version { seq: 1, writer: 9 });
        }
        // A put of `value`, or a remove (whose acknowledged result is no value).
        let (kind, value, expected): (Kind, &[u8], Option<&[u8]>) = if remove {
            (Kind::Tombstone, b"", None)
        } else {
            (Kind::Value, b"the writer's", Some(b"the writer's"))
        };
        let mut w = Writer::start(&c, value, kind, knows_new);
        let mut ch = Changer { installed: 0, repair: None };
        let mut turns = turns.into_iter();
        while !(w.done() && ch.done()) {
            let writer_turn = match turns.next() {
                Some(t) => t,
                None => !w.done(),
            };
            if (writer_turn && !w.done()) || ch.done() {
                w.step(&mut c, value);
            } else {
                ch.step(&mut c);
            }
            // While the key moves, a get over both placements reads the acknowledged value
            // (none after a remove).
            if w.done() && !ch.done() {
                let both = get(&c, &[NEW, OLD].concat());
                prop_assert_eq!(both.as_deref(), expected);
            }
        }
        // View 2 in force and the key moved: a get over its placement reads the value.
        let moved = get(&c, &NEW);
        prop_assert_eq!(moved.as_deref(), expected, "fenced: {}", w.fenced);
    }
}

#[test]
fn without_the_fence_an_acknowledged_put_is_lost() {
    // The writer's swaps land after the changer's repair scanned: acknowledged without a
    // fence check, its value is on view 1's placement only, which view 2 does not read.
    let mut c = Cluster::new(&[1, 2, 3, 4]);
    for n in OLD {
        c.plant(n, KEY, b"before", Version { seq: 1, writer: 9 });
    }
    let all = [1, 2, 3, 4];
    let readable = [NEW, OLD].concat();
    Repairing::moving(KEY, &all, &NEW, &readable).run(&mut c);
    let put = Put::new(
        KEY,
        ValueDigest::of(b"late"),
        Kind::Value,
        7,
        &replicas(&c, &OLD),
    )
    .unwrap();
    Running::start(put, b"late").run(&mut c).unwrap();
    assert_eq!(
        get(&c, &NEW).as_deref(),
        Some(&b"before"[..]),
        "the late put is not there"
    );
}
