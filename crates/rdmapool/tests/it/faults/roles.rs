//! The children's side. `target`: a region (and optionally a memory server) behind a CM
//! listener. `workload`: connections to targets (checksummed WRITE+READ blocks) and a pool
//! client (alloc/write/read/CAS/FAA/free), driven round by round from stdin, counting every
//! outcome by type.

use super::procs::*;
use rdmapool::conn::{connect, Listener};
use rdmapool::fabric::*;
use rdmapool::remote::*;
use rdmapool::Error;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const REGION: usize = 4 << 20;
const ALL: AccessFlags = AccessFlags::all_remote();

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn qp_config() -> QpConfig {
    let ms: u64 = env("QP_TIMEOUT_MS").parse().unwrap_or(4000);
    QpConfig {
        timeout: Duration::from_millis(ms),
        ..QpConfig::default()
    }
}

fn ip() -> std::net::IpAddr {
    env("IP").parse().unwrap()
}

/// The target: serves until stdin closes. Commands: `sums BLOCK FIRST COUNT` (checksums of
/// its own view of blocks), `peer` (the TCP address and QP number of its first accepted
/// QP), `forget` (drops the accepted QPs, as an application does when a peer is gone),
/// `settle` (waits for the levels to return to where they were before any connection),
/// `gone SECS` (waits up to SECS for every accepted QP's `PeerDisconnected` event; says how
/// many came and when).
pub fn target() {
    let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let region = pd.alloc_mr(REGION, ALL).unwrap();
    let listener = Listener::bind(&pd, SocketAddr::new(ip(), 0)).unwrap();
    let cm = listener.local_addr();
    let server = (env("POOL") == "1").then(|| {
        MemoryServer::start(
            &ctx,
            ServerConfig {
                node: 1,
                size: 8 << 20,
                chunk_size: 256 << 10,
                clients: 64,
                lease: Duration::from_secs(2),
                listen: SocketAddr::new(ip(), 0),
                cluster_key: crate::support::pool_key_from_env(),
                ..ServerConfig::default()
            },
        )
        .unwrap()
    });
    let pool = server.as_ref().map(|s| s.addr().to_string());
    let accepted: Arc<Mutex<Vec<Qp>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = Levels::now(&ctx);
    let acceptor = {
        let (accepted, stop, pd, cq) = (accepted.clone(), stop.clone(), pd.clone(), cq.clone());
        let desc = region.remote_region().to_bytes();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let Ok(req) = listener.get_request(Duration::from_millis(100)) else {
                    continue;
                };
                if let Ok(qp) = req.accept(&pd, &cq, &cq, &qp_config(), &desc) {
                    accepted.lock().unwrap().push(qp);
                }
            }
        })
    };
    // The acceptor thread is part of the baseline.
    let start = Levels {
        threads: start.threads + 1,
        ..start
    };
    println!("@ready {cm} {} {start}", pool.as_deref().unwrap_or("-"));
    loop {
        let cmd = stdin_line();
        let w: Vec<&str> = cmd.split_whitespace().collect();
        match w.first().copied() {
            Some("sums") => {
                let n: Vec<usize> = w[1..].iter().map(|x| x.parse().unwrap()).collect();
                let (len, first, count) = (n[0], n[1], n[2]);
                let mut b = vec![0u8; len];
                let sums: Vec<String> = (first..first + count)
                    .map(|s| {
                        region.read_at(s * len, &mut b).unwrap();
                        format!("{:x}", fnv(&b))
                    })
                    .collect();
                println!("@sums {}", sums.join(","));
            }
            Some("peer") => {
                // Fresh QPs for raw peers, each bound (RTR) to itself, so a raw peer that
                // was given the endpoint can say an authenticated hello as "its peer".
                let n: usize = w.get(1).map_or(1, |x| x.parse().unwrap());
                let mut eps = Vec::new();
                for _ in 0..n {
                    let qp = pd.create_qp(&cq, &cq, &qp_config()).unwrap();
                    qp.modify_to_init().unwrap();
                    qp.modify_to_rtr(&qp.endpoint()).unwrap();
                    eps.push(qp.endpoint().to_hex());
                    accepted.lock().unwrap().push(qp);
                }
                println!(
                    "@peer {} {:x} {}",
                    eps.join(","),
                    region.addr(),
                    region.rkey()
                );
            }
            Some("expired") => {
                let n = server.as_ref().map(|s| s.stats().expired_clients);
                println!("@expired {}", n.unwrap_or(0));
            }
            Some("gone") => {
                let secs: u64 = w.get(1).map_or(30, |x| x.parse().unwrap());
                let qps = accepted.lock().unwrap();
                let (asked, until) = (Instant::now(), Instant::now() + Duration::from_secs(secs));
                let mut seen = vec![false; qps.len()];
                while seen.contains(&false) && Instant::now() < until {
                    for (qp, seen) in qps.iter().zip(seen.iter_mut()).filter(|(_, s)| !**s) {
                        let e = qp.wait_event(Duration::from_millis(50));
                        *seen = e == Some(QpEvent::PeerDisconnected);
                    }
                }
                let n = seen.iter().filter(|s| **s).count();
                println!("@gone {n} of {} after {:?}", qps.len(), asked.elapsed());
            }
            Some("forget") => {
                accepted.lock().unwrap().clear();
                println!("@forgot");
            }
            Some("settle") => {
                let end = Levels::settle(&ctx, start);
                println!("@levels {start} {end}");
            }
            _ => break,
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let _ = acceptor.join();
    std::process::exit(0);
}

/// Outcomes, by type.
#[derive(Default)]
struct Tally {
    attempted: u64,
    completed: u64,
    failed: u64,
    verified: u64,
    mismatches: u64,
    hangs: u64,
    errors: BTreeMap<String, u64>,
    /// A pool operation said its node is down (the client is replaced on the next run).
    node_down: bool,
}

impl Tally {
    fn fail(&mut self, what: &str, e: &Error) {
        self.failed += 1;
        self.node_down |= matches!(e, Error::NodeDown { .. });
        let variant = |debug: String| {
            debug
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or("?")
                .to_string()
        };
        let kind = match e {
            Error::Completion { status, .. } => format!("{status:?}"),
            Error::Core(inner) => variant(format!("{inner:?}")),
            other => variant(format!("{other:?}")),
        };
        let n = self.errors.entry(format!("{what}.{kind}")).or_default();
        if *n == 0 {
            eprintln!("[{}] first {what}.{kind}: {e}", env("NAME"));
        }
        *n += 1;
    }

    fn ok<T>(&mut self, what: &str, r: Result<T, Error>) -> Option<T> {
        self.attempted += 1;
        match r {
            Ok(v) => {
                self.completed += 1;
                Some(v)
            }
            Err(e) => {
                self.fail(what, &e);
                None
            }
        }
    }
}

/// One connection to a target: blocks `first..first+slots` of its region are ours. Each
/// reconnect moves to another range (of four per connection), so a request of a broken
/// connection that still lands late (TCP retransmits after a partition heals, a frozen
/// target wakes up) cannot overwrite the new connection's blocks.
struct Conn {
    addr: SocketAddr,
    qp: Option<(Qp, Cq, RemoteRegion)>,
    index: u64,
    epoch: u64,
    first: u64,
    /// Checksum of what the target holds in each of our blocks, where known.
    known: Vec<Option<u64>>,
    generation: u64,
}

pub fn workload() {
    let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let block_len: usize = env("BLOCK").parse().unwrap_or(16 << 10);
    let slots: u64 = env("SLOTS").parse().unwrap_or(16);
    let slot0: u64 = env("SLOT0").parse().unwrap_or(0);
    let seed: u64 = env("SEED").parse().unwrap_or(1);
    let mut conns: Vec<Conn> = env("TARGETS")
        .split(',')
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(j, a)| Conn {
            addr: a.parse().unwrap(),
            qp: None,
            index: j as u64,
            epoch: 0,
            first: 0,
            known: vec![None; slots as usize],
            generation: 0,
        })
        .collect();
    let nconns = conns.len() as u64;
    let pool_addr: Option<SocketAddr> = env("POOL").parse().ok();
    let mut client: Option<PoolClient> = None;
    let mut next_id = seed * 1000;
    let (src, dst) = (
        Arc::new(pd.alloc_mr(block_len, ALL).unwrap()),
        Arc::new(pd.alloc_mr(block_len, ALL).unwrap()),
    );
    let mut pool_down = false;
    let start = Levels::now(&ctx);
    println!("@started {start}");
    loop {
        let cmd = stdin_line();
        let w: Vec<&str> = cmd.split_whitespace().collect();
        match w.first().copied() {
            Some("run") => {
                let rounds: u64 = w[1].parse().unwrap();
                let mut t = Tally::default();
                // (Re)connect what is missing, once per run.
                for c in conns.iter_mut().filter(|c| c.qp.is_none()) {
                    let cq = ctx.create_cq(64).unwrap();
                    let r = connect(
                        &pd,
                        c.addr,
                        &ConnectSpec::new(&pd, &cq, &qp_config()).timeout(Duration::from_secs(5)),
                    );
                    if let Some(conn) = t.ok("connect", r) {
                        let remote = RemoteRegion::from_bytes(&conn.private_data).unwrap();
                        c.qp = Some((conn.qp, cq, remote));
                        c.first = slot0 + ((c.epoch % 4) * nconns + c.index) * slots;
                        c.known.iter_mut().for_each(|k| *k = None);
                        c.epoch += 1;
                    }
                }
                if let Some(addr) = pool_addr.filter(|_| client.is_none() || pool_down) {
                    drop(client.take()); // before its successor connects
                    pool_down = false;
                    next_id += 1;
                    let members = StaticMembership::new(vec![addr]);
                    let mut cfg = ClientConfig::new(next_id);
                    cfg.cluster_key = crate::support::pool_key_from_env();
                    let r = PoolClient::connect(&ctx, &pd, &members, cfg);
                    client = t.ok("pool-connect", r);
                }
                for round in 0..rounds {
                    if round == (rounds / 4).min(50) {
                        println!("@streaming");
                    }
                    for c in conns.iter_mut() {
                        block_round(c, &src, &dst, block_len, seed, &mut t);
                    }
                    if let Some(pc) = client.as_ref().filter(|_| !pool_down) {
                        pool_round(pc, &src, &dst, seed + round, &mut t);
                        pool_down = t.node_down;
                    }
                }
                let errors: Vec<String> =
                    t.errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                println!(
                    "@done attempted={} completed={} failed={} verified={} mismatches={} hangs={} errors={}",
                    t.attempted, t.completed, t.failed, t.verified, t.mismatches, t.hangs,
                    if errors.is_empty() { "-".into() } else { errors.join(",") }
                );
            }
            Some("probe") => {
                // One allocation: what the pool client says right now.
                let pc = client.as_ref().expect("a pool client");
                match pc.block_on(pc.alloc(64, None)) {
                    Ok(p) => {
                        let _ = pc.block_on(pc.free(p));
                        println!("@probe ok");
                    }
                    Err(e) => println!("@probe {e}"),
                }
            }
            Some("known") => {
                // Per connection: first slot, then each block's checksum or '?'.
                let k: Vec<String> = conns
                    .iter()
                    .map(|c| {
                        let s: Vec<String> = c
                            .known
                            .iter()
                            .map(|k| k.map(|h| format!("{h:x}")).unwrap_or("?".into()))
                            .collect();
                        format!("{}:{}", c.first, s.join(","))
                    })
                    .collect();
                println!("@known {}", k.join(" "));
            }
            Some("close") => {
                conns.clear();
                client = None;
                let end = Levels::settle(&ctx, start);
                println!("@levels {start} {end}");
            }
            _ => break,
        }
    }
    std::process::exit(0);
}

