//! The async API: many concurrent futures over several QPs and CQs, batches with one
//! doorbell (mixed, selectively signalled), backpressure, dropped futures that keep their
//! buffers until completion (cancellation storms), a QP forced into ERR while futures wait,
//! CQ sizing and overrun, in all three progress modes.

use crate::support::*;
use rdmapool::cq::{CqPool, Engine, EngineConfig, OpCompletion, Progress};
use rdmapool::fabric::*;
use rdmapool::CoreError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

mod futures;
mod progress;

/// Polls every future until all are done; returns their outputs in order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx: &mut Context<'_>| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(out.iter_mut().map(|o| o.take().unwrap()).collect())
        }
    })
    .await
}

/// Awaits every future; each must succeed.
async fn all_ok<B, F: Future<Output = (rdmapool::Result<OpCompletion>, B)>>(futs: Vec<F>) {
    for (r, _buf) in join_all(futs).await {
        r.unwrap();
    }
}

/// Block `i` (4 KiB) of `mr` must hold `pattern(4096, i)` for every `i` in `blocks`.
fn assert_blocks(mr: &Mr, blocks: std::ops::Range<usize>, what: &str) {
    for i in blocks {
        let mut got = vec![0u8; 4096];
        mr.read_at(i * 4096, &mut got).unwrap();
        assert!(got == pattern(4096, i as u8), "{what} {i}");
    }
}

struct Setup {
    _a: Node,
    _b: Node,
    _peers: Vec<Qp>,
    engine: Engine,
    qps: Vec<rdmapool::cq::AsyncQp>,
    target: Mr,
}

fn setup(qps: usize, t: Transport, cfg: QpConfig, progress: Progress) -> Setup {
    setup_with(
        qps,
        t,
        cfg,
        EngineConfig {
            progress,
            ..EngineConfig::default()
        },
    )
}

fn setup_with(qps: usize, t: Transport, cfg: QpConfig, engine_cfg: EngineConfig) -> Setup {
    let (a, b) = (node_on(t), node_on(t));
    let pool = CqPool::new(&a.ctx, 2, 4096).unwrap();
    let engine = Engine::with_pool(pool, engine_cfg).unwrap();
    let mut out = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..qps {
        let qa = engine.create_qp(&a.pd, &cfg).unwrap();
        let qb = b.pd.create_qp(&b.cq, &b.cq, &cfg).unwrap();
        qa.connect(&qb.endpoint()).unwrap();
        qb.connect(&qa.qp().endpoint()).unwrap();
        peers.push(qb);
        out.push(qa);
    }
    let target = b.pd.alloc_mr(1 << 20, AccessFlags::all_remote()).unwrap();
    Setup {
        _a: a,
        _b: b,
        _peers: peers,
        engine,
        qps: out,
        target,
    }
}

/// The modes a tokio test can run in (caller-driven needs its own loop).
const TOKIO_MODES: [Progress; 2] = [Progress::BusyPoll, Progress::Event];

/// Waits up to `timeout` (at most a second) for `fd` to be readable.
fn wait_readable(fd: std::os::fd::RawFd, timeout: std::time::Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(1000) as i32) };
    n > 0 && p.revents & libc::POLLIN != 0
}

