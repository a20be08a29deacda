//! `rdma-tool bench pool`: the cross-node memory pool, each figure next to a reference
//! measured in the same run.
//!
//! 1. alloc+free pairs per second with 1, 2, 4, 8 clients (threads, each its own
//!    `PoolClient` with its own id) against one memory server, next to a two-sided baseline:
//!    a server thread that owns a free list of objects of the same size and answers each
//!    SEND request (alloc: an offset; free: an acknowledgement) with a SEND reply, the clients
//!    doing SEND+RECV round trips (server and clients spin 50 us on an empty CQ, then sleep
//!    on its completion channel, which served the baseline best on a small machine). Each client keeps `--live` objects and, per pair, allocates
//!    one and frees its oldest, so both designs do the same work.
//! 2. READ and WRITE latency and bandwidth through `PoolClient` against a raw QP (post and
//!    busy-poll, the `bench data` harness) to the same memory of the same server.

use super::harness::{count_for, iters_for, Bench, Op};
use super::report::{print_json, print_table, Row};
use super::Stats;
use crate::peer::open_context;
use crate::sizes::{parse_size, parse_sizes, show};
use crate::{Result, ToolError};
use rdmapool::conn::{self, Listener, Manager};
use rdmapool::fabric::*;
use rdmapool::remote::{
    ClientConfig, ClientHello, MemoryServer, PoolClient, PoolDescriptor, RemotePtr, ServerConfig,
    StaticMembership,
};
use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::task::Poll;
use std::time::{Duration, Instant};

/// Arguments of `bench pool`.
#[derive(clap::Args)]
pub struct Args {
    /// soft or verbs.
    #[arg(long, default_value = "soft")]
    provider: String,
    /// Where the servers listen (on verbs: the RDMA netdev's address).
    #[arg(long, default_value = "127.0.0.1")]
    ip: IpAddr,
    /// Client counts for the alloc+free rate, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    clients: Vec<usize>,
    /// Object size for the alloc+free rate.
    #[arg(long, default_value = "64")]
    object_size: String,
    /// Objects each client keeps allocated (each pair allocates one and frees the oldest).
    #[arg(long, default_value_t = 64)]
    live: usize,
    /// Seconds per alloc+free measurement (each design, each client count).
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// READ/WRITE sizes for latency, comma-separated.
    #[arg(long, default_value = "8,4K")]
    latency_size: String,
    /// READ/WRITE sizes for bandwidth, comma-separated.
    #[arg(long, default_value = "64K,1M")]
    bandwidth_size: String,
    /// Latency iterations for 8-byte operations (larger sizes use fewer).
    #[arg(long, default_value_t = 5000)]
    iters: u64,
    /// Skip the alloc+free part.
    #[arg(long)]
    no_alloc: bool,
    /// Skip the READ/WRITE part.
    #[arg(long)]
    no_data: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// Operations in flight for bandwidth runs (as in the raw harness).
const WINDOW: usize = 16;
const BEST_OF: usize = 3;
/// Latency samples per turn when ours and the raw QP's alternate.
const LAT_BLOCK: u64 = 250;
const WAIT: Duration = Duration::from_secs(30);

fn server_config(listen: SocketAddr, size: usize) -> ServerConfig {
    ServerConfig {
        node: 1,
        size,
        chunk_size: 2 << 20,
        clients: 256,
        lease: Duration::from_secs(2),
        listen,
    }
}

/// Runs the benchmark and prints the table or JSON.
pub fn run(args: Args) -> Result<()> {
    let provider = ProviderKind::parse(&args.provider)?;
    let object = parse_size(&args.object_size)? as u64;
    let lat_sizes = parse_sizes(&args.latency_size)?;
    let bw_sizes = parse_sizes(&args.bandwidth_size)?;
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err(ToolError::Msg(
            "--clients: positive counts, e.g. 1,2,4,8".into(),
        ));
    }
    if !(args.secs > 0.0 && args.secs <= 600.0) {
        return Err(ToolError::Msg("--secs: between 0 and 600".into()));
    }
    let max_data = lat_sizes
        .iter()
        .chain(&bw_sizes)
        .copied()
        .max()
        .unwrap_or(8);
    if max_data > (2 << 20) - 4096 {
        return Err(ToolError::Msg(format!(
            "READ/WRITE size {}: at most one 2M chunk less its header",
            show(max_data)
        )));
    }
    let ctx = open_context(provider, Transport::Auto)?;
    let server = MemoryServer::start(&ctx, server_config(SocketAddr::new(args.ip, 0), 32 << 20))?;
    let steps = if args.no_alloc {
        0
    } else {
        args.clients.len() * 2
    } + if args.no_data {
        0
    } else {
        2 * (lat_sizes.len() + bw_sizes.len())
    };
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    let mut rows = Vec::new();
    let mut next_id = 1000u64;
    if !args.no_alloc {
        let baseline = TwoSidedServer::start(provider, args.ip, 32 << 20, object)?;
        for &n in &args.clients {
            bar.set_message(format!("alloc+free, {n} clients, one-sided"));
            let ours = one_sided(provider, &server, n, next_id, object, args.live, args.secs)?;
            next_id += n as u64;
            bar.inc(1);
            bar.set_message(format!("alloc+free, {n} clients, two-sided"));
            let base = two_sided(provider, &baseline, n, object, args.live, args.secs)?;
            bar.inc(1);
            rows.push(Row {
                provider: provider.name().into(),
                transport: path(provider),
                op: format!("alloc+free x{n}"),
                metric: "rate".into(),
                size: object as usize,
                iters: ours.pairs,
                median_ns: ours.pair.median_ns,
                p99_ns: ours.pair.p99_ns,
                gbps: 0.0,
                mops: ours.mops(),
                reference: format!("two-sided SEND/RECV x{n} ({})", fmt_pair(&base.pair)),
                reference_value: base.mops(),
                ratio: ours.mops() / base.mops(),
            });
        }
        baseline.stop();
        // Let the alloc phase's dropped clients' leases run out and their connections
        // close before the data rows are measured on the same server.
        std::thread::sleep(server.descriptor().lease * 2);
    }
    if !args.no_data {
        let id = next_id;
        rows.extend(data_rows(
            provider, &server, id, &lat_sizes, &bw_sizes, max_data, args.iters, &bar,
        )?);
    }
    bar.finish_and_clear();
    drop(server);
    if args.json {
        print_json(&rows);
    } else {
        print_table(&rows);
        summary(&rows);
    }
    Ok(())
}

