//! Every interleaving (up to loom's bounds) of the slot table's races:
//! `RUSTFLAGS="--cfg loom" cargo test -p rdmapool-pool --release --lib cq::engine::slots`.

use super::*;
use crate::fabric::WcOpcode;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::task::Wake;

/// A holder with queue credits taken like a QP's (a failed take is only a load).
struct Owner {
    credits: AtomicU32,
    given: AtomicUsize,
}

impl Owner {
    fn new(credits: u32) -> Arc<Self> {
        Arc::new(Self {
            credits: AtomicU32::new(credits),
            given: AtomicUsize::new(0),
        })
    }

    fn take(&self, n: u32) -> bool {
        self.credits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(n))
            .is_ok()
    }
}

impl Holder for Owner {
    type Lease = u32;
    fn give_back(&self, n: u32) {
        self.given.fetch_add(n as usize, Ordering::SeqCst);
        self.credits.fetch_add(n, Ordering::AcqRel);
    }
}

/// A waker that counts its wake-ups.
struct Flag(AtomicUsize);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn waker() -> (Arc<Flag>, Waker) {
    let f = Arc::new(Flag(AtomicUsize::new(0)));
    (f.clone(), Waker::from(f))
}

fn woken(f: &Flag) -> bool {
    f.0.load(Ordering::SeqCst) > 0
}

/// A buffer that counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn done(wr_id: u64, byte_len: u32) -> Completion {
    Completion {
        wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::RdmaWrite,
        byte_len,
        ..Completion::EMPTY
    }
}

type Table = loom::sync::Arc<SlotTable<Owner>>;

fn table(n: usize) -> Table {
    loom::sync::Arc::new(SlotTable::new(n))
}

/// (a) A completion races the future's drop: exactly one side releases the slot, the
/// entries go back once and the buffer boxed into the slot is freed exactly once. With
/// `poll_first`, the future also polls (and may resolve) before it is dropped.
#[test]
fn a_completion_racing_the_futures_drop_releases_once() {
    for poll_first in [false, true] {
        loom::model(move || {
            let t = table(1);
            let owner = Owner::new(0);
            let drops = Arc::new(AtomicUsize::new(0));
            let (_, w) = waker();
            let idx = t.acquire().unwrap();
            let wr_id = t.arm(idx, &w, 0, 1);
            let completer = {
                let t = t.clone();
                thread::spawn(move || t.dispatch(&done(wr_id, 8)))
            };
            let buf = Tracked(drops.clone());
            let resolved = poll_first && t.poll_op(idx, &owner, &w).is_ready();
            if resolved {
                drop(buf); // the future returned it and the caller dropped it
            } else {
                t.abandon(idx, &owner, move || Some(Box::new(buf) as Box<dyn Send>));
            }
            completer.join().unwrap();
            assert_eq!(drops.load(Ordering::SeqCst), 1, "buffer freed exactly once");
            assert_eq!(owner.given.load(Ordering::SeqCst), 1, "entries back once");
            assert_eq!(Arc::strong_count(&owner), 1, "the slot let go of its owner");
            assert_eq!(t.in_flight(), 0);
            assert_eq!(t.acquire(), Some(idx), "the slot is free again");
        });
    }
}

/// (b) A waiter for room races the completion that makes room (the store-fence-load
/// handshake): it either finds the room or is woken. Room is a slot (`slot`) or its
/// holder's queue credits, whose failed take is a plain load.
#[test]
fn a_waiter_racing_a_completion_is_never_forgotten() {
    for slot in [true, false] {
        loom::model(move || {
            let t = table(1);
            let owner = Owner::new(0);
            let (_, w) = waker();
            let idx = t.acquire().unwrap();
            let wr_id = t.arm(idx, &w, 0, 1);
            t.abandon(idx, &owner, || None); // the completion releases it
            let completer = {
                let t = t.clone();
                thread::spawn(move || t.dispatch(&done(wr_id, 8)))
            };
            let (flag, waiter) = waker();
            let room = || {
                if slot {
                    t.acquire().is_some()
                } else {
                    owner.take(1)
                }
            };
            let got = room() || {
                t.wait_for_room(&waiter);
                room()
            };
            completer.join().unwrap();
            assert!(got || woken(&flag), "a lost wake-up");
        });
    }
}

/// (b) The future re-registers its waker while the completion arrives: it resolves, or the
/// waker it registered last is woken (not only an earlier one).
#[test]
fn a_future_polling_while_its_completion_arrives_is_woken() {
    loom::model(|| {
        let t = table(1);
        let owner = Owner::new(0);
        let (_, first) = waker();
        let idx = t.acquire().unwrap();
        let wr_id = t.arm(idx, &first, 0, 1);
        let completer = {
            let t = t.clone();
            thread::spawn(move || t.dispatch(&done(wr_id, 8)))
        };
        let (flag, second) = waker();
        let ready = t.poll_op(idx, &owner, &second).is_ready();
        completer.join().unwrap();
        assert!(ready || woken(&flag), "the current waker was not woken");
        if !ready {
            assert!(t.poll_op(idx, &owner, &second).is_ready());
        }
        assert_eq!(t.in_flight(), 0);
    });
}