#[test]
fn one_placement_for_the_pool_and_the_engine() {
    let a = node();
    let pool = CqPool::new(&a.ctx, 3, 1024).unwrap();
    // On its own: round-robin cycles, per thread stays put.
    let handles = |cq: &Cq| cq.event_fd();
    let rr: Vec<_> = (0..3).map(|_| handles(pool.next())).collect();
    let mut distinct = rr.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{rr:?}");
    assert_eq!(handles(pool.for_thread()), handles(pool.for_thread()));
    // The engine places with the same policy: per thread, this thread's QPs share a CQ.
    let engine = Engine::with_pool(
        pool,
        EngineConfig {
            progress: Progress::Caller,
            assignment: rdmapool::cq::Assignment::PerThread,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let cfg = QpConfig {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..config()
    };
    let on: Vec<_> = (0..3)
        .map(|_| engine.create_qp(&a.pd, &cfg).unwrap().cq_index().unwrap())
        .collect();
    assert!(on.iter().all(|&c| c == on[0]), "{on:?}");
}

#[test]
fn qps_are_never_promised_more_cq_entries_than_there_are() {
    let a = node();
    let pool = CqPool::new(&a.ctx, 2, 1024).unwrap();
    let engine = Engine::with_pool(
        pool,
        EngineConfig {
            progress: Progress::Caller,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    // 256 + 256 entries each: two QPs fill a CQ of 1024, so four fill the pool.
    let cfg = config();
    let qps: Vec<_> = (0..4)
        .map(|_| engine.create_qp(&a.pd, &cfg).unwrap())
        .collect();
    let on: Vec<_> = qps.iter().map(|q| q.cq_index().unwrap()).collect();
    assert_eq!(on.iter().filter(|&&c| c == 0).count(), 2, "{on:?}");
    assert_eq!(on.iter().filter(|&&c| c == 1).count(), 2, "{on:?}");
    let err = engine
        .create_qp(&a.pd, &cfg)
        .err()
        .expect("the pool is full");
    assert!(
        // Room left is what the CQs' real depths leave (a device may round a CQ up).
        matches!(err, rdmapool::Error::Core(CoreError::OutOfLimits { value, max, .. }) if value == 512 && max < value),
        "{err}"
    );
    drop(qps.into_iter().next());
    engine
        .create_qp(&a.pd, &cfg)
        .expect("room again after a QP is gone");
}

#[test]
fn a_cq_overrun_is_detected_and_reported() {
    // A QP made by hand on a CQ too small for it (create_qp would refuse), and 32 writes
    // nobody polls for. Soft: the zero-copy path completes them at post time, overrunning
    // the CQ at once. Verbs: the device reports IBV_EVENT_CQ_ERR, which the context's event
    // thread turns into the CQ's overrun.
    let (a, b) = (node_on(Transport::Local), node_on(Transport::Local));
    let small = a.ctx.create_cq(8).unwrap();
    let cfg = config();
    let qa = a.pd.create_qp(&small, &small, &cfg).unwrap();
    let qb = b.pd.create_qp(&b.cq, &b.cq, &cfg).unwrap();
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    let engine = Engine::new(
        vec![small.clone()],
        EngineConfig {
            progress: Progress::Caller,
            // The futures must stay pending until the CQ is polled.
            spin: std::time::Duration::ZERO,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let q = engine.wrap(qa);
    let target = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let local = Arc::new(a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut futs: Vec<_> = (0..32)
        .map(|_| Box::pin(q.write(Mr::share(&local), 0, 8, target.remote_at(0).unwrap())))
        .collect();
    for f in &mut futs {
        assert!(f.as_mut().poll(&mut cx).is_pending());
    }
    if provider() != ProviderKind::Soft {
        // Let the device complete them all (and overflow) before anyone polls.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let (mut overrun, mut ok) = (0, 0);
    let until = std::time::Instant::now() + WAIT;
    let mut pending: Vec<_> = futs.iter_mut().collect();
    while !pending.is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "{} operations never finished after the overrun",
            pending.len()
        );
        engine.progress();
        pending.retain_mut(|f| match f.as_mut().poll(&mut cx) {
            Poll::Ready((Err(rdmapool::Error::Core(CoreError::CqOverrun { depth })), _)) => {
                assert_eq!(depth, 8);
                overrun += 1;
                false
            }
            Poll::Ready((Ok(_), _)) => {
                ok += 1;
                false
            }
            Poll::Ready(other) => panic!("after an overrun: {other:?}"),
            Poll::Pending => true,
        });
    }
    assert!(
        overrun > 0,
        "no future learnt of the overrun ({ok} completed)"
    );
    assert_eq!(engine.stats().overruns, 1);
}
