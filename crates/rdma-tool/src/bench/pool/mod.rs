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
//! 3. The message rate of 8-byte WRITE and FAA in pool batches of 32 (one list, one
//!    completion each) against the same operations one future each, and against raw lists.

use super::report::{print_json, print_table, Row};
use super::Stats;
use crate::device_args::DeviceArgs;
use crate::progress::Steps;
use crate::units::{duration_arg, message_size_arg, secs_arg, show};
use crate::{Result, ToolError};
use rdmapool::fabric::*;
use rdmapool::remote::{
    ClientConfig, MemoryServer, PoolClient, RemotePtr, ServerConfig, StaticMembership,
};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

mod baseline;
mod batch;
mod claims;
mod data;
mod one_sided;
mod windowed;

use baseline::{two_sided, TwoSidedServer};
use data::data_rows;
use one_sided::{across_servers, one_sided};

/// Arguments of `bench pool`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    device: DeviceArgs,
    /// Where the servers listen (on verbs: the RDMA netdev's address).
    #[arg(long, default_value = "127.0.0.1")]
    ip: IpAddr,
    /// Client counts for the alloc+free rate, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = crate::units::usize_arg(MAX_CLIENTS))]
    clients: Vec<usize>,
    /// Object size for the alloc+free rate.
    #[arg(long, default_value = "64", value_parser = message_size_arg)]
    object_size: usize,
    /// Objects each client keeps allocated (each pair allocates one and frees the oldest).
    #[arg(long, default_value_t = 64, value_parser = crate::units::usize_arg(1 << 20))]
    live: usize,
    /// How long each alloc+free measurement runs (each design, each client count): `1s`,
    /// `500ms`; at most 10m.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    duration: Duration,
    /// Deprecated: --duration in seconds.
    #[arg(long, hide = true, conflicts_with = "duration", value_parser = secs_arg)]
    secs: Option<f64>,
    /// READ/WRITE sizes for latency, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = message_size_arg, default_value = "8,4K")]
    latency_size: Vec<usize>,
    /// READ/WRITE sizes for bandwidth, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = message_size_arg, default_value = "64K,1M")]
    bandwidth_size: Vec<usize>,
    /// Latency iterations for 8-byte operations (larger sizes use fewer).
    #[arg(long, default_value_t = 5000, value_parser = crate::units::count_arg(super::data::MAX_ITERS))]
    iters: u64,
    /// Skip the alloc+free part.
    #[arg(long)]
    no_alloc: bool,
    /// Memory servers (each its own context, as on separate hosts) for the scaling row:
    /// alloc+free of one client spread over them against one server; 1 skips the row.
    #[arg(long, default_value_t = 3, value_parser = crate::units::usize_arg(16))]
    servers: usize,
    /// The soft provider's path between clients and servers: auto (intra-host here), tcp
    /// or local.
    #[arg(long, default_value = "auto", value_parser = crate::device_args::transport_arg)]
    transport: String,
    /// Also run alloc+free against an isolated server (`serve --isolated`), each row
    /// compared with the trusted server's one-sided rate of the same run, and the latency
    /// of an allocation that claims a chunk the server wipes first (handed out before)
    /// against one that claims a fresh chunk, for 256K and 2M chunks.
    #[arg(long)]
    isolated: bool,
    /// Skip the READ/WRITE part.
    #[arg(long)]
    no_data: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// Operations in flight for bandwidth runs (as in the raw harness).
/// Most clients of one alloc+free measurement: the pool server's lease slots.
const MAX_CLIENTS: usize = 256;
const WINDOW: usize = 16;
const BEST_OF: usize = 3;
/// Latency samples per turn when ours and the raw QP's alternate.
const LAT_BLOCK: u64 = 250;
const WAIT: Duration = Duration::from_secs(30);
/// The lease of the data rows' server: longer than they take.
const DATA_LEASE: Duration = Duration::from_secs(3600);

fn server_config(listen: SocketAddr, size: usize) -> ServerConfig {
    ServerConfig {
        node: 1,
        size,
        chunk_size: 2 << 20,
        clients: MAX_CLIENTS as u64,
        // Long enough for a client's renewal to come round while up to 256 client threads
        // share the cores (at 2 s, 100 of them on 2 cores missed renewals); the lease does
        // not enter what is measured.
        lease: Duration::from_secs(30),
        listen,
        ..ServerConfig::default()
    }
}

