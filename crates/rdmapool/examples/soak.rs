//! Soak: mixed work for a bounded time in one process — a target region behind a CM
//! listener and a memory server on one soft NIC, a client on another that keeps
//! reconnecting, registering and deregistering, WRITE/READ-verifying blocks, and
//! allocating, writing, reading, CAS/FAA-ing and freeing pool objects — sampling every few
//! seconds: RSS, pinned bytes, open fds, threads, live QPs and regions, operations, errors,
//! and latency percentiles of the data-path operations (a WRITE+READ pair, or one pool
//! alloc/write/read/CAS/FAA/free; connecting and registering are counted, not timed). CSV on
//! stdout (one header line).
//!
//! `cargo run --release --example soak -- SECONDS [INTERVAL]` (scripts/soak.sh runs it).
//! Any data mismatch ends it with a non-zero exit.

use hdrhistogram::Histogram;
use rdmapool::conn::{connect, Listener};
use rdmapool::fabric::*;
use rdmapool::remote::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REGION: usize = 4 << 20;
const ALL: AccessFlags = AccessFlags::all_remote();

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            c.copy_from_slice(&x[..c.len()]);
        }
    }
}

/// What one interval saw.
struct Interval {
    hist: Histogram<u64>,
    ops: u64,
    errors: u64,
    bytes: u64,
}

impl Interval {
    fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
            ops: 0,
            errors: 0,
            bytes: 0,
        }
    }

    /// Times `f`, counting it as a data-path operation (or an error).
    fn op<T>(&mut self, f: impl FnOnce() -> rdmapool::Result<T>) -> Option<T> {
        let t = Instant::now();
        let r = self.control(f);
        self.hist
            .saturating_record(t.elapsed().as_nanos().max(1) as u64);
        r
    }

    /// Counts `f` as an operation (or an error) without timing it: connecting and
    /// registering, which the latency columns leave out.
    fn control<T>(&mut self, f: impl FnOnce() -> rdmapool::Result<T>) -> Option<T> {
        let r = f();
        self.ops += 1;
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors += 1;
                eprintln!("soak: operation failed: {e}");
                None
            }
        }
    }
}