fn path(provider: ProviderKind) -> String {
    match provider {
        ProviderKind::Soft => "local".into(),
        p => p.name().into(),
    }
}

fn fmt_pair(s: &Stats) -> String {
    format!("pair p50 {}", super::report::fmt_ns(s.median_ns))
}

/// The verdicts the issue asks for, under the table.
fn summary(rows: &[Row]) {
    let rate: Vec<&Row> = rows.iter().filter(|r| r.metric == "rate").collect();
    if !rate.is_empty() {
        let parts: Vec<String> = rate
            .iter()
            .map(|r| {
                format!(
                    "{}: {:.2}x",
                    r.op.trim_start_matches("alloc+free "),
                    r.ratio
                )
            })
            .collect();
        let wins = rate.iter().all(|r| r.ratio > 1.0);
        println!(
            "\nalloc+free, one-sided pool / two-sided server: {} -> one-sided {} at every client count",
            parts.join(", "),
            if wins { "wins" } else { "does NOT win" }
        );
    }
    let data: Vec<&Row> = rows.iter().filter(|r| r.metric != "rate").collect();
    if !data.is_empty() {
        let within = |r: &Row| {
            if r.metric == "latency" {
                r.ratio <= 1.10
            } else {
                r.ratio >= 0.90
            }
        };
        let off: Vec<String> = data
            .iter()
            .filter(|r| !within(r))
            .map(|r| format!("{} {} {} ({:.2})", r.op, r.metric, show(r.size), r.ratio))
            .collect();
        if off.is_empty() {
            println!("READ/WRITE through the pool: every row within 10% of the raw QP");
        } else {
            println!(
                "READ/WRITE through the pool: {} of {} rows within 10% of the raw QP; outside: {}",
                data.len() - off.len(),
                data.len(),
                off.join(", ")
            );
        }
    }
}