/// Runs the benchmark and prints the table or JSON.
pub fn run(args: Args) -> Result<()> {
    let device = &args.device;
    let provider = device.kind();
    let object = args.object_size as u64;
    let lat_sizes = args.latency_size.clone();
    let bw_sizes = args.bandwidth_size.clone();
    let secs = match args.secs {
        Some(s) if !(s > 0.0 && s <= 600.0) => {
            return Err(ToolError::Msg(
                "--secs: between 0 and 600 (better: --duration 1s)".into(),
            ))
        }
        Some(s) => s,
        None => args.duration.as_secs_f64(),
    };
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err(ToolError::Msg(
            "--clients: positive counts, e.g. 1,2,4,8".into(),
        ));
    }
    if secs > 600.0 {
        return Err(ToolError::Msg("--duration: at most 10m".into()));
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
    let transport = Transport::parse(&args.transport)?;
    let ctx = device.open(transport)?;
    // Each client takes a 2 MiB chunk for its size class: room for the most clients asked
    // for, the metadata chunk and one spare (32 MiB at least).
    let most = args.clients.iter().copied().max().unwrap_or(1);
    let size = ((most + 2) << 21).max(32 << 20);
    let server = MemoryServer::start(&ctx, server_config(SocketAddr::new(args.ip, 0), size))?;
    let isolated = match args.isolated && !args.no_alloc {
        true => Some(MemoryServer::start(
            &ctx,
            ServerConfig {
                isolation: rdmapool::remote::Isolation::Isolated,
                ..server_config(SocketAddr::new(args.ip, 0), size)
            },
        )?),
        false => None,
    };
    let spread = !args.no_alloc && args.servers > 1;
    let steps = if args.no_alloc {
        0
    } else {
        args.clients.len() * if isolated.is_some() { 3 } else { 2 }
            + if isolated.is_some() {
                claims::CHUNK_SIZES.len()
            } else {
                0
            }
    } + if spread { 2 } else { 0 }
        + if args.no_data {
            0
        } else {
            2 * (lat_sizes.len() + bw_sizes.len()) + 1
        };
    let mut bar = Steps::new("bench pool", steps as u64, args.json);
    let mut rows = Vec::new();
    let mut next_id = 1000u64;
    if !args.no_alloc {
        let baseline = TwoSidedServer::start(device, transport, args.ip, 32 << 20, object)?;
        for &n in &args.clients {
            bar.set_message(format!("alloc+free, {n} clients, one-sided"));
            let ours = one_sided(
                device,
                transport,
                &[&server],
                n,
                next_id,
                object,
                args.live,
                secs,
            )?;
            next_id += n as u64;
            bar.inc();
            bar.set_message(format!("alloc+free, {n} clients, two-sided"));
            let base = two_sided(device, transport, &baseline, n, object, args.live, secs)?;
            bar.inc();
            rows.push(ours.row(
                (provider, transport),
                format!("alloc+free x{n}"),
                object,
                format!("two-sided SEND/RECV x{n}"),
                &base,
            ));
            if let Some(iso) = &isolated {
                bar.set_message(format!("alloc+free, {n} clients, isolated"));
                let handled = iso.stats().requests_handled;
                let mine = one_sided(
                    device,
                    transport,
                    &[iso],
                    n,
                    next_id,
                    object,
                    args.live,
                    secs,
                )?;
                next_id += n as u64;
                let requests = iso.stats().requests_handled - handled;
                rows.push(mine.row(
                    (provider, transport),
                    format!("alloc+free x{n} isolated ({requests} server requests)"),
                    object,
                    format!("trusted one-sided x{n}"),
                    &ours,
                ));
            }
        }
        baseline.stop();
        if isolated.is_some() {
            rows.extend(claims::claim_rows(
                device, transport, args.ip, next_id, &mut bar,
            )?);
            next_id += 1;
        }
    }
    drop((server, isolated));
    if spread {
        rows.push(across_servers(
            device,
            transport,
            args.servers,
            size,
            object,
            args.live,
            secs,
            next_id,
            &mut bar,
        )?);
        next_id += 2;
    }
    if !args.no_data {
        // A server of their own, with a lease longer than any run: the raw reference QP
        // takes no lease slot, and a server disconnects lease-less connections after two
        // leases (4 s with the 2 s above, which cut the reference off mid-run).
        let data_server = MemoryServer::start(
            &ctx,
            ServerConfig {
                lease: DATA_LEASE,
                ..server_config(SocketAddr::new(args.ip, 0), 8 << 20)
            },
        )?;
        rows.extend(data_rows(
            device,
            transport,
            &data_server,
            next_id,
            &lat_sizes,
            &bw_sizes,
            max_data,
            args.iters,
            &mut bar,
        )?);
    }
    bar.finish();
    if args.json {
        print_json(&rows);
    } else {
        print_table(&rows);
        summary(&rows);
    }
    Ok(())
}

/// The path a row measured: the soft provider's transport (auto is intra-host here), or
/// the provider's name.
fn path(provider: ProviderKind, transport: Transport) -> String {
    match (provider, transport) {
        (ProviderKind::Soft, Transport::Tcp) => "tcp".into(),
        (ProviderKind::Soft, _) => "local".into(),
        (p, _) => p.name().into(),
    }
}

fn fmt_pair(s: &Stats) -> String {
    format!("pair p50 {}", super::report::fmt_ns(s.median_ns))
}