fn proc_status(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn main() -> rdmapool::Result<()> {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let every: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let local = "127.0.0.1:0".parse().unwrap();

    // The target side: a region behind a CM listener, and a memory server.
    let sctx = Context::open(SoftConfig::from_env()?)?;
    let spd = sctx.alloc_pd()?;
    let scq = sctx.create_cq(1024)?;
    let region = spd.alloc_mr(REGION, ALL)?;
    let listener = Listener::bind(&spd, local)?;
    let cm = listener.local_addr();
    let server = MemoryServer::start(
        &sctx,
        ServerConfig {
            node: 1,
            size: 16 << 20,
            chunk_size: 256 << 10,
            clients: 64,
            lease: Duration::from_secs(1),
            listen: local,
            ..ServerConfig::default()
        },
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let accepted: Arc<Mutex<VecDeque<Qp>>> = Arc::default();
    let acceptor = {
        let (stop, accepted) = (stop.clone(), accepted.clone());
        let desc = region.remote_region().to_bytes();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let Ok(req) = listener.get_request(Duration::from_millis(100)) else {
                    continue;
                };
                if let Ok(qp) = req.accept(&spd, &scq, &scq, &QpConfig::default(), &desc) {
                    let mut a = accepted.lock().unwrap();
                    a.push_back(qp);
                    // The client reconnects every cycle: older QPs are gone peers.
                    while a.len() > 2 {
                        a.pop_front();
                    }
                }
            }
        })
    };

    // The client side.
    let cctx = Context::open(SoftConfig::from_env()?)?;
    let cpd = cctx.alloc_pd()?;
    let src = Arc::new(cpd.alloc_mr(64 << 10, ALL)?);
    let dst = Arc::new(cpd.alloc_mr(64 << 10, ALL)?);
    let members = StaticMembership::new(vec![server.addr()]);
    let mut rng = Rng(0x5eed_1234_5678_9abc);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut next_sample = started + Duration::from_secs(every);
    let mut iv = Interval::new();
    let (mut total_ops, mut total_errors, mut client_id) = (0u64, 0u64, 0u64);
    println!("t_s,rss_kb,pinned_bytes,fds,threads,qps,regions,ops,errors,mb,p50_us,p99_us,max_us");
    let mut cycle = 0u64;
    while Instant::now() < deadline {
        cycle += 1;
        // Registration churn: owned regions and registered Vecs of 4 KiB..1 MiB.
        for _ in 0..8 {
            let len = 4096 << (rng.next() % 9);
            iv.control(|| Ok(cpd.alloc_mr(len as usize, ALL).map(drop)?));
            iv.control(|| {
                cpd.register(vec![1u8; len as usize], ALL)
                    .map(drop)
                    .map_err(rdmapool::Error::from)
            });
        }
        // A fresh connection: WRITE+READ-verified blocks of 1 B..64 KiB, then disconnect.
        let cq = cctx.create_cq(64)?;
        if let Some(c) = iv.control(|| {
            connect(
                &cpd,
                cm,
                &ConnectSpec::new(&cpd, &cq, &QpConfig::default()).timeout(Duration::from_secs(10)),
            )
        }) {
            let remote = RemoteRegion::from_bytes(&c.private_data)?;
            for _ in 0..100 {
                let len = 1 + (rng.next() % (64 << 10)) as usize;
                let at = remote.at(rng.next() % (REGION - len) as u64)?;
                let mut data = vec![0u8; len];
                rng.fill(&mut data);
                src.write_at(0, &data)?;
                let sg_w = [src.sge(0, len as u32)?];
                let sg_r = [dst.sge(0, len as u32)?];
                let wrs = [
                    SendWr {
                        wr_id: 1,
                        op: WrOp::Write {
                            remote: at,
                            imm: None,
                        },
                        sg_list: &sg_w,
                        signaled: true,
                    },
                    SendWr {
                        wr_id: 2,
                        op: WrOp::Read { remote: at },
                        sg_list: &sg_r,
                        signaled: true,
                    },
                ];
                let done = iv.op(|| {
                    c.qp.post_send(&wrs)?;
                    let got = cq.wait(2, Duration::from_secs(20))?;
                    match got.iter().find(|w| !w.is_ok()) {
                        Some(w) => Err(rdmapool::Error::Completion {
                            status: w.status,
                            opcode: w.opcode,
                        }),
                        None if got.len() < 2 => {
                            Err(rdmapool::Error::TimedOut("a WRITE+READ pair".into()))
                        }
                        None => Ok(()),
                    }
                });
                if done.is_some() {
                    let mut back = vec![0u8; len];
                    dst.read_at(0, &mut back)?;
                    assert!(back == data, "READ returned other bytes than the WRITE put");
                    iv.bytes += len as u64;
                }
            }
        }
        // A fresh pool client (leases of gone clients expire on the server): objects of
        // 64 B..16 KiB, written, read back, CAS, FAA, freed.
        client_id += 1;
        let pc =
            iv.control(|| PoolClient::connect(&cctx, &cpd, &members, ClientConfig::new(client_id)));
        if let Some(pc) = pc {
            for _ in 0..50 {
                let size = 64 << (rng.next() % 9);
                let Some(p) = iv.op(|| pc.block_on(pc.alloc(size, None))) else {
                    continue;
                };
                let mut data = vec![0u8; size as usize];
                rng.fill(&mut data);
                src.write_at(0, &data)?;
                let ok = iv
                    .op(|| pc.block_on(pc.write(p, 0, src.clone(), 0, size as u32)).0)
                    .is_some()
                    && iv
                        .op(|| pc.block_on(pc.read(p, 0, dst.clone(), 0, size as u32)).0)
                        .is_some();
                if ok {
                    let mut back = vec![0u8; size as usize];
                    dst.read_at(0, &mut back)?;
                    assert!(back == data, "pool object {p} changed");
                    iv.bytes += size;
                    let first = u64::from_le_bytes(data[..8].try_into().unwrap());
                    let old = iv.op(|| pc.block_on(pc.compare_and_swap(p, 0, first, 7)));
                    assert!(old.is_none_or(|o| o == first), "CAS saw another value");
                    let old = iv.op(|| pc.block_on(pc.fetch_and_add(p, 0, 1)));
                    assert!(old.is_none_or(|o| o == 7), "FAA saw another value");
                }
                iv.op(|| pc.block_on(pc.free(p)));
            }
        }
        drop(cq);
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(every);
            let q = |p: f64| iv.hist.value_at_quantile(p) as f64 / 1000.0;
            println!(
                "{:.1},{},{},{},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1}",
                started.elapsed().as_secs_f64(),
                proc_status("VmRSS:"),
                rdmapool::metrics::pinned_bytes(),
                fds(),
                proc_status("Threads:"),
                sctx.live_qps() + cctx.live_qps(),
                sctx.live_regions() + cctx.live_regions(),
                iv.ops,
                iv.errors,
                iv.bytes as f64 / 1e6,
                q(0.5),
                q(0.99),
                iv.hist.max() as f64 / 1000.0
            );
            total_ops += iv.ops;
            total_errors += iv.errors;
            iv = Interval::new();
        }
    }
    stop.store(true, Ordering::Release);
    let _ = acceptor.join();
    eprintln!("soak: {cycle} cycles, {total_ops} operations, {total_errors} errors");
    if total_errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
