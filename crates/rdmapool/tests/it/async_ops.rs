//! The async API: many concurrent futures over several QPs and CQs, batches with one
//! doorbell (mixed, selectively signalled), backpressure, dropped futures that keep their
//! buffers until completion (cancellation storms), a QP forced into ERR while futures wait,
//! CQ sizing and overrun, in all three progress modes.

use crate::support::*;
use rdmapool::cq::{CqPool, Engine, EngineConfig, LocalBuf, OpCompletion, Progress};
use rdmapool::fabric::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_futures_over_several_qps_and_cqs() {
    for mode in TOKIO_MODES {
        for t in transports() {
            let s = setup(4, t, config(), mode);
            let local = Arc::new(
                s._a.pd
                    .alloc_mr(1 << 20, AccessFlags::all_remote())
                    .unwrap(),
            );
            for i in 0..256 {
                local.write_at(i * 4096, &pattern(4096, i as u8)).unwrap();
            }
            let futs: Vec<_> = (0..256)
                .map(|i| {
                    s.qps[i % 4].write(
                        LocalBuf::Region(local.clone()),
                        i * 4096,
                        4096,
                        s.target.remote_at(i * 4096).unwrap(),
                    )
                })
                .collect();
            all_ok(futs).await;
            assert_blocks(&s.target, 0..256, &format!("{mode:?} {t:?} block"));
            // Atomics and reads through the same engine.
            let word = s.target.remote_at(0).unwrap();
            let futs: Vec<_> = (0..64)
                .map(|i| {
                    s.qps[i % 4].fetch_and_add(LocalBuf::Region(local.clone()), 8 * i, word, 1)
                })
                .collect();
            all_ok(futs).await;
            let before = u64::from_ne_bytes(pattern(8, 0).try_into().unwrap());
            assert_eq!(
                s.target.read_u64(0).unwrap(),
                before.wrapping_add(64),
                "{mode:?} {t:?}"
            );
            let back = Arc::new(
                s._a.pd
                    .alloc_mr(1 << 20, AccessFlags::all_remote())
                    .unwrap(),
            );
            let futs: Vec<_> = (1..256)
                .map(|i| {
                    s.qps[i % 4].read(
                        LocalBuf::Region(back.clone()),
                        i * 4096,
                        4096,
                        s.target.remote_at(i * 4096).unwrap(),
                    )
                })
                .collect();
            all_ok(futs).await;
            assert_blocks(&back, 1..256, &format!("{mode:?} {t:?} read"));
            assert!(s.engine.stats().completions >= 256 + 64 + 255);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn event_driven_progress_on_a_single_threaded_runtime() {
    // The event task and the futures share one thread: nothing may block it. Every
    // completion must arrive through the completion channel.
    for t in transports() {
        let s = setup_with(
            2,
            t,
            config(),
            EngineConfig {
                progress: Progress::Event,
                // No spinning: every completion must come through the channel.
                spin: std::time::Duration::ZERO,
                ..EngineConfig::default()
            },
        );
        let local = Arc::new(
            s._a.pd
                .alloc_mr(1 << 16, AccessFlags::all_remote())
                .unwrap(),
        );
        local.write_at(0, &pattern(1 << 16, 7)).unwrap();
        for round in 0..50usize {
            let futs: Vec<_> = (0..8)
                .map(|i| {
                    s.qps[i % 2].write(
                        LocalBuf::Region(local.clone()),
                        i * 4096,
                        4096,
                        s.target.remote_at(i * 4096).unwrap(),
                    )
                })
                .collect();
            let done = tokio::time::timeout(WAIT, join_all(futs))
                .await
                .unwrap_or_else(|_| panic!("{t:?} round {round}: no wake-up within {WAIT:?}"));
            for (r, _) in done {
                r.unwrap_or_else(|e| panic!("{t:?} round {round}: {e}"));
            }
        }
        let mut got = vec![0u8; 8 * 4096];
        s.target.read_at(0, &mut got).unwrap();
        assert!(got[..] == pattern(1 << 16, 7)[..8 * 4096], "{t:?}");
        assert!(s.engine.stats().wakeups > 0, "{t:?}");
    }
}

#[test]
fn the_completion_channel_wakes_for_every_kind_of_progress() {
    // Fabric level, as a user without the engine would use it: arm, wait on the fd,
    // acknowledge, re-arm, drain. On the soft provider a response arriving on the socket
    // must wake the channel too (the requester half runs when the CQ is polled).
    for t in transports() {
        let (a, b) = (node_on(t), node_on(t));
        let (qa, _qb) = pair(&a, &b, &config());
        let target = b.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap();
        let local = a.pd.alloc_mr(1 << 16, AccessFlags::all_remote()).unwrap();
        for round in 0..20u64 {
            a.cq.req_notify().unwrap();
            let op = if round % 2 == 0 {
                WrOp::Read {
                    remote: target.remote_at(0).unwrap(),
                }
            } else {
                WrOp::Write {
                    remote: target.remote_at(0).unwrap(),
                    imm: None,
                }
            };
            qa.post_send(&[SendWr {
                wr_id: round,
                op,
                sg_list: &[local.sge(0, 1 << 16).unwrap()],
                signaled: true,
            }])
            .unwrap();
            let mut got = 0;
            let mut out = [Completion::EMPTY; 4];
            let until = std::time::Instant::now() + WAIT;
            while got == 0 {
                let remaining = until.saturating_duration_since(std::time::Instant::now());
                assert!(!remaining.is_zero(), "{t:?} round {round}: no event");
                if !wait_readable(a.cq.event_fd(), remaining) {
                    continue;
                }
                a.cq.ack_events().unwrap();
                a.cq.req_notify().unwrap();
                got = a.cq.poll(&mut out).unwrap();
            }
            assert_eq!(got, 1, "{t:?}");
            assert!(
                out[0].is_ok() && out[0].wr_id == round,
                "{t:?}: {:?}",
                out[0]
            );
        }
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batches_post_once_and_signal_once() {
    for mode in TOKIO_MODES {
        let s = setup(1, Transport::Auto, config(), mode);
        let local = Arc::new(
            s._a.pd
                .alloc_mr(64 * 64 + 4096, AccessFlags::all_remote())
                .unwrap(),
        );
        let counter = s.target.remote_at(8192).unwrap();
        s.target.write_at(8192, &10u64.to_ne_bytes()).unwrap();
        // WRITE, FAA and READ interleaved; only the last is signalled. RC order means the
        // READs see the WRITEs before them.
        let mut ops = Vec::new();
        for i in 0..16usize {
            local.write_at(i * 64, &[i as u8 + 1; 64]).unwrap();
            ops.push((
                WrOp::Write {
                    remote: s.target.remote_at(i * 64).unwrap(),
                    imm: None,
                },
                LocalBuf::Region(local.clone()),
                i * 64,
                64,
            ));
            ops.push((
                WrOp::FetchAdd {
                    remote: counter,
                    add: 1,
                },
                LocalBuf::Region(local.clone()),
                2048 + 8 * i,
                8,
            ));
            ops.push((
                WrOp::Read {
                    remote: s.target.remote_at(i * 64).unwrap(),
                },
                LocalBuf::Region(local.clone()),
                4096 + i * 64,
                64,
            ));
        }
        let c = s.qps[0].batch(ops).await.0.unwrap();
        assert_eq!(c.opcode, WcOpcode::RdmaRead, "{mode:?}");
        for i in 0..16usize {
            let mut got = [0u8; 64];
            s.target.read_at(i * 64, &mut got).unwrap();
            assert_eq!(got, [i as u8 + 1; 64], "{mode:?} write {i}");
            local.read_at(4096 + i * 64, &mut got).unwrap();
            assert_eq!(got, [i as u8 + 1; 64], "{mode:?} read {i}");
            let mut old = [0u8; 8];
            local.read_at(2048 + 8 * i, &mut old).unwrap();
            assert_eq!(u64::from_ne_bytes(old), 10 + i as u64, "{mode:?} faa {i}");
        }
        assert_eq!(s.target.read_u64(8192).unwrap(), 26);
        // A batch deeper than the send queue is refused, not split behind the caller's back.
        let too_many: Vec<_> = (0..QpConfig::default().max_send_wr as usize + 1)
            .map(|_| {
                (
                    WrOp::Write {
                        remote: s.target.remote_at(0).unwrap(),
                        imm: None,
                    },
                    LocalBuf::Region(local.clone()),
                    0,
                    8,
                )
            })
            .collect();
        assert!(matches!(
            s.qps[0].batch(too_many).await.0,
            Err(rdmapool::Error::InvalidArgument(_))
        ));
        // A batch with a bad request fails with its status (the QP then goes to ERR).
        let good = s.target.remote_at(0).unwrap();
        let bad = vec![
            (
                WrOp::Write {
                    remote: good,
                    imm: None,
                },
                LocalBuf::Region(local.clone()),
                0,
                8,
            ),
            (
                WrOp::Write {
                    remote: RemoteAddr {
                        addr: good.addr,
                        rkey: good.rkey ^ 0x5a5a,
                    },
                    imm: None,
                },
                LocalBuf::Region(local.clone()),
                0,
                8,
            ),
        ];
        match s.qps[0].batch(bad).await.0 {
            Err(rdmapool::Error::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::RemAccessErr, "{mode:?}")
            }
            other => panic!("{mode:?}: a bad rkey in a batch gave {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_send_queue_makes_futures_wait_not_fail() {
    for mode in TOKIO_MODES {
        let cfg = QpConfig {
            max_send_wr: 4,
            ..config()
        };
        let s = setup(1, Transport::Tcp, cfg, mode);
        let local = Arc::new(s._a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
        let futs: Vec<_> = (0..200)
            .map(|i| {
                s.qps[0].write(
                    LocalBuf::Region(local.clone()),
                    0,
                    64,
                    s.target.remote_at(64 * (i % 16)).unwrap(),
                )
            })
            .collect();
        all_ok(futs).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_storms_never_free_a_buffer_early() {
    for mode in TOKIO_MODES {
        let s = setup(2, Transport::Tcp, config(), mode);
        let local = Arc::new(
            s._a.pd
                .alloc_mr(1 << 20, AccessFlags::all_remote())
                .unwrap(),
        );
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        for round in 0..20 {
            // Polled once (posted) then dropped in flight, never polled (dropped before
            // posting), or cancelled by a timeout while waiting.
            for i in 0..32 {
                let mut f = Box::pin(s.qps[i % 2].read(
                    LocalBuf::Region(local.clone()),
                    0,
                    1 << 20,
                    s.target.remote_at(0).unwrap(),
                ));
                if (i + round) % 3 != 0 {
                    let _ = f.as_mut().poll(&mut cx);
                }
                drop(f);
            }
            let f = s.qps[round % 2].read(
                LocalBuf::Region(local.clone()),
                0,
                1 << 20,
                s.target.remote_at(0).unwrap(),
            );
            let _ = tokio::time::timeout(std::time::Duration::from_micros(10), f).await;
        }
        // The engine releases every buffer when its completion arrives.
        let until = std::time::Instant::now() + WAIT;
        while Arc::strong_count(&local) > 1 && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(
            Arc::strong_count(&local),
            1,
            "{mode:?}: a dropped future's buffer was never released"
        );
        assert_eq!(s.engine.stats().in_flight, 0, "{mode:?}");
        // Both QPs still work, with verified data.
        for (i, q) in s.qps.iter().enumerate() {
            local.write_at(0, &pattern(4096, i as u8 + 3)).unwrap();
            q.write(
                LocalBuf::Region(local.clone()),
                0,
                4096,
                s.target.remote_at(0).unwrap(),
            )
            .await
            .0
            .unwrap();
            let mut got = vec![0u8; 4096];
            s.target.read_at(0, &mut got).unwrap();
            assert!(got == pattern(4096, i as u8 + 3), "{mode:?} qp {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qp_forced_into_error_fails_its_pending_futures() {
    for mode in TOKIO_MODES {
        let s = setup(2, Transport::Tcp, config(), mode);
        let local = Arc::new(
            s._a.pd
                .alloc_mr(1 << 20, AccessFlags::all_remote())
                .unwrap(),
        );
        let doomed: Vec<_> = (0..16)
            .map(|_| {
                s.qps[0].read(
                    LocalBuf::Region(local.clone()),
                    0,
                    1 << 20,
                    s.target.remote_at(0).unwrap(),
                )
            })
            .collect();
        let mut doomed: Vec<_> = doomed.into_iter().map(Box::pin).collect();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        // Post them all; a future that already finished keeps its result.
        let mut results = Vec::new();
        doomed.retain_mut(|f| match f.as_mut().poll(&mut cx) {
            Poll::Ready((r, _)) => {
                results.push(r);
                false
            }
            Poll::Pending => true,
        });
        s.qps[0].qp().modify_to_error();
        results.extend(join_all(doomed).await.into_iter().map(|(r, _)| r));
        // Each future finishes: done before the error, a flush/error completion, or (rxe) a
        // post refused because the QP is already in ERR. None hangs.
        let errors = results.iter().filter(|r| r.is_err()).count();
        if provider() == ProviderKind::Soft {
            assert!(errors > 0, "{mode:?}: no future saw the error: {results:?}");
        } else if errors == 0 {
            // rxe on Linux 6.1 lets requests already in flight finish (no flush); what
            // matters here is that every future finished.
            eprintln!(
                "all {} requests finished before the QP's error took effect",
                results.len()
            );
        }
        // The other QP on the engine keeps working.
        s.qps[1]
            .write(
                LocalBuf::Region(local.clone()),
                0,
                8,
                s.target.remote_at(0).unwrap(),
            )
            .await
            .0
            .unwrap();
    }
}

#[test]
fn caller_driven_progress_without_threads() {
    let s = setup(1, Transport::Auto, config(), Progress::Caller);
    let local = Arc::new(s._a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
    local.write_at(0, b"polled by me").unwrap();
    let mut f = Box::pin(s.qps[0].write(
        LocalBuf::Region(local.clone()),
        0,
        12,
        s.target.remote_at(0).unwrap(),
    ));
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let until = std::time::Instant::now() + WAIT;
    let done = loop {
        if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
            break r;
        }
        s.engine.progress();
        assert!(std::time::Instant::now() < until, "no progress");
    };
    done.0.unwrap();
    let mut got = [0u8; 12];
    s.target.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"polled by me");
}

#[test]
fn event_mode_outside_a_runtime_is_a_clear_error() {
    let a = node();
    let err = Engine::new(
        vec![a.cq.clone()],
        EngineConfig {
            progress: Progress::Event,
            ..EngineConfig::default()
        },
    )
    .err()
    .expect("no runtime");
    assert!(err.to_string().contains("tokio runtime"), "{err}");
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
    assert!(err.to_string().contains("no CQ has room"), "{err}");
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
        .map(|_| {
            Box::pin(q.write(
                LocalBuf::Region(local.clone()),
                0,
                8,
                target.remote_at(0).unwrap(),
            ))
        })
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
            Poll::Ready((Err(rdmapool::Error::CqOverrun { depth }), _)) => {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qp_outliving_its_engine_handle_still_completes() {
    for mode in TOKIO_MODES {
        let s = setup(1, Transport::Tcp, config(), mode);
        let Setup {
            _a: a,
            _b: b,
            _peers: peers,
            engine,
            qps,
            target,
        } = s;
        drop(engine); // progress continues while a QP of the engine is alive
        let local = Arc::new(a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
        local.write_at(0, b"after the engine").unwrap();
        let done = tokio::time::timeout(
            WAIT,
            qps[0].write(
                LocalBuf::Region(local.clone()),
                0,
                16,
                target.remote_at(0).unwrap(),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{mode:?}: no progress after the Engine handle was dropped"));
        done.0.unwrap();
        let mut got = [0u8; 16];
        target.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"after the engine", "{mode:?}");
        drop((qps, peers, b));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_operations_give_the_buffer_back_with_the_outcome() {
    use rdmapool::buf::{BufferPool, PoolConfig};
    for mode in TOKIO_MODES {
        let s = setup(1, Transport::Auto, config(), mode);
        s.target.write_at(0, &pattern(4096, 42)).unwrap();
        // A READ into a pooled buffer: the buffer comes back holding the data.
        let pool = BufferPool::new(s._a.pd.clone(), PoolConfig::default()).unwrap();
        let buf = pool.alloc(4096).unwrap();
        let (r, buf) = s.qps[0]
            .read(buf, 0, 4096, s.target.remote_at(0).unwrap())
            .await;
        r.unwrap();
        let mut got = vec![0u8; 4096];
        buf.read_at(0, &mut got).unwrap();
        assert!(got == pattern(4096, 42), "{mode:?}: pooled READ");
        // A READ into a safely registered Vec, given back as a plain Vec.
        let owned =
            s._a.pd
                .register(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
                .unwrap();
        let (r, owned) = s.qps[0]
            .read(owned, 0, 4096, s.target.remote_at(0).unwrap())
            .await;
        r.unwrap();
        assert!(
            owned.into_inner() == pattern(4096, 42),
            "{mode:?}: Vec READ"
        );
        // Refused before posting (range past the buffer): the buffer still comes back.
        let (r, buf) = s.qps[0]
            .write(buf, 4000, 200, s.target.remote_at(0).unwrap())
            .await;
        assert!(
            matches!(r, Err(rdmapool::Error::InvalidArgument(_))),
            "{r:?}"
        );
        assert_eq!(buf.len(), 4096);
        // An error completion: the buffer comes back too (a bad rkey; the QP then fails).
        let bad = RemoteAddr {
            rkey: s.target.rkey() ^ 0x5a5a,
            ..s.target.remote_at(0).unwrap()
        };
        let (r, buf) = s.qps[0].read(buf, 0, 64, bad).await;
        assert!(
            matches!(
                r,
                Err(rdmapool::Error::Completion {
                    status: WcStatus::RemAccessErr,
                    opcode: WcOpcode::RdmaRead,
                })
            ),
            "{mode:?}: {r:?}"
        );
        drop(buf);
        assert_eq!(pool.stats().in_use, 0, "{mode:?}");
    }
}

#[test]
fn the_only_operation_in_flight_waits_for_its_completion_before_parking() {
    // Nothing polls the CQ (caller-driven, and nobody calls progress). A single WRITE posts
    // in its first poll and asks to be polled again (so that a task posting several
    // operations in one poll posts them all first); in its second poll, still the only
    // operation in flight, it waits for its own completion. With the spin off, it asks for
    // nothing and stays pending until someone polls the CQ.
    struct Count(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let spins = [
        (std::time::Duration::from_secs(5), true),
        (std::time::Duration::ZERO, false),
    ];
    for (spin, ready) in spins {
        let (a, b) = (node_on(Transport::Tcp), node_on(Transport::Tcp));
        let (qa, _qb) = pair(&a, &b, &config());
        let engine = Engine::new(
            vec![a.cq.clone()],
            EngineConfig {
                progress: Progress::Caller,
                spin,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let q = engine.wrap(qa);
        let target = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
        let local = Arc::new(a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = Box::pin(q.write(LocalBuf::Region(local), 0, 8, target.remote_at(0).unwrap()));
        assert!(
            f.as_mut().poll(&mut cx).is_pending(),
            "the first poll posts"
        );
        let asked = count.0.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(asked > 0, ready, "spin {spin:?}: asked to be polled again");
        let second = f.as_mut().poll(&mut cx);
        assert_eq!(second.is_ready(), ready, "spin {spin:?}");
        if let std::task::Poll::Ready((r, _)) = second {
            r.unwrap();
        } else {
            engine.run_until(f).0.unwrap();
        }
    }
}
