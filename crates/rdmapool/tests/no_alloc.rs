//! The data path makes no heap allocation per operation: after warm-up, posting and polling
//! one-sided operations allocates nothing on the calling thread (both paths).

mod common;
use common::*;
use rdmapool::fabric::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator and only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

#[test]
fn posting_and_polling_allocate_nothing() {
    for t in transports() {
        let (a, b) = (node(), node());
        let (qa, _qb) = pair(&a, &b, &config(t));
        let target = b.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap();
        let local = a.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap();
        let remote = target.remote_at(0).unwrap();
        let sg_big = [local.sge(0, 4096).unwrap()];
        let sg8 = [local.sge(8192, 8).unwrap()];
        let ops = [
            (WrOp::Write { remote, imm: None }, &sg_big),
            (WrOp::Read { remote }, &sg_big),
            (WrOp::FetchAdd { remote, add: 1 }, &sg8),
            (
                WrOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 1,
                },
                &sg8,
            ),
        ];
        let mut out = [Completion::EMPTY; 4];
        let mut run = |rounds: u64| {
            for i in 0..rounds {
                for (op, sg) in &ops {
                    qa.post_send(&[SendWr {
                        wr_id: i,
                        op: *op,
                        sg_list: *sg,
                        signaled: true,
                    }])
                    .unwrap();
                    let mut got = 0;
                    while got == 0 {
                        got = a.cq.poll(&mut out).unwrap();
                    }
                    assert!(out[0].is_ok());
                }
            }
        };
        run(50); // warm-up: first-use mappings, lazily grown tables
        let before = allocs();
        run(500);
        let during = allocs() - before;
        assert_eq!(during, 0, "{t:?}: {during} allocations in 2000 operations");
    }
}
