//! Two real processes: opcodes across them, a peer killed or frozen mid-stream, malformed
//! frames from a raw socket, and the locked-memory limit in a process that lacks
//! CAP_IPC_LOCK.
//!
//! The child side is this same test binary, re-run with `RDMAPOOL_TEST_CHILD` set so that
//! only `child_entry` does anything. Lines starting with `@` are the protocol between them.

use crate::support::child::{parent_line as stdin_line, Child as Peer};
use crate::support::*;
use rdmapool::fabric::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

const ALL: AccessFlags = AccessFlags::all_remote();
const REGION: usize = 1 << 20;

/// The child's side. Roles: `target` (exports a region, serves until told to stop),
/// `writer` (connects and writes into the parent's region forever), `memlock` (lowers its
/// locked-memory limit, drops root, and reports what registration does).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("RDMAPOOL_TEST_CHILD") else {
        return; // an ordinary test run: nothing to do
    };
    let transport = Transport::parse(&std::env::var("T").unwrap_or("auto".into())).unwrap();
    match role.as_str() {
        "target" => {
            let n = node_on(transport);
            let mr = n.pd.alloc_mr(REGION, ALL).unwrap();
            let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
            let rbuf = n.pd.alloc_mr(4096, ALL).unwrap();
            qp.modify_to_init().unwrap();
            qp.post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &[rbuf.sge(0, 4096).unwrap()],
            }])
            .unwrap();
            println!(
                "@{} {}",
                qp.endpoint().to_hex(),
                mr.remote_region().to_hex()
            );
            let peer = Endpoint::from_hex(&stdin_line()).unwrap();
            qp.modify_to_rtr(&peer).unwrap();
            qp.modify_to_rts().unwrap();
            println!("@ready");
            // Serve one-sided traffic until stdin closes; answer "recv" (report the SEND
            // that arrives) and "dump OFFSET LEN" (show our own view of the region).
            loop {
                let cmd = stdin_line();
                let mut words = cmd.split(' ');
                match words.next() {
                    Some("recv") => {
                        let c = one(&n.cq);
                        let mut got = vec![0u8; c.byte_len as usize];
                        rbuf.read_at(0, &mut got).unwrap();
                        println!(
                            "@recv {} {}",
                            c.imm.unwrap_or(0),
                            String::from_utf8_lossy(&got)
                        );
                    }
                    Some("dump") => {
                        let off: usize = words.next().unwrap().parse().unwrap();
                        let len: usize = words.next().unwrap().parse().unwrap();
                        let mut b = vec![0u8; len];
                        mr.read_at(off, &mut b).unwrap();
                        println!(
                            "@dump {}",
                            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
                        );
                    }
                    _ => break,
                }
            }
        }
        "writer" => {
            let n = node_on(transport);
            let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
            println!("@{}", qp.endpoint().to_hex());
            let mut parts = stdin_line()
                .split(' ')
                .map(String::from)
                .collect::<Vec<_>>()
                .into_iter();
            let peer = Endpoint::from_hex(&parts.next().unwrap()).unwrap();
            let region = RemoteRegion::from_hex(&parts.next().unwrap()).unwrap();
            qp.connect(&peer).unwrap();
            let src = n.pd.alloc_mr(4096, ALL).unwrap();
            src.write_at(0, &[0xee; 4096]).unwrap();
            println!("@ready");
            let sg = [src.sge(0, 4096).unwrap()];
            for i in 0u64.. {
                let remote = region.at((i % 200) * 4096).unwrap();
                qp.post_send(&[write_wr(i, remote, &sg)]).unwrap();
                assert!(one(&n.cq).is_ok());
            }
        }
        "adder" => {
            // FAA +1 on the parent's word N times, one at a time, then report.
            let n = node_on(transport);
            let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
            println!("@{}", qp.endpoint().to_hex());
            let line = stdin_line();
            let (ep, region) = line.split_once(' ').unwrap();
            let region = RemoteRegion::from_hex(region).unwrap();
            qp.connect(&Endpoint::from_hex(ep).unwrap()).unwrap();
            let res = n.pd.alloc_mr(8, ALL).unwrap();
            let sg = [res.sge(0, 8).unwrap()];
            let count: u64 = std::env::var("N").unwrap().parse().unwrap();
            for i in 0..count {
                let op = WrOp::FetchAdd {
                    remote: region.at(0).unwrap(),
                    add: 1,
                };
                qp.post_send(&[SendWr {
                    wr_id: i,
                    op,
                    sg_list: &sg,
                    signaled: true,
                }])
                .unwrap();
                assert!(one(&n.cq).is_ok());
            }
            println!("@done");
        }
        "open-verbs" => {
            match ProviderOptions::from_env(ProviderKind::Verbs, None).and_then(Context::open) {
                Ok(_) => println!("@ok"),
                Err(e) => println!("@err {e}"),
            }
        }
        "registrar-memlock" => {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            // SAFETY: plain syscalls on this child process only.
            unsafe {
                assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
                if libc::geteuid() == 0 {
                    assert_eq!(libc::setgid(65534), 0);
                    assert_eq!(libc::setuid(65534), 0);
                }
            }
            use rdmapool::mr::{Registrar, RegistrarConfig, RetryPolicy};
            let n = node_on(transport);
            let retry = RetryPolicy {
                max_retries: 3,
                initial_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(4),
            };
            let reg = Registrar::new(
                n.pd.clone(),
                RegistrarConfig {
                    workers: 1,
                    retry,
                    timeout: None,
                },
            )
            .unwrap();
            // Larger than the whole limit: it can never fit, so it is not retried.
            let r = reg.submit(8 << 20, ALL).wait();
            println!(
                "@oversize {} {}",
                reg.stats().retries,
                r.err().map(|e| e.to_string()).unwrap_or_default()
            );
            // Fits the limit, but not beside what is pinned now: ENOMEM, retried.
            let hold = n.pd.alloc_mr(768 << 10, ALL).unwrap();
            let r = reg.submit(512 << 10, ALL).wait();
            println!(
                "@retried {} {}",
                reg.stats().retries,
                r.err().map(|e| e.to_string()).unwrap_or_default()
            );
            let slow = RetryPolicy {
                max_retries: 1000,
                initial_delay: Duration::from_millis(20),
                max_delay: Duration::from_millis(20),
            };
            let cfg = RegistrarConfig {
                workers: 1,
                retry: slow,
                timeout: Some(Duration::from_millis(100)),
            };
            let reg = Registrar::new(n.pd.clone(), cfg).unwrap();
            let r = reg.submit(512 << 10, ALL).wait();
            drop(hold);
            println!(
                "@timeout {} {}",
                reg.stats().timed_out,
                r.err().map(|e| e.to_string()).unwrap_or_default()
            );
            let ok = reg.submit(64 * 1024, ALL).wait();
            println!("@small {}", ok.is_ok());
            drop(ok);
            println!(
                "@pinned {} {}",
                rdmapool::metrics::pinned_bytes(),
                n.ctx.live_regions()
            );
        }
        "leak-check" => {
            // Every registration path, one after another in a process of its own, reporting
            // pinned bytes and live regions after each.
            use rdmapool::buf::{BufferPool, PoolConfig};
            use rdmapool::mr::{
                CacheConfig, HugeOptions, HugeRegion, PreRegRing, RegCache, Registrar,
                RegistrarConfig, HUGE_PAGE,
            };
            let n = node_on(transport);
            let report = |what: &str| {
                println!(
                    "@{what} {} {}",
                    rdmapool::metrics::pinned_bytes(),
                    n.ctx.live_regions()
                )
            };
            {
                let reg = Registrar::new(n.pd.clone(), RegistrarConfig::default()).unwrap();
                for i in 0..100 {
                    let h = reg.submit(64 << 10, ALL);
                    if i % 3 == 0 {
                        h.cancel();
                    } else if i % 3 == 1 {
                        drop(h.wait());
                    }
                }
                let mut ring = PreRegRing::new(&reg, 3, 1 << 20, ALL).unwrap();
                drop(ring.take().unwrap());
                drop(ring);
                let huge = HugeRegion::alloc(4 * HUGE_PAGE, HugeOptions::default()).unwrap();
                // SAFETY: `huge` outlives the registrations dropped inside this block.
                unsafe {
                    drop(
                        reg.register_chunked(huge.as_ptr(), huge.len(), HUGE_PAGE, u64::MAX)
                            .unwrap(),
                    );
                    drop(
                        reg.register_batch(
                            &[(huge.as_ptr(), 100), (huge.as_ptr().add(5000), 100)],
                            ALL,
                        )
                        .unwrap(),
                    );
                }
            }
            report("registrar");
            {
                let cache = RegCache::new(
                    n.pd.clone(),
                    CacheConfig {
                        max_entries: 4,
                        ..CacheConfig::default()
                    },
                )
                .unwrap();
                let bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![1u8; 1 << 16]).collect();
                for b in &bufs {
                    // SAFETY: `bufs` outlives the cache.
                    drop(unsafe { cache.get(b.as_ptr(), b.len()) }.unwrap());
                }
                cache.invalidate(bufs[7].as_ptr(), 1);
            }
            report("cache");
            {
                let pool = BufferPool::new(
                    n.pd.clone(),
                    PoolConfig {
                        chunks_per_class: 2,
                        ..PoolConfig::default()
                    },
                )
                .unwrap();
                let held: Vec<_> = (0..100)
                    .map(|_| pool.alloc_wait(4096, WAIT).unwrap())
                    .collect();
                drop(held);
            }
            report("pool");
        }
        "memlock" => {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            // SAFETY: plain syscalls on this child process only.
            unsafe {
                assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
                if libc::geteuid() == 0 {
                    // Root with CAP_IPC_LOCK ignores the limit: become nobody to lose it.
                    assert_eq!(libc::setgid(65534), 0);
                    assert_eq!(libc::setuid(65534), 0);
                }
            }
            let n = node_on(transport);
            let small = n.pd.alloc_mr(64 * 1024, ALL).map(|_| ());
            println!("@small {:?}", small.err().map(|e| e.to_string()));
            match n.pd.alloc_mr(8 << 20, ALL) {
                Ok(_) => println!("@big ok"),
                Err(e) => println!("@big {}", e),
            }
            println!("@pinned {}", rdmapool::metrics::pinned_bytes());
        }
        "ordinary-account" => {
            // An ordinary account's locked-memory limit: `ulimit -l` 8192 (KiB).
            let lim = libc::rlimit {
                rlim_cur: ORDINARY_MEMLOCK,
                rlim_max: ORDINARY_MEMLOCK,
            };
            // SAFETY: plain syscalls on this child process only.
            unsafe {
                assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
                if libc::geteuid() == 0 {
                    // Root with CAP_IPC_LOCK ignores the limit: become nobody to lose it.
                    assert_eq!(libc::setgid(65534), 0);
                    assert_eq!(libc::setuid(65534), 0);
                }
            }
            use rdmapool::buf::{BufferPool, PoolConfig};
            let n = node_on(transport);
            match BufferPool::new(n.pd.clone(), PoolConfig::default()) {
                Ok(pool) => {
                    // The pool's own count, and the process's (nothing else is registered).
                    println!(
                        "@default ok {} {}",
                        pool.stats().bytes_registered,
                        rdmapool::metrics::pinned_bytes()
                    );
                    // Room left beside it: the demo's 1 MiB, and more.
                    let beside = n.pd.alloc_mr(2 << 20, ALL).map(|_| ());
                    println!("@beside {:?}", beside.err().map(|e| e.to_string()));
                }
                Err(e) => println!("@default {e}"),
            }
            // Under a limit smaller than one chunk, `new` fails, and says how to raise it.
            let tiny = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            // SAFETY: lowering this process's own limit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &tiny) }, 0);
            match BufferPool::new(n.pd.clone(), PoolConfig::default()) {
                Ok(_) => println!("@tiny ok"),
                Err(e) => println!("@tiny {e}"),
            }
        }
        r => panic!("unknown child role {r}"),
    }
    std::process::exit(0);
}