/// What the clients of one alloc+free measurement did together.
struct Rate {
    pairs: u64,
    secs: f64,
    /// One pair's time, over all clients' pairs.
    pair: Stats,
}

impl Rate {
    fn mops(&self) -> f64 {
        self.pairs as f64 / self.secs / 1e6
    }
}

/// Runs `n` client threads: each sets itself up with `setup`, then all start together and
/// do `pair` until `secs` have passed. Returns the total rate.
fn clients<S, C>(n: usize, secs: f64, setup: S) -> Result<Rate>
where
    S: Fn(usize) -> Result<C> + Sync,
    C: FnMut() -> Result<()>,
{
    let barrier = Barrier::new(n);
    let failed = AtomicBool::new(false);
    let run = Duration::from_secs_f64(secs);
    let results: Vec<Result<(u64, f64, Vec<u64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, failed, setup) = (&barrier, &failed, &setup);
                s.spawn(move || {
                    let prepared = setup(i);
                    if prepared.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    barrier.wait();
                    let mut pair = prepared?;
                    if failed.load(Ordering::SeqCst) {
                        return Ok((0, 0.0, Vec::new()));
                    }
                    // A short warm-up, then the measured run.
                    for _ in 0..100 {
                        pair()?;
                    }
                    let mut samples = Vec::with_capacity(1 << 16);
                    let t0 = Instant::now();
                    let mut last = t0;
                    loop {
                        pair()?;
                        let now = Instant::now();
                        samples.push((now - last).as_nanos() as u64);
                        last = now;
                        if now - t0 >= run {
                            break;
                        }
                    }
                    Ok((samples.len() as u64, (last - t0).as_secs_f64(), samples))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ToolError::Msg("a client thread panicked".into())))
            })
            .collect()
    });
    let mut pairs = 0;
    let mut longest = 0f64;
    let mut all = Vec::new();
    for r in results {
        let (p, t, samples) = r?;
        pairs += p;
        longest = longest.max(t);
        all.extend(samples);
    }
    Ok(Rate {
        pairs,
        secs: longest.max(1e-9),
        pair: Stats::from_samples(&all),
    })
}

/// One client of the pool and the objects it holds; frees them when dropped.
struct OneSided {
    client: PoolClient,
    held: VecDeque<RemotePtr>,
    _ctx: Context,
}

impl Drop for OneSided {
    fn drop(&mut self) {
        for p in self.held.drain(..) {
            let _ = self.client.block_on(self.client.free(p));
        }
    }
}

/// alloc+free through `PoolClient`s, one-sided.
fn one_sided(
    provider: ProviderKind,
    server: &MemoryServer,
    n: usize,
    first_id: u64,
    object: u64,
    live: usize,
    secs: f64,
) -> Result<Rate> {
    let members = StaticMembership::new(vec![server.addr()]);
    let members = &members;
    let rate = clients(n, secs, |i| {
        let ctx = open_context(provider, Transport::Auto)?;
        let pd = ctx.alloc_pd()?;
        let client =
            PoolClient::connect(&ctx, &pd, members, ClientConfig::new(first_id + i as u64))?;
        let mut held = VecDeque::with_capacity(live + 1);
        for _ in 0..live {
            held.push_back(client.block_on(client.alloc(object, None))?);
        }
        let mut me = OneSided {
            client,
            held,
            _ctx: ctx,
        };
        Ok(move || -> Result<()> {
            let p = me.client.block_on(me.client.alloc(object, None))?;
            me.held.push_back(p);
            if let Some(old) = me.held.pop_front() {
                me.client.block_on(me.client.free(old))?;
            }
            Ok(())
        })
    });
    // Every measurement starts from the same empty pool (the clients freed what they held).
    let until = Instant::now() + Duration::from_secs(10);
    while server.stats().chunks_owned > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    rate
}

/// The two-sided baseline's server: one thread, a free list, SEND/RECV.
struct TwoSidedServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

