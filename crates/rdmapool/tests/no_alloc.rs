//! The data path makes no heap allocation per operation: after warm-up, posting and polling
//! one-sided operations allocates nothing on the calling thread (both paths), raw or through
//! the async engine (post, dispatch by wr_id, resolve).

#[path = "it/support/mod.rs"]
mod support;
use rdmapool::fabric::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use support::*;

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
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
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

#[test]
fn async_operations_allocate_nothing() {
    use rdmapool::cq::{Engine, EngineConfig, Progress};
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll};
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let engine = Engine::new(
            vec![a.cq.clone()],
            EngineConfig {
                progress: Progress::Caller,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let cfg = config();
        let qa = engine.create_qp(&a.pd, &cfg).unwrap();
        let qb = b.pd.create_qp(&b.cq, &b.cq, &cfg).unwrap();
        qa.connect(&qb.endpoint()).unwrap();
        qb.connect(&qa.qp().endpoint()).unwrap();
        let target = b.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap();
        let local = Arc::new(a.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap());
        let remote = target.remote_at(0).unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut run = |rounds: u64| {
            for _ in 0..rounds {
                let ops = [
                    qa.write(Mr::share(&local), 0, 4096, remote),
                    qa.read(Mr::share(&local), 0, 4096, remote),
                    qa.fetch_and_add(Mr::share(&local), 8192, remote, 1),
                    qa.compare_and_swap(Mr::share(&local), 8192, remote, 0, 1),
                ];
                for f in ops {
                    let mut f = std::pin::pin!(f);
                    let r = loop {
                        if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                            break r;
                        }
                        engine.progress();
                    };
                    assert!(r.0.is_ok(), "{:?}", r.0);
                }
            }
        };
        run(50);
        let before = allocs();
        run(500);
        let during = allocs() - before;
        assert_eq!(
            during, 0,
            "{t:?}: {during} allocations in 2000 async operations"
        );
    }
}
