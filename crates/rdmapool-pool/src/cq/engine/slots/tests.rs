//! The slot table on its own, driven by a fake completion source.

use super::*;
use crate::fabric::WcOpcode;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::task::Wake;

/// Completions handed in by the test, or an overrun.
#[derive(Default)]
struct FakeSource {
    queue: parking_lot::Mutex<VecDeque<Completion>>,
    overrun: Option<u32>,
}

impl FakeSource {
    fn complete(&self, wr_id: u64, status: WcStatus) {
        self.queue.lock().push_back(Completion {
            wr_id,
            status,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 8,
            ..Completion::EMPTY
        });
    }
}

impl CompletionSource for FakeSource {
    fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        if let Some(depth) = self.overrun {
            return Err(Error::Core(crate::CoreError::CqOverrun { depth }));
        }
        let mut q = self.queue.lock();
        let n = out.len().min(q.len());
        for (o, c) in out.iter_mut().zip(q.drain(..n)) {
            *o = c;
        }
        Ok(n)
    }
}

/// A holder that counts the entries given back.
#[derive(Default)]
struct Owner {
    given: AtomicUsize,
}

impl Holder for Owner {
    type Lease = u32;
    fn give_back(&self, n: u32) {
        self.given.fetch_add(n as usize, Ordering::SeqCst);
    }
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Flag(AtomicUsize);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn waker() -> (Arc<Flag>, Waker) {
    let f = Arc::new(Flag::default());
    (f.clone(), Waker::from(f))
}

/// A buffer that counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn drain(t: &SlotTable<Owner>, src: &FakeSource) -> usize {
    t.poll_source(src, &mut [Completion::EMPTY; 4]).unwrap()
}

#[test]
fn a_completion_wakes_and_resolves_its_operation_and_frees_the_slot() {
    let (t, src, owner) = (
        SlotTable::<Owner>::new(4),
        FakeSource::default(),
        Arc::new(Owner::default()),
    );
    let (flag, w) = waker();
    let idx = t.acquire().unwrap();
    let wr_id = t.arm(idx, &w, 0, 3);
    assert_eq!(t.in_flight(), 1);
    assert!(t.poll_op(idx, &owner, &w).is_pending());
    src.complete(wr_id, WcStatus::Success);
    assert_eq!(drain(&t, &src), 1);
    assert_eq!(flag.0.load(Ordering::SeqCst), 1, "woken once");
    let Poll::Ready(outcome) = t.poll_op(idx, &owner, &w) else {
        panic!("not resolved")
    };
    assert_eq!(outcome.into_result().unwrap().byte_len, 8);
    assert_eq!(owner.given.load(Ordering::SeqCst), 3, "entries given back");
    assert_eq!(t.in_flight(), 0);
}

#[test]
fn a_future_that_looked_gets_its_entries_back_when_the_completion_is_dispatched() {
    // A future set aside unpolled (one of a batch nobody drives) must not keep its queue
    // entries past its completion: once it looked and found nothing, the dispatch gives
    // them back and wakes those waiting for room; the future's later poll still resolves,
    // and gives nothing back twice.
    let (t, src) = (SlotTable::<Owner>::new(4), FakeSource::default());
    let owner = Arc::new(Owner::default());
    let (flag, w) = waker();
    let idx = t.acquire().unwrap();
    let wr_id = t.arm(idx, &w, 0, 3);
    assert!(t.poll_op(idx, &owner, &w).is_pending());
    let (room, waiting) = waker();
    t.wait_for_room(&waiting);
    src.complete(wr_id, WcStatus::Success);
    assert_eq!(drain(&t, &src), 1);
    assert_eq!(
        owner.given.load(Ordering::SeqCst),
        3,
        "given back on dispatch"
    );
    assert_eq!(
        room.0.load(Ordering::SeqCst),
        1,
        "those waiting for room woken"
    );
    assert_eq!(flag.0.load(Ordering::SeqCst), 1, "the future woken");
    assert_eq!(
        t.in_flight(),
        1,
        "the slot stays its future's until it looks"
    );
    let Poll::Ready(outcome) = t.poll_op(idx, &owner, &w) else {
        panic!("not resolved")
    };
    outcome.into_result().unwrap();
    assert_eq!(
        owner.given.load(Ordering::SeqCst),
        3,
        "nothing given back twice"
    );
    assert_eq!(t.in_flight(), 0);
    assert_eq!(Arc::strong_count(&owner), 1, "the slot let its holder go");
}