const MSG: usize = 16;
const OP_ALLOC: u64 = 1;
const OP_FREE: u64 = 2;
/// Receives kept posted per connection.
const RECVS: usize = 2;
const MAX_CONNS: usize = 256;
/// How long the baseline server spins on an empty CQ before sleeping on its channel.
const SERVER_SPIN: Duration = Duration::from_micros(50);

impl TwoSidedServer {
    fn start(provider: ProviderKind, ip: IpAddr, size: usize, object: u64) -> Result<Self> {
        let ctx = open_context(provider, Transport::Auto)?;
        let pd = ctx.alloc_pd()?;
        let listener = Listener::bind(Manager::from(&pd), SocketAddr::new(ip, 0))?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let objects = (size as u64 / object.max(1)) as usize;
        let thread = std::thread::Builder::new()
            .name("two-sided-server".into())
            .spawn(move || serve_two_sided(ctx, pd, listener, s, objects, object))
            .map_err(|e| ToolError::Io("spawn".into(), e))?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => eprintln!("two-sided server: {e}"),
                Err(_) => eprintln!("two-sided server panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// The baseline server's loop: accepts connections (between polls) and answers requests.
fn serve_two_sided(
    ctx: Context,
    pd: Pd,
    listener: Listener,
    stop: Arc<AtomicBool>,
    objects: usize,
    object: u64,
) -> Result<()> {
    let cq = ctx.create_cq(8192)?;
    let recv = pd.alloc_mr(MAX_CONNS * RECVS * MSG, AccessFlags::LOCAL_WRITE)?;
    let send = pd.alloc_mr(MAX_CONNS * MSG, AccessFlags::LOCAL_WRITE)?;
    let mut free: Vec<u64> = (0..objects as u64).rev().collect();
    let mut allocated = vec![false; objects];
    let mut qps: Vec<Qp> = Vec::new();
    let post_recv = |qp: &Qp, slot: usize| -> Result<()> {
        let sge = recv.sge(slot * MSG, MSG as u32)?;
        qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sg_list: &[sge],
        }])?;
        Ok(())
    };
    // Accept on a thread of its own so that the serving loop only polls.
    let (tx, rx) = std::sync::mpsc::channel::<rdmapool::conn::ConnRequest>();
    let s = stop.clone();
    let acceptor = std::thread::spawn(move || {
        while !s.load(Ordering::SeqCst) {
            match listener.get_request(Duration::from_millis(50)) {
                Ok(r) => {
                    if tx.send(r).is_err() {
                        return;
                    }
                }
                Err(_) => continue,
            }
        }
    });
    let mut buf = [Completion::EMPTY; 32];
    let mut req = [0u8; MSG];
    let mut idle_since: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        while let Ok(r) = rx.try_recv() {
            if qps.len() == MAX_CONNS {
                let _ = r.reject(b"full");
                continue;
            }
            let qp = r.accept(&pd, &cq, &cq, &QpConfig::default(), b"ok")?;
            let i = qps.len();
            for k in 0..RECVS {
                post_recv(&qp, i * RECVS + k)?;
            }
            qps.push(qp);
        }
        let mut n = cq.poll(&mut buf)?;
        if n == 0 {
            // Spin a while, then sleep on the completion channel (as the soft NIC's responders
            // do): on a machine with fewer cores than spinning threads, a server that never
            // sleeps takes the CPU its clients need.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SERVER_SPIN {
                continue;
            }
            cq.req_notify()?;
            n = cq.poll(&mut buf)?; // what arrived before arming raises no event
            if n == 0 {
                sleep_on(&cq)?;
                idle_since = None;
                continue;
            }
        }
        idle_since = None;
        for c in &buf[..n] {
            if c.opcode != WcOpcode::Recv || !c.is_ok() {
                continue; // our SENDs' completions; flushed receives of closed connections
            }
            let slot = c.wr_id as usize;
            let conn = slot / RECVS;
            recv.read_at(slot * MSG, &mut req)?;
            let op = u64::from_le_bytes(req[..8].try_into().expect("8 bytes"));
            let arg = u64::from_le_bytes(req[8..].try_into().expect("8 bytes"));
            let (status, value) = match op {
                OP_ALLOC => match free.pop() {
                    Some(i) => {
                        allocated[i as usize] = true;
                        (0u64, i * object)
                    }
                    None => (1, 0),
                },
                OP_FREE => {
                    let i = (arg / object) as usize;
                    if arg % object == 0 && i < objects && allocated[i] {
                        allocated[i] = false;
                        free.push(i as u64);
                        (0, 0)
                    } else {
                        (2, 0)
                    }
                }
                _ => (3, 0),
            };
            let mut reply = [0u8; MSG];
            reply[..8].copy_from_slice(&status.to_le_bytes());
            reply[8..].copy_from_slice(&value.to_le_bytes());
            send.write_at(conn * MSG, &reply)?;
            let qp = &qps[conn];
            post_recv(qp, slot)?;
            let sge = send.sge(conn * MSG, MSG as u32)?;
            qp.post_send(&[SendWr {
                wr_id: conn as u64,
                op: WrOp::Send { imm: None },
                sg_list: &[sge],
                signaled: true,
            }])?;
        }
    }
    let _ = acceptor.join();
    Ok(())
}

