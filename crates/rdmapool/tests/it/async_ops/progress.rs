//! Progress modes: event-driven on a current-thread runtime, the completion channel,
//! caller-driven without threads, event mode outside a runtime, parking with one operation,
//! lazy arming of the completion channel (spinners cost no event; parked futures, spinners
//! and dropped futures mixed never lose one), a busy-polling thread that keeps off the CQ
//! while a future looks for its own completion.

use super::*;

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
                        Mr::share(&local),
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

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Count(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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

#[test]
fn caller_driven_progress_without_threads() {
    let s = setup(1, Transport::Auto, config(), Progress::Caller);
    let local = Arc::new(s._a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
    local.write_at(0, b"polled by me").unwrap();
    let mut f = Box::pin(s.qps[0].write(Mr::share(&local), 0, 12, s.target.remote_at(0).unwrap()));
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
fn the_only_operation_in_flight_waits_for_its_completion_before_parking() {
    // Nothing polls the CQ (caller-driven, and nobody calls progress). A single WRITE posts
    // in its first poll, looks at the CQ once, and unless its completion was there asks to
    // be polled again (so that a task posting several
    // operations in one poll posts them all first); in its second poll, still the only
    // operation in flight, it waits for its own completion. With the spin off, it asks for
    // nothing and stays pending until someone polls the CQ.
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
        let count = Arc::new(Count::default());
        let waker = std::task::Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = Box::pin(q.write(Mr::share(&local), 0, 8, target.remote_at(0).unwrap()));
        let first = f.as_mut().poll(&mut cx);
        if let std::task::Poll::Ready((r, _)) = first {
            // The first poll posts and looks at the CQ once: a completion that is there
            // already (the peer answered during the post) resolves it. Never with the spin
            // off.
            assert!(ready, "spin {spin:?}: resolved in the first poll");
            r.unwrap();
            continue;
        }
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

#[test]
fn a_busy_polling_thread_leaves_an_intra_host_completion_to_its_future() {
    // Intra-host, a WRITE completes during its post; its future looks once and resolves in
    // its first poll. A busy-polling thread on the same CQ used to race it for the
    // completion: when the thread had taken it off the CQ but not yet handed it over, the
    // future's look missed it and it had to be polled again (a re-poll, on tokio a reactor
    // poll: ~1 µs against 0.2). The thread now keeps off the CQ while the only operation in
    // flight is looked for by its own future.
    const N: u64 = 4000;
    let (a, b) = (node_on(Transport::Local), node_on(Transport::Local));
    let (qa, _qb) = pair(&a, &b, &config());
    let engine = Engine::new(
        vec![a.cq.clone()],
        EngineConfig {
            progress: Progress::BusyPoll,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let q = engine.wrap(qa);
    let target = b.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let local = Arc::new(a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
    let count = Arc::new(Count::default());
    let waker = std::task::Waker::from(count.clone());
    let mut cx = Context::from_waker(&waker);
    let mut repolled = 0u64;
    for i in 0..N {
        local.write_at(0, &i.to_le_bytes()).unwrap();
        let mut f = Box::pin(q.write(Mr::share(&local), 0, 8, target.remote_at(0).unwrap()));
        let deadline = std::time::Instant::now() + WAIT;
        let mut first = true;
        loop {
            if let std::task::Poll::Ready((r, _)) = f.as_mut().poll(&mut cx) {
                r.unwrap();
                break;
            }
            repolled += first as u64;
            first = false;
            assert!(
                std::time::Instant::now() < deadline,
                "write {i}: no completion"
            );
            std::thread::yield_now();
        }
    }
    let mut got = [0u8; 8];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(u64::from_le_bytes(got), N - 1);
    assert!(
        repolled < N / 50,
        "{repolled} of {N} intra-host WRITEs needed a second poll under a busy-polling thread"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_that_catches_its_completion_by_spinning_costs_no_event() {
    // One WRITE at a time over TCP (the answer comes from the peer's thread, after the
    // post), with a spin long enough to catch every answer: the CQ is armed only for
    // futures that park, so the event task is not woken once per operation (it was, when
    // it re-armed after every event: one wake-up of a worker per WRITE).
    const N: u64 = 300;
    let s = setup_with(
        1,
        Transport::Tcp,
        config(),
        EngineConfig {
            progress: Progress::Event,
            spin: std::time::Duration::from_secs(5),
            ..EngineConfig::default()
        },
    );
    let local = Arc::new(s._a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
    for i in 0..N {
        local.write_at(0, &i.to_le_bytes()).unwrap();
        let (r, _) = tokio::time::timeout(
            WAIT,
            s.qps[0].write(Mr::share(&local), 0, 8, s.target.remote_at(0).unwrap()),
        )
        .await
        .unwrap_or_else(|_| panic!("write {i}: no completion within {WAIT:?}"));
        r.unwrap();
    }
    let mut got = [0u8; 8];
    s.target.read_at(0, &mut got).unwrap();
    assert_eq!(u64::from_le_bytes(got), N - 1);
    let stats = s.engine.stats();
    assert!(stats.completions >= N, "{stats:?}");
    assert!(
        stats.wakeups < N / 4,
        "{} wake-ups of the event task for {N} operations that each spun for their own \
         completion",
        stats.wakeups
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinners_parked_futures_and_dropped_futures_mixed_lose_no_completion() {
    // Lazy arming under a mix: one task WRITEs one at a time (it spins while it is the only
    // operation in flight), another posts joins of 8 (they park, and arm the CQ), a third
    // drops WRITEs in flight (their completions must still free their buffers). Every
    // future must resolve, on both soft transports; a lost arm would hang one (caught by
    // the timeouts).
    for t in transports() {
        let s = Arc::new(setup_with(
            2,
            t,
            config(),
            EngineConfig {
                progress: Progress::Event,
                spin: std::time::Duration::from_micros(200),
                ..EngineConfig::default()
            },
        ));
        let local = Arc::new(
            s._a.pd
                .alloc_mr(1 << 16, AccessFlags::all_remote())
                .unwrap(),
        );
        local.write_at(0, &pattern(1 << 16, 3)).unwrap();
        let single = {
            let (s, local) = (s.clone(), local.clone());
            tokio::spawn(async move {
                for i in 0..400usize {
                    let f = s.qps[0].write(Mr::share(&local), 0, 8, s.target.remote_at(0).unwrap());
                    let (r, _) = tokio::time::timeout(WAIT, f)
                        .await
                        .unwrap_or_else(|_| panic!("{t:?} single {i}: hung"));
                    r.unwrap();
                }
            })
        };
        let joins = {
            let (s, local) = (s.clone(), local.clone());
            tokio::spawn(async move {
                for round in 0..60usize {
                    let futs: Vec<_> = (0..8)
                        .map(|i| {
                            s.qps[i % 2].write(
                                Mr::share(&local),
                                4096 + i * 4096,
                                4096,
                                s.target.remote_at(4096 + i * 4096).unwrap(),
                            )
                        })
                        .collect();
                    for (r, _) in tokio::time::timeout(WAIT, join_all(futs))
                        .await
                        .unwrap_or_else(|_| panic!("{t:?} join round {round}: hung"))
                    {
                        r.unwrap();
                    }
                }
            })
        };
        let drops = {
            let (s, local) = (s.clone(), local.clone());
            tokio::spawn(async move {
                for _ in 0..100usize {
                    let mut f = Box::pin(s.qps[1].write(
                        Mr::share(&local),
                        0,
                        8,
                        s.target.remote_at(8).unwrap(),
                    ));
                    // Posted in the first poll, then dropped in flight.
                    let _ = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await;
                    drop(f);
                    tokio::task::yield_now().await;
                }
            })
        };
        for h in [single, joins, drops] {
            h.await.unwrap();
        }
        // The dropped ones' completions arrive through an armed CQ: nothing stays in flight.
        let deadline = std::time::Instant::now() + WAIT;
        while s.engine.stats().in_flight > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{t:?}: {} operations still in flight",
                s.engine.stats().in_flight
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut got = vec![0u8; 8 * 4096];
        s.target.read_at(4096, &mut got).unwrap();
        assert!(got[..] == pattern(1 << 16, 3)[4096..9 * 4096], "{t:?}");
    }
}

#[test]
fn a_caller_driven_wait_sleeps_on_the_completion_channel_once_its_spins_run_out() {
    // Nothing polls the CQ but the waiting thread. A RECV whose message another thread
    // sends 20 ms later: a wait that only spun would keep its core busy all that time.
    // This one polls for its budget (5 ms at most here), then sleeps on the completion
    // channel, and the message's completion wakes it (a wake-up; a sleep whose slice ran
    // out is none). Each spin that ran out halves the next: after a dozen such waits the
    // budget is gone. Operations whose completions come within the longest spin bring it
    // back (on TCP, where a WRITE's completion takes a round trip; intra-host it is there
    // at the post, and no wait happens).
    let max = std::time::Duration::from_millis(5);
    for t in transports() {
        let s = setup_with(
            1,
            t,
            config(),
            EngineConfig {
                progress: Progress::Caller,
                spin: max,
                ..EngineConfig::default()
            },
        );
        assert_eq!(s.engine.stats().caller_spin, max, "{t:?}");
        let inbox = Arc::new(s._a.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap());
        let message = s._b.pd.alloc_mr(64, AccessFlags::all_remote()).unwrap();
        message.write_at(0, b"late").unwrap();
        let peer = &s._peers[0];
        for round in 0..16u64 {
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    peer.post_send(&[SendWr {
                        wr_id: round,
                        op: WrOp::Send { imm: None },
                        sg_list: &[message.sge(0, 4).unwrap()],
                        signaled: false,
                    }])
                    .unwrap();
                });
                let (r, _) = s.engine.run_until(s.qps[0].recv(Mr::share(&inbox), 0, 64));
                r.unwrap_or_else(|e| panic!("{t:?} round {round}: {e}"));
            });
            let mut got = [0u8; 4];
            inbox.read_at(0, &mut got).unwrap();
            assert_eq!(&got, b"late", "{t:?} round {round}");
        }
        let stats = s.engine.stats();
        assert!(stats.wakeups > 0, "{t:?}: no wait was woken by the channel");
        assert_eq!(
            stats.caller_spin,
            std::time::Duration::ZERO,
            "{t:?}: spins that ran out sixteen times"
        );
        if t == Transport::Tcp {
            for _ in 0..100 {
                let (r, _) = s.engine.run_until(s.qps[0].write(
                    Mr::share(&inbox),
                    0,
                    8,
                    s.target.remote_at(0).unwrap(),
                ));
                r.unwrap();
                if s.engine.stats().caller_spin > std::time::Duration::ZERO {
                    break;
                }
            }
            assert!(
                s.engine.stats().caller_spin >= max / 8,
                "{t:?}: completions within the longest spin did not bring it back"
            );
        }
    }
}

#[test]
fn completions_nobody_polls_for_give_their_queue_entries_back() {
    // A send queue of 4, filled by 4 WRITEs whose futures are posted and then never polled
    // again (a batch a caller set aside, as a store's frees under way). Their completions
    // free the queue: a fifth WRITE must post and complete while they sit unpolled. Queue
    // entries given back only when a future was polled again kept the fifth waiting for
    // good (the exists_many stall of issue #44, from frees nobody drove).
    for progress in [Progress::Caller, Progress::BusyPoll] {
        let cfg = QpConfig {
            max_send_wr: 4,
            ..config()
        };
        // No spin: a future parks in its first poll, whatever came back meanwhile.
        let engine = EngineConfig {
            progress,
            spin: std::time::Duration::ZERO,
            ..EngineConfig::default()
        };
        let s = setup_with(1, Transport::Tcp, cfg, engine);
        let local = Arc::new(s._a.pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap());
        local.write_at(0, &pattern(4096, 5)).unwrap();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let write = |at: usize| {
            Box::pin(s.qps[0].write(Mr::share(&local), at, 8, s.target.remote_at(at).unwrap()))
        };
        // Each parks posted.
        let mut aside: Vec<_> = (0..4).map(|i| write(i * 8)).collect();
        for f in &mut aside {
            assert!(f.as_mut().poll(&mut cx).is_pending(), "{progress:?}");
        }
        let mut fifth = write(64);
        let until = std::time::Instant::now() + WAIT;
        let done = loop {
            if let Poll::Ready(r) = fifth.as_mut().poll(&mut cx) {
                break r;
            }
            s.engine.progress();
            assert!(
                std::time::Instant::now() < until,
                "{progress:?}: the fifth WRITE waited for the queue entries of completed \
                 operations nobody polled ({:?})",
                s.engine.stats()
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        };
        done.0.unwrap();
        // The ones set aside still resolve when polled.
        for mut f in aside {
            let (r, _) = s
                .engine
                .run_until(std::future::poll_fn(|cx| f.as_mut().poll(cx)));
            r.unwrap();
        }
        let mut got = [0u8; 8];
        s.target.read_at(64, &mut got).unwrap();
        assert_eq!(got[..], pattern(4096, 5)[64..72]);
    }
}