#[test]
fn an_error_completion_names_status_and_opcode() {
    let (t, src, owner) = (
        SlotTable::<Owner>::new(1),
        FakeSource::default(),
        Arc::new(Owner::default()),
    );
    let (_, w) = waker();
    let idx = t.acquire().unwrap();
    src.complete(t.arm(idx, &w, 0, 1), WcStatus::RemAccessErr);
    drain(&t, &src);
    let Poll::Ready(outcome) = t.poll_op(idx, &owner, &w) else {
        panic!("not resolved")
    };
    assert!(matches!(
        outcome.into_result(),
        Err(Error::Completion {
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RdmaWrite
        })
    ));
}

#[test]
fn stale_and_unknown_completions_are_ignored() {
    let (t, src, owner) = (
        SlotTable::<Owner>::new(1),
        FakeSource::default(),
        Arc::new(Owner::default()),
    );
    let (_, w) = waker();
    let idx = t.acquire().unwrap();
    let old = t.arm(idx, &w, 0, 1);
    src.complete(old, WcStatus::Success);
    drain(&t, &src);
    assert!(t.poll_op(idx, &owner, &w).is_ready());
    // The same slot, next generation.
    let idx2 = t.acquire().unwrap();
    assert_eq!(idx2, idx, "the hot slot comes back first");
    let new = t.arm(idx2, &w, 0, 1);
    assert_ne!(new, old);
    src.complete(old, WcStatus::GeneralErr); // the earlier occupant's, late
    src.complete(7, WcStatus::GeneralErr); // no such slot
    drain(&t, &src);
    assert!(
        t.poll_op(idx2, &owner, &w).is_pending(),
        "not the new occupant's"
    );
    src.complete(new, WcStatus::Success);
    drain(&t, &src);
    assert!(t.poll_op(idx2, &owner, &w).is_ready());
}

#[test]
fn a_later_completion_of_an_ended_operation_is_ignored() {
    // A batch's error completion ends it; a flush of its later requests must not count.
    let (t, src, owner) = (
        SlotTable::<Owner>::new(1),
        FakeSource::default(),
        Arc::new(Owner::default()),
    );
    let (_, w) = waker();
    let idx = t.acquire().unwrap();
    let wr_id = t.arm(idx, &w, 0, 2);
    src.complete(wr_id, WcStatus::RemAccessErr);
    src.complete(wr_id, WcStatus::WrFlushErr);
    drain(&t, &src);
    let Poll::Ready(o) = t.poll_op(idx, &owner, &w) else {
        panic!("not resolved")
    };
    assert!(matches!(
        o.into_result(),
        Err(Error::Completion {
            status: WcStatus::RemAccessErr,
            ..
        })
    ));
}

#[test]
fn an_abandoned_operation_keeps_its_buffer_until_the_completion() {
    let (t, src) = (SlotTable::<Owner>::new(2), FakeSource::default());
    let owner = Arc::new(Owner::default());
    let drops = Arc::new(AtomicUsize::new(0));
    let (_, w) = waker();
    let idx = t.acquire().unwrap();
    let wr_id = t.arm(idx, &w, 0, 5);
    let buf = Tracked(drops.clone());
    t.abandon(idx, &owner, || Some(Box::new(buf)));
    assert_eq!(drops.load(Ordering::SeqCst), 0, "kept while in flight");
    assert_eq!(Arc::strong_count(&owner), 2, "the slot holds the owner");
    src.complete(wr_id, WcStatus::Success);
    drain(&t, &src);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "freed on completion");
    assert_eq!(owner.given.load(Ordering::SeqCst), 5);
    assert_eq!(Arc::strong_count(&owner), 1);
    assert_eq!(t.in_flight(), 0);
}

#[test]
fn dropping_after_the_completion_releases_at_once() {
    let (t, src) = (SlotTable::<Owner>::new(1), FakeSource::default());
    let owner = Arc::new(Owner::default());
    let (_, w) = waker();
    let idx = t.acquire().unwrap();
    src.complete(t.arm(idx, &w, 0, 1), WcStatus::Success);
    drain(&t, &src);
    let mut boxed = false;
    t.abandon(idx, &owner, || {
        boxed = true;
        None
    });
    assert!(!boxed, "no box when the operation already ended");
    assert_eq!((t.in_flight(), owner.given.load(Ordering::SeqCst)), (0, 1));
}