/// Parent initiator against a child target: every opcode, verified.
fn connect_to_target(t: Transport) -> (Peer, Node, Qp, RemoteRegion) {
    let mut peer = Peer::spawn(
        module_path!(),
        "target",
        &[("T", if t == Transport::Tcp { "tcp" } else { "local" })],
    );
    let first = peer.line();
    let (ep, region) = first.split_once(' ').unwrap();
    let remote_ep = Endpoint::from_hex(ep).unwrap();
    let region = RemoteRegion::from_hex(region).unwrap();
    let n = node_on(t);
    let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
    qp.modify_to_init().unwrap();
    peer.say(&qp.endpoint().to_hex());
    assert_eq!(peer.line(), "ready");
    qp.modify_to_rtr(&remote_ep).unwrap();
    qp.modify_to_rts().unwrap();
    (peer, n, qp, region)
}

#[test]
fn two_processes_every_opcode() {
    for t in transports() {
        let (mut peer, n, qp, region) = connect_to_target(t);
        let buf = n.pd.alloc_mr(REGION, ALL).unwrap();
        let data = pattern(REGION, 5);
        buf.write_at(0, &data).unwrap();
        qp.post_send(&[write_wr(
            1,
            region.at(0).unwrap(),
            &[buf.sge(0, REGION as u32).unwrap()],
        )])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        let back = n.pd.alloc_mr(REGION, ALL).unwrap();
        qp.post_send(&[read_wr(
            2,
            region.at(0).unwrap(),
            &[back.sge(0, REGION as u32).unwrap()],
        )])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(contents(&back), data, "{t:?}: read back what was written");
        let word = region.at(64).unwrap();
        let before = u64::from_ne_bytes(data[64..72].try_into().unwrap());
        let sg = [buf.sge(0, 8).unwrap()];
        let faa = WrOp::FetchAdd {
            remote: word,
            add: 10,
        };
        qp.post_send(&[SendWr {
            wr_id: 3,
            op: faa,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(buf.read_u64(0).unwrap(), before);
        let cas = WrOp::CompareSwap {
            remote: word,
            compare: before.wrapping_add(10),
            swap: 99,
        };
        qp.post_send(&[SendWr {
            wr_id: 4,
            op: cas,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(buf.read_u64(0).unwrap(), before.wrapping_add(10));
        qp.post_send(&[read_wr(5, word, &sg)]).unwrap();
        assert!(one(&n.cq).is_ok());
        assert_eq!(buf.read_u64(0).unwrap(), 99);
        buf.write_at(0, b"over there").unwrap();
        let send = WrOp::Send { imm: Some(7) };
        qp.post_send(&[SendWr {
            wr_id: 6,
            op: send,
            sg_list: &[buf.sge(0, 10).unwrap()],
            signaled: true,
        }])
        .unwrap();
        assert!(one(&n.cq).is_ok());
        peer.say("recv");
        assert_eq!(peer.line(), "recv 7 over there", "{t:?}");
        let seen = peer_dump(&mut peer, 0, 4096);
        assert!(
            seen[..64] == data[..64],
            "{t:?}: the target's own view before the word"
        );
        assert_eq!(
            u64::from_ne_bytes(seen[64..72].try_into().unwrap()),
            99,
            "{t:?}: the word"
        );
        assert!(
            seen[72..] == data[72..4096],
            "{t:?}: the target's own view after the word"
        );
    }
}

#[test]
fn killed_target_fails_outstanding_requests_and_others_keep_working() {
    if soft_only("peer death over the soft transports") {
        return;
    }
    for t in transports() {
        let (peer, n, qp, region) = connect_to_target(t);
        let buf = n.pd.alloc_mr(64 * 1024, ALL).unwrap();
        let sg = [buf.sge(0, 64 * 1024).unwrap()];
        // Keep a window of writes outstanding, kill the target in the middle, and go on
        // posting until the death is noticed (process teardown takes a moment).
        let mut statuses = Vec::new();
        let started = Instant::now();
        let mut posted = 0u64;
        loop {
            if (posted as usize) < statuses.len() + 16
                && qp
                    .post_send(&[write_wr(posted, region.at(0).unwrap(), &sg)])
                    .is_ok()
            {
                posted += 1;
            }
            if posted == 200 && started.elapsed() < WAIT {
                peer.signal(libc::SIGKILL);
            }
            let mut c = [Completion::EMPTY; 16];
            let k = n.cq.poll(&mut c).unwrap();
            statuses.extend(c[..k].iter().map(|c| c.status));
            assert!(
                started.elapsed() < WAIT * 2,
                "{t:?}: hung after the peer died"
            );
            if qp.state() == QpState::Error && statuses.len() as u64 == posted {
                break;
            }
        }
        assert_eq!(qp.state(), QpState::Error, "{t:?}");
        let first_err = statuses
            .iter()
            .position(|s| *s != WcStatus::Success)
            .expect("an error completion");
        // Whichever the NIC noticed first: the request connection breaking (RETRY_EXC_ERR)
        // or the peer's own connection ending, which moves the QP to ERR (WR_FLUSH_ERR).
        assert!(
            matches!(
                statuses[first_err],
                WcStatus::RetryExcErr | WcStatus::WrFlushErr
            ),
            "{t:?}: {:?}",
            statuses[first_err]
        );
        assert_eq!(
            qp.wait_event(WAIT),
            Some(QpEvent::PeerDisconnected),
            "{t:?}: the passive half learns of the death too"
        );
        assert!(
            statuses[first_err + 1..]
                .iter()
                .all(|s| *s == WcStatus::WrFlushErr),
            "{t:?}"
        );
        // The surviving process still serves and uses other QPs.
        let other = node_on(t);
        let (qa, _qb) = pair(&other, &n, &config());
        let target = n.pd.alloc_mr(4096, ALL).unwrap();
        let src = other.pd.alloc_mr(4096, ALL).unwrap();
        src.write_at(0, b"alive").unwrap();
        qa.post_send(&[write_wr(
            1,
            target.remote_at(0).unwrap(),
            &[src.sge(0, 5).unwrap()],
        )])
        .unwrap();
        assert!(one(&other.cq).is_ok());
        assert_eq!(&contents(&target)[..5], b"alive");
    }
}

/// A target process connected over TCP (`n` must take TCP) and then frozen (SIGSTOP): its
/// socket stays open and nothing answers. Returns the child (continue it when done), the QP
/// and the region.
fn frozen_target(n: &Node, timeout: Duration) -> (Peer, Qp, RemoteRegion) {
    let mut peer = Peer::spawn(module_path!(), "target", &[("T", "tcp")]);
    let first = peer.line();
    let (ep, region) = first.split_once(' ').unwrap();
    let region = RemoteRegion::from_hex(region).unwrap();
    let cfg = QpConfig {
        timeout,
        ..config()
    };
    let qp = n.pd.create_qp(&n.cq, &n.cq, &cfg).unwrap();
    qp.modify_to_init().unwrap();
    peer.say(&qp.endpoint().to_hex());
    assert_eq!(peer.line(), "ready");
    qp.modify_to_rtr(&Endpoint::from_hex(ep).unwrap()).unwrap();
    qp.modify_to_rts().unwrap();
    peer.signal(libc::SIGSTOP);
    // Wait until the kernel reports it stopped (state T in /proc/PID/stat).
    let stat = format!("/proc/{}/stat", peer.pid());
    let until = Instant::now() + WAIT;
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        assert!(Instant::now() < until, "child never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    (peer, qp, region)
}

#[test]
fn frozen_target_times_out_instead_of_hanging() {
    if soft_only("a frozen target process (a NIC serves it on verbs)") {
        return;
    }
    let n = node_on(Transport::Tcp);
    let (peer, qp, region) = frozen_target(&n, Duration::from_millis(500));
    let buf = n.pd.alloc_mr(4096, ALL).unwrap();
    n.cq.req_notify().unwrap();
    qp.post_send(&[read_wr(1, region.at(0).unwrap(), &[buf.sge(0, 8).unwrap()])])
        .unwrap();
    // Nobody polls: the timeout must still fire and signal the completion channel (the
    // NIC's own thread retries out the request, as a NIC does).
    let mut p = libc::pollfd {
        fd: n.cq.event_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our stack.
    let ready = unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as i32) };
    assert_eq!(ready, 1, "no completion event without polling");
    n.cq.ack_events().unwrap();
    let c = one(&n.cq);
    assert_eq!(c.status, WcStatus::RetryExcErr);
    assert_eq!(qp.state(), QpState::Error);
    peer.signal(libc::SIGCONT);
}

#[test]
fn an_event_driven_future_learns_of_a_frozen_target_with_no_tick() {
    use rdmapool::cq::{Engine, EngineConfig, Progress};
    if soft_only("a frozen target process (a NIC serves it on verbs)") {
        return;
    }
    let n = node_on(Transport::Tcp);
    let (peer, qp, region) = frozen_target(&n, Duration::from_millis(300));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = EngineConfig {
            progress: Progress::Event,
            ..EngineConfig::default()
        };
        let engine = Engine::new(vec![n.cq.clone()], cfg).unwrap();
        let aqp = engine.wrap(qp);
        let buf = n.pd.alloc_mr(4096, ALL).unwrap();
        let op = aqp.read(buf, 0, 8, region.at(0).unwrap());
        let (r, _buf) = tokio::time::timeout(WAIT, op)
            .await
            .expect("the future resolved through the completion channel alone");
        match r {
            Err(rdmapool::Error::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::RetryExcErr)
            }
            other => panic!("expected a retry-exceeded completion, got {other:?}"),
        }
    });
    peer.signal(libc::SIGCONT);
}

#[test]
fn killed_initiator_leaves_the_target_serving() {
    if soft_only("peer death over the soft transports") {
        return;
    }
    for t in transports() {
        let n = node_on(t);
        let mr = n.pd.alloc_mr(REGION, ALL).unwrap();
        let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
        let mut peer = Peer::spawn(
            module_path!(),
            "writer",
            &[("T", if t == Transport::Tcp { "tcp" } else { "local" })],
        );
        let ep = Endpoint::from_hex(&peer.line()).unwrap();
        qp.connect(&ep).unwrap();
        peer.say(&format!(
            "{} {}",
            qp.endpoint().to_hex(),
            mr.remote_region().to_hex()
        ));
        assert_eq!(peer.line(), "ready");
        // Wait until its writes are landing, then kill it mid-stream.
        let until = Instant::now() + WAIT;
        while mr.read_u64(0).unwrap() != u64::from_ne_bytes([0xee; 8]) {
            assert!(Instant::now() < until, "writer never wrote");
            std::thread::sleep(Duration::from_millis(1));
        }
        peer.signal(libc::SIGKILL);
        peer.wait();
        // The target process keeps serving other QPs.
        let other = node_on(t);
        let (qa, _qb) = pair(&other, &n, &config());
        let src = other.pd.alloc_mr(4096, ALL).unwrap();
        src.write_at(0, b"still here").unwrap();
        qa.post_send(&[write_wr(
            1,
            mr.remote_at(REGION - 10).unwrap(),
            &[src.sge(0, 10).unwrap()],
        )])
        .unwrap();
        assert!(one(&other.cq).is_ok(), "{t:?}");
        let mut tail = [0u8; 10];
        mr.read_at(REGION - 10, &mut tail).unwrap();
        assert_eq!(&tail, b"still here");
    }
}

/// A request frame: WRITE of `len` bytes at `addr` with `rkey`.
fn write_request(addr: u64, rkey: u32, len: u32) -> [u8; 56] {
    let mut b = [0u8; 56];
    b[0..4].copy_from_slice(b"RDRQ");
    b[4] = 2;
    b[5] = 2;
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..28].copy_from_slice(&rkey.to_le_bytes());
    b[28..32].copy_from_slice(&len.to_le_bytes());
    b
}

/// True when the peer closed the connection (EOF or reset) within the wait.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // e.g. the hello acknowledgement
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// A target QP in RTS (bound to a throwaway peer's QP) and a raw connection to it that
/// passed the handshake as that peer, ready to send requests by hand.
fn authenticated_raw(target: &Node, peer: &Node) -> (Qp, Qp, TcpStream) {
    let qp = target
        .pd
        .create_qp(&target.cq, &target.cq, &config())
        .unwrap();
    let pq = peer.pd.create_qp(&peer.cq, &peer.cq, &config()).unwrap();
    qp.connect(&pq.endpoint()).unwrap();
    let t = rawpeer::SoftTarget::of(&qp.endpoint());
    let mut raw = rawpeer::Raw::tcp(&t);
    let st = raw.hello(pq.qpn(), t.qpn, &t.token, None).unwrap();
    assert_eq!(st, rawpeer::status::OK);
    match raw {
        rawpeer::Raw::Tcp(s) => (qp, pq, s),
        rawpeer::Raw::Unix(_) => unreachable!(),
    }
}

#[test]
fn malformed_frames_close_only_that_connection() {
    if soft_only("the soft wire format") {
        return;
    }
    let target = node_on(Transport::Tcp);
    let peer = node_on(Transport::Tcp);
    let mr = target.pd.alloc_mr(4096, ALL).unwrap();
    let before = pattern(4096, 1);
    mr.write_at(0, &before).unwrap();

    // Bad hellos: the connection closes, nothing is executed.
    let qp = target
        .pd
        .create_qp(&target.cq, &target.cq, &config())
        .unwrap();
    let t = rawpeer::SoftTarget::of(&qp.endpoint());
    let bad_hellos: Vec<(&str, Vec<u8>)> = vec![
        ("garbage instead of hello", vec![0xff; 48]),
        ("hello with a future version", {
            let mut h = rawpeer::hello_frame(9, t.qpn, false, &[0; 32]);
            h[4] = 3;
            h.to_vec()
        }),
        (
            "hello for a QP that does not exist",
            rawpeer::hello_frame(9, 0xdead, false, &[0; 32]).to_vec(),
        ),
    ];
    for (what, bytes) in bad_hellos {
        let mut s = TcpStream::connect(t.tcp).unwrap();
        let mut ch = [0u8; 24];
        s.read_exact(&mut ch).unwrap();
        s.write_all(&bytes).unwrap();
        s.write_all(&write_request(mr.addr(), mr.rkey(), 16))
            .unwrap();
        assert!(closed_by_peer(&mut s), "{what}: connection left open");
        assert_eq!(contents(&mr), before, "{what}: memory touched");
    }

    // Bad requests after a good handshake (each on a QP of its own: an RC QP takes one
    // connection): the connection closes, memory is untouched.
    let mut good = write_request(mr.addr(), mr.rkey(), 16);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad magic", vec![0u8; 56]),
        ("unknown opcode", {
            let mut r = good;
            r[5] = 99;
            r.to_vec()
        }),
        (
            "oversized length",
            write_request(mr.addr(), mr.rkey(), u32::MAX).to_vec(),
        ),
        ("reserved bits", {
            let mut r = good;
            r[55] = 1;
            r.to_vec()
        }),
        ("truncated header", good[..30].to_vec()),
    ];
    for (what, bytes) in cases {
        let (_qp, _pq, mut s) = authenticated_raw(&target, &peer);
        s.write_all(&bytes).unwrap();
        if what == "truncated header" {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        assert!(closed_by_peer(&mut s), "{what}: connection left open");
        assert_eq!(contents(&mr), before, "{what}: memory touched");
    }
    // A well-formed request on a raw socket is executed: the wire format is what we say.
    good[8] = 0;
    let (_qp, _pq, mut s) = authenticated_raw(&target, &peer);
    s.write_all(&[good.as_slice(), &[0xab; 16]].concat())
        .unwrap();
    let mut resp = [0u8; 32];
    s.read_exact(&mut resp).unwrap();
    assert_eq!(&resp[0..4], b"RDRS");
    assert_eq!(resp[5], 1, "ACK");
    assert_eq!(&contents(&mr)[..16], &[0xab; 16]);
    // The NIC keeps serving ordinary QPs.
    let (qa, _qb) = pair(&peer, &target, &config());
    let src = peer.pd.alloc_mr(4096, ALL).unwrap();
    src.write_at(0, b"ok").unwrap();
    qa.post_send(&[write_wr(
        1,
        mr.remote_at(100).unwrap(),
        &[src.sge(0, 2).unwrap()],
    )])
    .unwrap();
    assert!(one(&peer.cq).is_ok());
}

#[test]
fn exceeding_the_memlock_limit_is_a_clear_error() {
    if soft_only("mlock accounting in an unprivileged child") {
        return;
    }
    let mut peer = Peer::spawn(module_path!(), "memlock", &[]);
    assert_eq!(peer.line(), "small None", "64 KiB fits under a 1 MiB limit");
    let big = peer.line();
    assert!(
        big.contains("RLIMIT_MEMLOCK") && big.contains("ulimit -l"),
        "{big}"
    );
    assert!(big.contains("1048576 bytes"), "names the limit: {big}");
    assert_eq!(
        peer.line(),
        "pinned 0",
        "failed and dropped registrations unpin everything"
    );
}

/// RLIMIT_MEMLOCK of an ordinary account (`ulimit -l` 8192 KiB), the budget the README
/// promises is enough.
const ORDINARY_MEMLOCK: u64 = 8 << 20;

/// A default buffer pool fits an ordinary account's 8 MiB locked-memory limit with room to
/// spare, in a child that really has that limit (and, run as root, no CAP_IPC_LOCK). With
/// the old default (one 2 MiB chunk per class: 16 MiB) `new` failed here.
#[test]
fn a_default_pool_fits_an_ordinary_accounts_memlock_limit() {
    if soft_only("mlock accounting in an unprivileged child") {
        return;
    }
    let mut peer = Peer::spawn(module_path!(), "ordinary-account", &[]);
    let default = peer.line();
    let Some(counts) = default.strip_prefix("default ok ") else {
        panic!("the default pool under an 8 MiB limit: {default}");
    };
    let counts: Vec<u64> = counts.split(' ').map(|n| n.parse().unwrap()).collect();
    assert_eq!(counts[0], 4 << 20, "the pool's registered bytes");
    assert!(
        counts[1] <= ORDINARY_MEMLOCK / 2,
        "{} bytes pinned: more than half the limit",
        counts[1]
    );
    assert_eq!(peer.line(), "beside None", "2 MiB more fit beside it");
    let tiny = peer.line();
    assert!(
        tiny.contains("RLIMIT_MEMLOCK") && tiny.contains("ulimit -l") && tiny.contains("1048576"),
        "a pool over the limit names it and the fix: {tiny}"
    );
}

/// Waits until the kernel reports the child stopped (state T in /proc/PID/stat).
fn wait_stopped(peer: &Peer) {
    let stat = format!("/proc/{}/stat", peer.pid());
    let until = Instant::now() + WAIT;
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        assert!(Instant::now() < until, "child never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn local_path_needs_no_target_cpu() {
    if soft_only("the soft intra-host path") {
        return;
    }
    // Once the region is mapped, one-sided operations on the local path are executed by the
    // initiator alone: they keep working while the target process is frozen.
    let (mut peer, n, qp, region) = connect_to_target(Transport::Local);
    let buf = n.pd.alloc_mr(4096, ALL).unwrap();
    let sg = [buf.sge(0, 8).unwrap()];
    let faa = |add| SendWr {
        wr_id: 1,
        op: WrOp::FetchAdd {
            remote: region.at(0).unwrap(),
            add,
        },
        sg_list: &sg,
        signaled: true,
    };
    qp.post_send(&[faa(1)]).unwrap();
    assert!(one(&n.cq).is_ok());
    let start = buf.read_u64(0).unwrap();
    peer.signal(libc::SIGSTOP);
    wait_stopped(&peer);
    for i in 1..=100u64 {
        qp.post_send(&[faa(1)]).unwrap();
        assert!(one(&n.cq).is_ok(), "FAA {i} with the target frozen");
        assert_eq!(buf.read_u64(0).unwrap(), start + i);
    }
    buf.write_at(8, b"frozen!!").unwrap();
    qp.post_send(&[write_wr(
        2,
        region.at(64).unwrap(),
        &[buf.sge(8, 8).unwrap()],
    )])
    .unwrap();
    assert!(one(&n.cq).is_ok());
    peer.signal(libc::SIGCONT);
    assert_eq!(peer_dump(&mut peer, 64, 8), b"frozen!!");
}

/// What the child target sees in its own region.
fn peer_dump(peer: &mut Peer, offset: usize, len: usize) -> Vec<u8> {
    peer.say(&format!("dump {offset} {len}"));
    let line = peer.line();
    let hex = line.strip_prefix("dump ").expect("a dump line");
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn atomics_from_several_processes_and_paths_are_atomic_together() {
    // Two processes add to one word of ours, one through the zero-copy local path (its CPU
    // does the atomic on the shared page) and one over TCP (our emulated NIC does it), while
    // a QP of this process adds too. No update may be lost.
    const N: u64 = 3000;
    let n = node();
    let mr = n.pd.alloc_mr(4096, ALL).unwrap();
    let mut children = Vec::new();
    let mut qps = Vec::new();
    for t in ["local", "tcp"] {
        let mut peer = Peer::spawn(module_path!(), "adder", &[("T", t), ("N", &N.to_string())]);
        let ep = Endpoint::from_hex(&peer.line()).unwrap();
        // The child's path is its own (T); ours only carries its connection's requests.
        let qp = n.pd.create_qp(&n.cq, &n.cq, &config()).unwrap();
        qp.connect(&ep).unwrap();
        peer.say(&format!(
            "{} {}",
            qp.endpoint().to_hex(),
            mr.remote_region().to_hex()
        ));
        children.push(peer);
        qps.push(qp);
    }
    let me = node_on(Transport::Local);
    let (qa, _qb) = pair(&me, &n, &config());
    let res = me.pd.alloc_mr(8, ALL).unwrap();
    let sg = [res.sge(0, 8).unwrap()];
    for i in 0..N {
        let op = WrOp::FetchAdd {
            remote: mr.remote_at(0).unwrap(),
            add: 1,
        };
        qa.post_send(&[SendWr {
            wr_id: i,
            op,
            sg_list: &sg,
            signaled: true,
        }])
        .unwrap();
        assert!(one(&me.cq).is_ok());
    }
    for c in &mut children {
        assert_eq!(c.line(), "done");
    }
    assert_eq!(mr.read_u64(0).unwrap(), 3 * N);
}

/// Two network namespaces joined by a veth pair: two "hosts" on this machine.
struct TwoHosts {
    a: String,
    b: String,
    addr_a: String,
    addr_b: String,
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl TwoHosts {
    /// None (with the reason) where namespaces cannot be made: not root, or no `ip`.
    fn new() -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        if !sh(&["ip", "-V"]) {
            return Err("iproute2's ip not installed".into());
        }
        let id = std::process::id();
        let (a, b) = (format!("rdmapool-a-{id}"), format!("rdmapool-b-{id}"));
        let subnet = format!("10.{}.{}", 200 + id % 50, (id / 50) % 250);
        let (addr_a, addr_b) = (format!("{subnet}.1"), format!("{subnet}.2"));
        let (va, vb) = (format!("rpa{}", id % 100000), format!("rpb{}", id % 100000));
        let hosts = TwoHosts {
            a,
            b,
            addr_a,
            addr_b,
        };
        let ok = sh(&["ip", "netns", "add", &hosts.a])
            && sh(&["ip", "netns", "add", &hosts.b])
            && sh(&[
                "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
            ])
            && sh(&["ip", "link", "set", &va, "netns", &hosts.a])
            && sh(&["ip", "link", "set", &vb, "netns", &hosts.b])
            && sh(&[
                "ip",
                "-n",
                &hosts.a,
                "addr",
                "add",
                &format!("{}/24", hosts.addr_a),
                "dev",
                &va,
            ])
            && sh(&[
                "ip",
                "-n",
                &hosts.b,
                "addr",
                "add",
                &format!("{}/24", hosts.addr_b),
                "dev",
                &vb,
            ])
            && sh(&["ip", "-n", &hosts.a, "link", "set", &va, "up"])
            && sh(&["ip", "-n", &hosts.b, "link", "set", &vb, "up"])
            && sh(&["ip", "-n", &hosts.a, "link", "set", "lo", "up"])
            && sh(&["ip", "-n", &hosts.b, "link", "set", "lo", "up"]);
        if ok {
            Ok(hosts)
        } else {
            Err("creating network namespaces failed".into())
        }
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and so the pair.
        sh(&["ip", "netns", "del", &self.a]);
        sh(&["ip", "netns", "del", &self.b]);
    }
}

#[test]
fn tcp_between_two_hosts_in_network_namespaces() {
    if soft_only("the soft TCP transport") {
        return;
    }
    let hosts = match TwoHosts::new() {
        Ok(h) => h,
        Err(why) if std::env::var("CI").is_err() => {
            eprintln!("skipped: {why}");
            return;
        }
        Err(why) => panic!("CI must be able to make network namespaces: {why}"),
    };
    const N: u64 = 500;
    let bind_a = format!("{}:0", hosts.addr_a);
    let bind_b = format!("{}:0", hosts.addr_b);
    let mut target = Peer::spawn_in(
        Some(&hosts.a),
        module_path!(),
        "target",
        &[("T", "tcp"), ("RDMAPOOL_SOFT_BIND", &bind_a)],
    );
    let mut adder = Peer::spawn_in(
        Some(&hosts.b),
        module_path!(),
        "adder",
        &[
            ("T", "tcp"),
            ("N", &N.to_string()),
            ("RDMAPOOL_SOFT_BIND", &bind_b),
        ],
    );
    let first = target.line();
    let (target_ep, region) = first.split_once(' ').unwrap();
    let target_addr = rdmapool::soft::tcp_addr(&Endpoint::from_hex(target_ep).unwrap()).unwrap();
    assert_eq!(
        target_addr.ip().to_string(),
        hosts.addr_a,
        "the target listens on its host's address"
    );
    let adder_ep = adder.line();
    adder.say(&format!("{target_ep} {region}"));
    target.say(&adder_ep);
    assert_eq!(target.line(), "ready");
    assert_eq!(adder.line(), "done");
    // The region starts zeroed; every FAA crossed the veth pair.
    let word = peer_dump(&mut target, 0, 8);
    assert_eq!(u64::from_ne_bytes(word.try_into().unwrap()), N);
}

#[test]
fn verbs_gid_index_out_of_range_is_a_typed_error() {
    if provider() != ProviderKind::Verbs {
        eprintln!("verbs only; not run on {}", provider());
        return;
    }
    let mut peer = Peer::spawn(
        module_path!(),
        "open-verbs",
        &[("RDMAPOOL_GID_INDEX", "250")],
    );
    let line = peer.line();
    assert!(
        line.starts_with("err ") && line.contains("out of range"),
        "{line}"
    );
    for bad in ["5000", "not-a-number"] {
        let mut peer = Peer::spawn(module_path!(), "open-verbs", &[("RDMAPOOL_GID_INDEX", bad)]);
        let line = peer.line();
        assert!(line.contains("out of range"), "{bad}: {line}");
    }
}

#[test]
fn registrar_retries_enomem_fails_an_impossible_region_at_once_and_honours_its_timeout() {
    if soft_only("mlock accounting in an unprivileged child") {
        return;
    }
    let mut peer = Peer::spawn(module_path!(), "registrar-memlock", &[]);
    // 8 MiB can never fit under a 1 MiB limit: failing at once beats retrying an error
    // that cannot change.
    let oversize = peer.line();
    assert!(
        oversize.starts_with("oversize 0 ") && oversize.contains("RLIMIT_MEMLOCK"),
        "{oversize}"
    );
    // 512 KiB fits the limit, not beside 768 KiB already pinned: retried, then fails.
    let retried = peer.line();
    assert!(
        retried.starts_with("retried 3 ") && retried.contains("RLIMIT_MEMLOCK"),
        "{retried}"
    );
    let timeout = peer.line();
    assert!(
        timeout.starts_with("timeout 1 ") && timeout.contains("ETIMEDOUT"),
        "{timeout}"
    );
    assert_eq!(peer.line(), "small true");
    assert_eq!(
        peer.line(),
        "pinned 0 0",
        "pinned bytes and live regions back to zero"
    );
}

#[test]
fn every_registration_path_returns_pinned_bytes_and_regions_to_zero() {
    if soft_only("the soft provider's pinned-bytes accounting") {
        return;
    }
    let mut peer = Peer::spawn(module_path!(), "leak-check", &[]);
    for what in ["registrar", "cache", "pool"] {
        assert_eq!(
            peer.line(),
            format!("{what} 0 0"),
            "pinned bytes and live regions after the {what}"
        );
    }
}