/// (c) Slot reuse across generations: a late completion of the slot's previous occupant,
/// racing its reuse, never resolves the new occupant.
#[test]
fn a_stale_completion_never_resolves_the_next_occupant() {
    loom::model(|| {
        let t = table(1);
        let owner = Owner::new(0);
        let (_, w) = waker();
        let idx = t.acquire().unwrap();
        let old = t.arm(idx, &w, 0, 1);
        let late = {
            let t = t.clone();
            thread::spawn(move || t.dispatch(&done(old, 2)))
        };
        t.dispatch(&done(old, 1));
        let Poll::Ready(first) = t.poll_op(idx, &owner, &w) else {
            panic!("the first occupant did not resolve")
        };
        let first = first.into_result().unwrap();
        assert!(first.byte_len == 1 || first.byte_len == 2);
        let again = t.acquire().unwrap();
        let new = t.arm(again, &w, 0, 1);
        assert_ne!(new, old, "a reused slot gets a new wr_id");
        late.join().unwrap();
        assert!(
            t.poll_op(again, &owner, &w).is_pending(),
            "an earlier generation's completion resolved the new occupant"
        );
        t.dispatch(&done(new, 3));
        let Poll::Ready(o) = t.poll_op(again, &owner, &w) else {
            panic!("the new occupant did not resolve")
        };
        assert_eq!(o.into_result().unwrap().byte_len, 3);
    });
}

/// The hot-slot exchange and the free list: two threads taking and giving back slots of a
/// two-slot table never hold the same slot at once, and none is lost.
#[test]
fn the_hot_slot_is_never_handed_out_twice() {
    loom::model(|| {
        let t = table(2);
        let held = loom::sync::Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let worker = |t: Table, held: loom::sync::Arc<[AtomicBool; 2]>| {
            let owner = Owner::new(0);
            let (_, w) = waker();
            for _ in 0..2 {
                let Some(idx) = t.acquire() else { continue };
                assert!(
                    !held[idx as usize].swap(true, Ordering::SeqCst),
                    "slot held twice"
                );
                t.arm(idx, &w, 0, 1);
                held[idx as usize].store(false, Ordering::SeqCst);
                t.disarm(idx, &owner);
            }
        };
        let other = {
            let (t, held) = (t.clone(), held.clone());
            thread::spawn(move || worker(t, held))
        };
        worker(t.clone(), held.clone());
        other.join().unwrap();
        assert_eq!(t.in_flight(), 0, "a slot was lost");
        let (a, b) = (t.acquire().unwrap(), t.acquire().unwrap());
        assert_ne!(a, b);
        assert_eq!(t.acquire(), None);
    });
}

/// (f) A completion that arrives while its future is inside its poll (armed there, looking)
/// wakes nobody, and the poll's end finds it; one that arrives after the poll ended (the
/// waker recorded) wakes it. Either way the operation resolves once and frees its slot.
#[test]
fn a_completion_during_the_poll_is_found_by_its_end_or_wakes_after_it() {
    loom::model(|| {
        let t = table(1);
        let owner = Owner::new(0);
        let (flag, w) = waker();
        let idx = t.acquire().unwrap();
        let wr_id = t.arm_in_poll(idx, &w, 0, 1, true);
        let completer = {
            let t = t.clone();
            thread::spawn(move || t.dispatch(&done(wr_id, 8)))
        };
        let looked = t.look(idx, &owner).is_some();
        let ended = !looked && t.poll_op(idx, &owner, &w).is_ready();
        completer.join().unwrap();
        if !looked && !ended {
            assert!(
                woken(&flag),
                "completed after the poll ended, and nobody was woken"
            );
            assert!(t.poll_op(idx, &owner, &w).is_ready());
        }
        assert_eq!(t.in_flight(), 0);
    });
}

/// (g) A completion races the future's first look: its entries go back exactly once,
/// either on dispatch (the look came first and left the slot its holder) or when the future
/// takes its outcome; and once the future has looked, they are back as soon as the
/// dispatch ends, before the future is polled again.
#[test]
fn entries_go_back_once_whether_the_dispatch_or_the_look_comes_first() {
    loom::model(|| {
        let t = table(1);
        let owner = Owner::new(0);
        let (_, w) = waker();
        let idx = t.acquire().unwrap();
        let wr_id = t.arm_in_poll(idx, &w, 0, 2, true);
        let completer = {
            let t = t.clone();
            thread::spawn(move || t.dispatch(&done(wr_id, 8)))
        };
        let looked = t.look(idx, &owner);
        completer.join().unwrap();
        match looked {
            Some(outcome) => {
                outcome.into_result().unwrap();
            }
            None => {
                assert_eq!(
                    owner.given.load(Ordering::SeqCst),
                    2,
                    "not back on dispatch"
                );
                assert!(t.poll_op(idx, &owner, &w).is_ready());
            }
        }
        assert_eq!(owner.given.load(Ordering::SeqCst), 2, "given back once");
        assert_eq!(t.in_flight(), 0);
    });
}