/// WRITE a fresh block into one of the connection's slots and READ it back in the same
/// post (RC order: the READ sees the WRITE), then check the checksum.
fn block_round(c: &mut Conn, src: &Arc<Mr>, dst: &Arc<Mr>, len: usize, seed: u64, t: &mut Tally) {
    let Some((qp, cq, remote)) = c.qp.as_ref() else {
        return;
    };
    c.generation += 1;
    let i = c.generation % c.known.len() as u64;
    let slot = c.first + i;
    let data = block(len, seed, slot, c.generation);
    src.write_at(0, &data).unwrap();
    let at = remote.at(slot * len as u64).unwrap();
    let wrs = [
        SendWr {
            wr_id: 1,
            op: WrOp::Write {
                remote: at,
                imm: None,
            },
            sg_list: &[src.sge(0, len as u32).unwrap()],
            signaled: true,
        },
        SendWr {
            wr_id: 2,
            op: WrOp::Read { remote: at },
            sg_list: &[dst.sge(0, len as u32).unwrap()],
            signaled: true,
        },
    ];
    c.known[i as usize] = None;
    if let Err(e) = qp.post_send(&wrs) {
        t.attempted += 1;
        t.fail("post", &e.into());
        c.qp = None;
        return;
    }
    t.attempted += 2;
    // Every request has the QP's timeout; this only catches a completion that never comes.
    let deadline = Instant::now() + qp_config().timeout + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(cq.wait(2 - got.len(), Duration::from_millis(100)).unwrap());
    }
    if got.len() < 2 {
        t.hangs += 1;
        c.qp = None;
        return;
    }
    let mut ok = true;
    for w in &got {
        if w.is_ok() {
            t.completed += 1;
        } else {
            ok = false;
            t.fail(
                if w.wr_id == 1 { "write" } else { "read" },
                &Error::Completion {
                    status: w.status,
                    opcode: w.opcode,
                },
            );
        }
    }
    if !ok {
        c.qp = None;
        return;
    }
    let mut back = vec![0u8; len];
    dst.read_at(0, &mut back).unwrap();
    if fnv(&back) == fnv(&data) {
        t.verified += len as u64;
        c.known[i as usize] = Some(fnv(&data));
    } else {
        t.mismatches += 1;
    }
}

