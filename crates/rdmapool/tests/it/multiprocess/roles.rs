//! The child processes' side of these tests (what `child_entry` runs, by role).

use super::*;

/// Runs the role `RDMAPOOL_TEST_CHILD` names; an ordinary test run does nothing.
pub(super) fn run() {
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