/// Sleeps until the armed `cq` signals a completion (at most 10 ms), then consumes the event.
fn sleep_on(cq: &Cq) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd: cq.event_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, for the CQ's live descriptor.
    unsafe { libc::poll(&mut pfd, 1, 10) };
    cq.ack_events()?;
    Ok(())
}

/// One client of the baseline: a QP and a buffer for a request and its reply.
struct TwoSidedClient {
    _ctx: Context,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

impl TwoSidedClient {
    fn connect(provider: ProviderKind, addr: SocketAddr) -> Result<Self> {
        let ctx = open_context(provider, Transport::Auto)?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(64)?;
        let c = conn::connect(
            Manager::from(&pd),
            addr,
            &pd,
            &cq,
            &cq,
            &QpConfig::default(),
            b"two-sided",
            WAIT,
        )?;
        let mr = pd.alloc_mr(2 * MSG, AccessFlags::LOCAL_WRITE)?;
        Ok(Self {
            _ctx: ctx,
            cq,
            qp: c.qp,
            mr,
        })
    }

    /// One request and its reply: post the receive, SEND, busy-poll both completions.
    fn call(&self, op: u64, arg: u64) -> Result<u64> {
        let mut req = [0u8; MSG];
        req[..8].copy_from_slice(&op.to_le_bytes());
        req[8..].copy_from_slice(&arg.to_le_bytes());
        self.mr.write_at(0, &req)?;
        let rsge = self.mr.sge(MSG, MSG as u32)?;
        self.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[rsge],
        }])?;
        let ssge = self.mr.sge(0, MSG as u32)?;
        self.qp.post_send(&[SendWr {
            wr_id: 0,
            op: WrOp::Send { imm: None },
            sg_list: &[ssge],
            signaled: true,
        }])?;
        let (mut sent, mut got) = (false, false);
        let mut buf = [Completion::EMPTY; 2];
        let t0 = Instant::now();
        while !(sent && got) {
            let mut n = self.cq.poll(&mut buf)?;
            if n == 0 {
                let waited = t0.elapsed();
                if waited > WAIT {
                    return Err(ToolError::Msg("two-sided server: no reply in 30 s".into()));
                }
                if waited < SERVER_SPIN {
                    continue;
                }
                // Spin, then sleep (as the server does), so that the threads that move the
                // messages get the CPU on a small machine.
                self.cq.req_notify()?;
                n = self.cq.poll(&mut buf)?;
                if n == 0 {
                    sleep_on(&self.cq)?;
                    continue;
                }
            }
            for c in &buf[..n] {
                if !c.is_ok() {
                    return Err(ToolError::Msg(format!(
                        "two-sided request failed: {}",
                        c.status
                    )));
                }
                match c.opcode {
                    WcOpcode::Recv => got = true,
                    _ => sent = true,
                }
            }
        }
        let mut reply = [0u8; MSG];
        self.mr.read_at(MSG, &mut reply)?;
        let status = u64::from_le_bytes(reply[..8].try_into().expect("8 bytes"));
        if status != 0 {
            return Err(ToolError::Msg(format!(
                "two-sided server refused op {op}: status {status}"
            )));
        }
        Ok(u64::from_le_bytes(reply[8..].try_into().expect("8 bytes")))
    }
}