/// alloc, WRITE, READ back, CAS, FAA, READ the word, free: each counted, data checked.
fn pool_round(pc: &PoolClient, src: &Arc<Mr>, dst: &Arc<Mr>, seed: u64, t: &mut Tally) {
    let size = 256 + (seed % 8) * 512;
    let Some(p) = t.ok("alloc", pc.block_on(pc.alloc(size, None))) else {
        return;
    };
    let data = block(size as usize, seed, 7, 7);
    src.write_at(0, &data).unwrap();
    let wrote = t.ok(
        "pwrite",
        pc.block_on(pc.write(p, 0, src.clone(), 0, size as u32)).0,
    );
    if wrote.is_some()
        && t.ok(
            "pread",
            pc.block_on(pc.read(p, 0, dst.clone(), 0, size as u32)).0,
        )
        .is_some()
    {
        let mut back = vec![0u8; size as usize];
        dst.read_at(0, &mut back).unwrap();
        if back == data {
            t.verified += size;
        } else {
            t.mismatches += 1;
        }
        let first = u64::from_le_bytes(data[..8].try_into().unwrap());
        if let Some(old) = t.ok("cas", pc.block_on(pc.compare_and_swap(p, 0, first, 41))) {
            t.mismatches += (old != first) as u64;
            if let Some(old) = t.ok("faa", pc.block_on(pc.fetch_and_add(p, 0, 1))) {
                t.mismatches += (old != 41) as u64;
                if t.ok("pread", pc.block_on(pc.read(p, 0, dst.clone(), 0, 8)).0)
                    .is_some()
                {
                    t.mismatches += (dst.read_u64(0).unwrap() != 42) as u64;
                    t.verified += 8;
                }
            }
        }
    }
    t.ok("free", pc.block_on(pc.free(p)));
}