#[test]
fn an_overrun_fails_the_operations_of_that_source_and_unknown_ones() {
    let t = SlotTable::<Owner>::new(4);
    let owner = Arc::new(Owner::default());
    let broken = FakeSource {
        overrun: Some(16),
        ..FakeSource::default()
    };
    let (_, w) = waker();
    let on0 = t.acquire().unwrap();
    t.arm(on0, &w, 0, 1);
    let on1 = t.acquire().unwrap();
    t.arm(on1, &w, 1, 1);
    let unknown = t.acquire().unwrap();
    t.arm(unknown, &w, ANY_SOURCE, 1);
    let abandoned = t.acquire().unwrap();
    t.arm(abandoned, &w, 0, 1);
    let drops = Arc::new(AtomicUsize::new(0));
    let buf = Tracked(drops.clone());
    t.abandon(abandoned, &owner, || Some(Box::new(buf)));
    assert!(matches!(
        t.poll_source(&broken, &mut [Completion::EMPTY; 4]),
        Err(Error::Core(crate::CoreError::CqOverrun { depth: 16 }))
    ));
    t.fail_source(0, 16);
    for idx in [on0, unknown] {
        let Poll::Ready(o) = t.poll_op(idx, &owner, &w) else {
            panic!("slot {idx} not failed")
        };
        assert!(matches!(
            o.into_result(),
            Err(Error::Core(crate::CoreError::CqOverrun { depth: 16 }))
        ));
    }
    assert!(t.poll_op(on1, &owner, &w).is_pending(), "another source");
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "a lost request's buffer is leaked"
    );
    assert_eq!(t.in_flight(), 1);
}

#[test]
fn a_full_table_wakes_its_waiters_when_a_slot_frees() {
    let (t, src, owner) = (
        SlotTable::<Owner>::new(2),
        FakeSource::default(),
        Arc::new(Owner::default()),
    );
    let (_, w) = waker();
    let a = t.acquire().unwrap();
    let b = t.acquire().unwrap();
    assert_ne!(a, b);
    assert_eq!(t.acquire(), None);
    let (waiting, ww) = waker();
    t.wait_for_room(&ww);
    t.wake_waiters(); // no room made yet: a spurious wake-up is allowed, a lost one is not
    let before = waiting.0.load(Ordering::SeqCst);
    t.wait_for_room(&ww);
    src.complete(t.arm(a, &w, 0, 1), WcStatus::Success);
    drain(&t, &src);
    assert!(t.poll_op(a, &owner, &w).is_ready());
    assert_eq!(waiting.0.load(Ordering::SeqCst), before + 1);
    assert_eq!(t.acquire(), Some(a));
}

#[test]
fn a_failed_post_gives_everything_back() {
    let (t, owner) = (SlotTable::<Owner>::new(1), Arc::new(Owner::default()));
    let (_, w) = waker();
    let idx = t.acquire().unwrap();
    let first = t.arm(idx, &w, 0, 4);
    t.disarm(idx, &owner);
    assert_eq!((t.in_flight(), owner.given.load(Ordering::SeqCst)), (0, 4));
    let again = t.acquire().unwrap();
    assert_ne!(t.arm(again, &w, 0, 1), first, "a new generation");
}

#[test]
fn generations_wrap_around() {
    let (t, owner) = (SlotTable::<Owner>::new(1), Arc::new(Owner::default()));
    let (_, w) = waker();
    lock(&t.slots[0]).generation = u32::MAX;
    let idx = t.acquire().unwrap();
    assert_eq!(t.arm(idx, &w, 0, 1) >> 32, u32::MAX as u64);
    t.disarm(idx, &owner);
    let idx = t.acquire().unwrap();
    assert_eq!(t.arm(idx, &w, 0, 1), 0, "generation 0 of slot 0");
}

#[test]
fn every_slot_is_handed_out_once_until_freed() {
    let t = SlotTable::<Owner>::new(8);
    let mut got: Vec<u32> = std::iter::from_fn(|| t.acquire()).collect();
    got.sort();
    assert_eq!(got, (0..8).collect::<Vec<_>>());
    assert_eq!(t.in_flight(), 8);
}