/// alloc+free through the two-sided server.
fn two_sided(
    provider: ProviderKind,
    server: &TwoSidedServer,
    n: usize,
    _object: u64,
    live: usize,
    secs: f64,
) -> Result<Rate> {
    let addr = server.addr;
    clients(n, secs, |_| {
        let c = TwoSidedClient::connect(provider, addr)?;
        let mut held = VecDeque::with_capacity(live + 1);
        for _ in 0..live {
            held.push_back(c.call(OP_ALLOC, 0)?);
        }
        let mut state = Some((c, held));
        Ok(move || -> Result<()> {
            let (c, held) = state.as_mut().expect("set until dropped");
            held.push_back(c.call(OP_ALLOC, 0)?);
            if let Some(old) = held.pop_front() {
                c.call(OP_FREE, old)?;
            }
            Ok(())
        })
    })
}

/// Polls up to `window` futures from `start` at once until `count` have finished (each
/// posts in its first poll, so `window` operations are in flight).
async fn windowed<F, Fut>(count: u64, window: usize, mut start: F) -> rdmapool::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = rdmapool::Result<()>>,
{
    let mut inflight: Vec<Pin<Box<Fut>>> = Vec::with_capacity(window);
    let (mut started, mut done) = (0u64, 0u64);
    std::future::poll_fn(move |cx| loop {
        while started < count && inflight.len() < window {
            inflight.push(Box::pin(start()));
            started += 1;
        }
        let mut progressed = false;
        let mut i = 0;
        while i < inflight.len() {
            match inflight[i].as_mut().poll(cx) {
                Poll::Ready(r) => {
                    if let Err(e) = r {
                        return Poll::Ready(Err(e));
                    }
                    drop(inflight.swap_remove(i));
                    done += 1;
                    progressed = true;
                }
                Poll::Pending => i += 1,
            }
        }
        if done == count {
            return Poll::Ready(Ok(()));
        }
        if !progressed {
            return Poll::Pending;
        }
    })
    .await
}

fn best_of(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut best = 0f64;
    for _ in 0..BEST_OF {
        best = best.max(f()?);
    }
    Ok(best)
}