/// The verdicts the issue asks for, under the table.
fn summary(rows: &[Row]) {
    let rate: Vec<&Row> = rows
        .iter()
        .filter(|r| r.op.starts_with("alloc+free") && !r.op.contains("servers"))
        .collect();
    for r in rows.iter().filter(|r| r.op.contains("servers")) {
        crate::outln!(
            "\n{} / 1 server: {:.2}x (goal: >= 0.67, within 1.5x)",
            r.op.trim_start_matches("alloc+free x1, "),
            r.ratio
        );
    }
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
        crate::outln!(
            "\nalloc+free, one-sided pool / two-sided server: {} -> one-sided {} at every client count",
            parts.join(", "),
            if wins { "wins" } else { "does NOT win" }
        );
    }
    for r in rows.iter().filter(|r| r.op.starts_with("pool batch")) {
        crate::outln!("{} / {}: {:.2}x", r.op, r.reference, r.ratio);
    }
    for r in rows.iter().filter(|r| r.op.contains("wiped")) {
        crate::outln!(
            "isolated claim of a {} chunk, wiped first / fresh: {:.2}x ({:+.0} us at the median)",
            show(r.size),
            r.ratio,
            (r.median_ns - r.reference_value) / 1e3
        );
    }
    let data: Vec<&Row> = rows
        .iter()
        .filter(|r| r.metric != "rate" && !r.op.contains("wiped"))
        .collect();
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
            crate::outln!("READ/WRITE through the pool: every row within 10% of the raw QP");
        } else {
            crate::outln!(
                "READ/WRITE through the pool: {} of {} rows within 10% of the raw QP; outside: {}",
                data.len() - off.len(),
                data.len(),
                off.join(", ")
            );
        }
    }
}

/// What the clients of one measurement did together.
#[derive(Clone)]
pub(super) struct Rate {
    /// Operations (or pairs) done, all clients together.
    pub(super) pairs: u64,
    /// The longest client's run.
    pub(super) secs: f64,
    /// One operation's (or pair's) time, over all clients'.
    pub(super) pair: Stats,
}

impl Rate {
    /// Millions of operations per second, all clients together.
    pub(super) fn mops(&self) -> f64 {
        self.pairs as f64 / self.secs / 1e6
    }

    /// Its row in the table, against `reference` (named `name`).
    fn row(
        &self,
        (provider, transport): (ProviderKind, Transport),
        op: String,
        size: u64,
        name: String,
        reference: &Rate,
    ) -> Row {
        Row {
            provider: provider.name().into(),
            transport: path(provider, transport),
            op,
            metric: "rate".into(),
            size: size as usize,
            iters: self.pairs,
            median_ns: self.pair.median_ns,
            p99_ns: self.pair.p99_ns,
            gbps: 0.0,
            mops: self.mops(),
            reference: format!("{name} ({})", fmt_pair(&reference.pair)),
            reference_value: reference.mops(),
            ratio: self.mops() / reference.mops(),
        }
    }
}

/// Runs `n` client threads: each sets itself up with `setup`, then all start together and
/// do `pair` until `secs` have passed. Returns the total rate.
pub(super) fn clients<S, C>(n: usize, secs: f64, setup: S) -> Result<Rate>
where
    S: Fn(usize) -> Result<C> + Sync,
    C: FnMut() -> Result<()>,
{
    let until = Until {
        time: Some(Duration::from_secs_f64(secs)),
        ops: None,
    };
    clients_until(n, until, 100, |i| {
        let mut pair = setup(i)?;
        Ok(move || pair().map(|()| true))
    })
}

/// When the clients of [`clients_until`] stop: at the first bound reached, or when a
/// client's operations run out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Until {
    /// After this long (each client's clock starts after its warm-up).
    pub(super) time: Option<Duration>,
    /// After this many operations, all clients together (shared out evenly, the first
    /// clients taking one more when they do not divide).
    pub(super) ops: Option<u64>,
}

/// Runs `n` client threads: each sets itself up with `setup`, then all start together, do
/// `warmup` unmeasured operations, and do measured ones until `until` or until their
/// operation returns `false` (it had none left; not counted). Returns the total rate.
pub(super) fn clients_until<S, C>(n: usize, until: Until, warmup: u32, setup: S) -> Result<Rate>
where
    S: Fn(usize) -> Result<C> + Sync,
    C: FnMut() -> Result<bool>,
{
    let barrier = Barrier::new(n);
    let failed = AtomicBool::new(false);
    let results: Vec<Result<(u64, f64, Vec<u64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, failed, setup) = (&barrier, &failed, &setup);
                let mine = until
                    .ops
                    .map(|t| t / n as u64 + u64::from((i as u64) < t % n as u64));
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
                    for _ in 0..warmup {
                        if !pair()? {
                            break;
                        }
                    }
                    let mut samples = Vec::with_capacity(1 << 16);
                    let t0 = Instant::now();
                    let mut last = t0;
                    while mine.is_none_or(|m| (samples.len() as u64) < m) {
                        if !pair()? {
                            break;
                        }
                        let now = Instant::now();
                        samples.push((now - last).as_nanos() as u64);
                        last = now;
                        if until.time.is_some_and(|run| now - t0 >= run) {
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