/// READ/WRITE through the pool next to a raw QP on the same memory.
#[allow(clippy::too_many_arguments)]
fn data_rows(
    provider: ProviderKind,
    server: &MemoryServer,
    id: u64,
    lat_sizes: &[usize],
    bw_sizes: &[usize],
    max: usize,
    base_iters: u64,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Row>> {
    let members = StaticMembership::new(vec![server.addr()]);
    // The pool client and the raw QP each get a context of their own (the server's is ctx),
    // as a client on another node would.
    let pool_ctx = open_context(provider, Transport::Auto)?;
    let pd = pool_ctx.alloc_pd()?;
    let client = PoolClient::connect(&pool_ctx, &pd, &members, ClientConfig::new(id))?;
    let ptr: RemotePtr = client.block_on(client.alloc(max as u64, None))?;
    let local = Arc::new(pd.alloc_mr(max, AccessFlags::LOCAL_WRITE)?);
    local.write_at(0, &vec![0x5a; max])?;
    // The raw QP: its own context, connected to the same server (a client hello gets it the
    // descriptor; it takes no lease), aimed at the same allocation.
    let raw_ctx = open_context(provider, Transport::Auto)?;
    let raw_pd = raw_ctx.alloc_pd()?;
    let raw_cq = raw_ctx.create_cq(4096)?;
    let hello = ClientHello { client_id: id + 1 }.encode();
    let c = conn::connect(
        Manager::from(&raw_pd),
        server.addr(),
        &raw_pd,
        &raw_cq,
        &raw_cq,
        &QpConfig::default(),
        &hello,
        WAIT,
    )?;
    let desc = PoolDescriptor::decode(&c.private_data)?;
    let raw = Bench {
        cq: raw_cq,
        qp: c.qp,
        local: raw_pd.alloc_mr(max, AccessFlags::LOCAL_WRITE)?,
        region: RemoteRegion {
            addr: desc.region.addr + ptr.offset,
            len: ptr.len,
            rkey: desc.region.rkey,
        },
    };
    let pool_op = |op: Op, size: usize| {
        let (client, local) = (&client, local.clone());
        async move {
            let r = match op {
                Op::Read => client.read(ptr, 0, local, 0, size as u32).await,
                _ => client.write(ptr, 0, local, 0, size as u32).await,
            };
            r.0
        }
    };
    let mut rows = Vec::new();
    let row = |op: Op, metric: &str, size: usize, iters: u64, lat: Stats, gbps: f64, rv: f64| {
        let ratio = if metric == "latency" {
            lat.median_ns / rv
        } else {
            gbps / rv
        };
        Row {
            provider: provider.name().into(),
            transport: path(provider),
            op: format!("pool {}", op.name()),
            metric: metric.into(),
            size,
            iters,
            median_ns: lat.median_ns,
            p99_ns: lat.p99_ns,
            gbps,
            mops: 0.0,
            reference: if metric == "latency" {
                "raw qp (post, busy-poll)".into()
            } else {
                format!("raw qp ({WINDOW} in flight)")
            },
            reference_value: rv,
            ratio,
        }
    };
    for op in [Op::Write, Op::Read] {
        for &size in lat_sizes {
            bar.set_message(format!("pool {} {} latency", op.name(), show(size)));
            let iters = iters_for(size, base_iters);
            // Alternate ours and raw in blocks, so drift on a shared machine hits both.
            let block = iters.min(LAT_BLOCK);
            let mut ours = Vec::with_capacity(iters as usize);
            let mut theirs = Vec::with_capacity(iters as usize);
            for _ in 0..iters.div_ceil(block) {
                theirs.extend(raw.latency_samples(op, size, block)?);
                let warm = 10;
                for i in 0..warm + block {
                    let t = Instant::now();
                    client.block_on(pool_op(op, size))?;
                    if i >= warm {
                        ours.push(t.elapsed().as_nanos() as u64);
                    }
                }
            }
            let lat = Stats::from_samples(&ours);
            let rl = Stats::from_samples(&theirs);
            let count = count_for(size).min(20_000);
            let gbps = best_of(|| {
                let t = Instant::now();
                client.block_on(windowed(count, WINDOW, || pool_op(op, size)))?;
                Ok((count * size as u64) as f64 / t.elapsed().as_nanos() as f64)
            })?;
            rows.push(Row {
                gbps,
                ..row(
                    op,
                    "latency",
                    size,
                    ours.len() as u64,
                    lat,
                    gbps,
                    rl.median_ns,
                )
            });
            bar.inc(1);
        }
        for &size in bw_sizes {
            bar.set_message(format!("pool {} {} bandwidth", op.name(), show(size)));
            let count = count_for(size);
            // Best of three each, taken in turns.
            let (mut theirs, mut ours) = (0f64, 0f64);
            for _ in 0..BEST_OF {
                theirs = theirs.max(raw.bandwidth(op, size, count)?);
                let t = Instant::now();
                client.block_on(windowed(count, WINDOW, || pool_op(op, size)))?;
                ours = ours.max((count * size as u64) as f64 / t.elapsed().as_nanos() as f64);
            }
            let iters = iters_for(size, base_iters);
            let mut samples = Vec::with_capacity(iters as usize);
            for _ in 0..iters {
                let t = Instant::now();
                client.block_on(pool_op(op, size))?;
                samples.push(t.elapsed().as_nanos() as u64);
            }
            let lat = Stats::from_samples(&samples);
            rows.push(row(op, "bandwidth", size, count, lat, ours, theirs));
            bar.inc(1);
        }
    }
    client.block_on(client.free(ptr))?;
    Ok(rows)
}
