//! `rdma-tool bench store`: the replicated object store (docs/STORE.md) against Redis, in
//! the same run.
//!
//! For each transport and value size, three memory servers start in this process and each
//! client thread gets its own `Store` (its own pool client and id). Each client owns
//! `--keys` keys; a put writes one of them (the next, round-robin), a get reads one. The
//! same clients, keys and sizes then run against a `redis-server` started here on
//! loopback with persistence off (one connection per client, the `redis` crate, as an
//! application would), SET for put and GET for get, and `redis-benchmark` gives Redis's
//! own figure. Rows: get and put throughput at each client count against Redis's (ratio =
//! ours / Redis, higher is better), one-client get latency against Redis's (ratio = ours /
//! Redis, lower is better), the cost of a second replica (put with r = 2 against r = 1), and
//! with one client `get_many` of all its keys per call against Redis's MGET of the same
//! keys (rate in calls per second).

pub(super) mod redis_ref;

use super::pool::{clients, Rate};
use super::report::{print_json, print_table, Row};
use crate::device_args::DeviceArgs;
use crate::progress::Steps;
use crate::units::{duration_arg, message_size_arg, show};
use crate::{Result, ToolError};
use rdmapool::fabric::{ProviderKind, Transport};
use rdmapool::remote::{ClientConfig, MemoryServer, PoolClient, ServerConfig, StaticMembership};
use rdmapool::store::{CacheConfig, Store, StoreConfig};
use redis_ref::RedisServer;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Arguments of `bench store`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    device: DeviceArgs,
    /// Where the memory servers listen.
    #[arg(long, default_value = "127.0.0.1")]
    ip: IpAddr,
    /// Soft provider paths, comma-separated: tcp, local.
    #[arg(long, default_value = "tcp,local", value_parser = crate::device_args::transport_arg)]
    transport: String,
    /// Client counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4",
          value_parser = crate::units::usize_arg(64))]
    clients: Vec<usize>,
    /// Value sizes, comma-separated, at most 16M (values above 256 KiB are striped over the
    /// servers).
    #[arg(long, value_delimiter = ',', default_value = "64,4K,1M", value_parser = message_size_arg)]
    size: Vec<usize>,
    /// Keys each client owns.
    #[arg(long, default_value_t = 16, value_parser = crate::units::usize_arg(4096))]
    keys: usize,
    /// Replicas of every object (the r = 1 comparison row is always measured too).
    #[arg(long, default_value_t = 2, value_parser = crate::units::usize_arg(3))]
    replicas: usize,
    /// How long each measurement runs: `1s`, `500ms`; at most 10m.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    duration: Duration,
    /// Skip Redis (the rows then have no reference).
    #[arg(long)]
    no_redis: bool,
    /// Also run every put and get against three isolated servers (`serve --isolated`: each
    /// client a tenant with its own namespace), each row against the trusted servers' rate
    /// of the same run.
    #[arg(long)]
    isolated: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// Memory servers per run.
pub(super) const SERVERS: u32 = 3;
/// The servers' chunk size: 1 MiB values (2 MiB blocks) four to a chunk.
const CHUNK: u64 = 8 << 20;
/// The largest value measured (the store takes up to 64 MiB; the servers here are sized
/// for every client's values four times over).
const MAX_SIZE: usize = 16 << 20;
/// The grace period of the bench's stores for values above 64 KiB: replaced blocks are
/// reused soon, so a put loop does not fill the servers (a reader slower than this would
/// read again). At 20 ms, intra-host puts of 1 MiB values (with the servers' memory mapped)
/// replaced versions faster than their blocks came free and exhausted the servers.
const GRACE: Duration = Duration::from_millis(2);

/// The grace period for values up to 64 KiB: long enough that a client's hint of a key it
/// put a moment ago is current (a quarter of the grace), so its next put of the key takes
/// one round trip (docs/STORE.md section 6), as it would with the default 1 s; the servers
/// are sized for the blocks retired meanwhile ([`RETIRED_PER_SECOND`]).
const SMALL_GRACE: Duration = Duration::from_millis(100);

/// Puts a second, all clients together, that the servers have room to retire for a grace
/// period.
const RETIRED_PER_SECOND: f64 = 250_000.0;

/// The bench's grace period for values of `size` bytes.
pub(super) fn grace_for(size: usize) -> Duration {
    if size <= 64 << 10 {
        SMALL_GRACE
    } else {
        GRACE
    }
}

fn server_config(ip: IpAddr, node: u32, size: usize) -> ServerConfig {
    trusted_or_isolated(ip, node, size, false)
}

fn trusted_or_isolated(ip: IpAddr, node: u32, size: usize, isolated: bool) -> ServerConfig {
    ServerConfig {
        node,
        size,
        chunk_size: CHUNK,
        clients: 256,
        lease: Duration::from_secs(30),
        listen: SocketAddr::new(ip, 0),
        isolation: if isolated {
            rdmapool::remote::Isolation::Isolated
        } else {
            rdmapool::remote::Isolation::Trusted
        },
        ..ServerConfig::default()
    }
}

/// One measured figure of ours and its reference.
struct Measured {
    ours: Rate,
    redis: Option<Rate>,
}

fn row(transport: &str, provider: ProviderKind, op: String, size: usize, m: &Measured) -> Row {
    let (reference, value, ratio) = match &m.redis {
        Some(r) => (
            format!(
                "redis {} (p50 {})",
                op,
                super::report::fmt_ns(r.pair.median_ns)
            ),
            r.mops(),
            m.ours.mops() / r.mops(),
        ),
        None => ("-".into(), 0.0, 0.0),
    };
    Row {
        provider: provider.name().into(),
        transport: transport.into(),
        op,
        metric: "rate".into(),
        size,
        iters: m.ours.pairs,
        median_ns: m.ours.pair.median_ns,
        p99_ns: m.ours.pair.p99_ns,
        gbps: 0.0,
        mops: m.ours.mops(),
        reference,
        reference_value: value,
        ratio,
    }
}

fn latency_row(
    transport: &str,
    provider: ProviderKind,
    op: &str,
    size: usize,
    ours: &Rate,
    reference: Option<(&str, &Rate)>,
) -> Row {
    let (name, value, ratio) = match reference {
        Some((name, r)) => (
            format!("{name} (p99 {})", super::report::fmt_ns(r.pair.p99_ns)),
            r.pair.median_ns,
            ours.pair.median_ns / r.pair.median_ns,
        ),
        None => ("-".into(), 0.0, 0.0),
    };
    Row {
        provider: provider.name().into(),
        transport: transport.into(),
        op: op.into(),
        metric: "latency".into(),
        size,
        iters: ours.pairs,
        median_ns: ours.pair.median_ns,
        p99_ns: ours.pair.p99_ns,
        gbps: 0.0,
        mops: 0.0,
        reference: name,
        reference_value: value,
        ratio,
    }
}

/// Runs the benchmark and prints the table or JSON.
pub fn run(args: Args) -> Result<()> {
    if let Some(&big) = args.size.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
        return Err(ToolError::Msg(format!(
            "--size {}: from 1 byte to {} here",
            show(big),
            show(MAX_SIZE)
        )));
    }
    let transports: Vec<String> = args.transport.split(',').map(|t| t.trim().into()).collect();
    let provider = args.device.kind();
    let redis = if args.no_redis {
        None
    } else {
        match RedisServer::start() {
            Ok(r) => Some(r),
            Err(e) => {
                crate::errln!("rdma-tool bench store: {e}; the rows have no Redis reference");
                None
            }
        }
    };
    let secs = args.duration.as_secs_f64();
    let per_size = args.clients.len() * if args.isolated { 4 } else { 2 } + 1;
    let steps = transports.len() * args.size.len() * per_size
        + if args.clients.contains(&1) {
            transports.len() * args.size.len()
        } else {
            0
        };
    let mut bar = Steps::new("bench store", steps as u64, args.json);
    let mut rows = Vec::new();
    // Redis's figures do not depend on our transport: measured once per size.
    let mut redis_rates: std::collections::HashMap<(usize, usize, &str), Rate> =
        std::collections::HashMap::new();
    let mut next_id = 1u64;
    for tname in &transports {
        let transport = Transport::parse(tname)?;
        let path = if transport == Transport::Tcp {
            "tcp"
        } else {
            "local"
        };
        for &size in &args.size {
            let keys = if size >= 256 << 10 {
                args.keys.min(4)
            } else {
                args.keys
            };
            let most = args.clients.iter().copied().max().unwrap_or(1);
            // Room for every client's blocks on every server four times over (blocks
            // replaced and waiting out the grace period).
            let server_size = server_size(size, most * keys * 4, args.replicas, most);
            let ctx = args.device.open(transport)?;
            let servers = start_servers(&ctx, args.ip, server_size)?;
            let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
            let value: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
            bar.set_message(format!("{path} {}: connecting and filling", show(size)));
            let all = connect_clients(&args, transport, &addrs, most, next_id, keys, &value)?;
            next_id += most as u64;
            let mut one_client_put_r1 = None;
            let mut trusted = Vec::new();
            for &n in &args.clients {
                for op in ["put", "get"] {
                    bar.set_message(format!("{path} {} {op} x{n}", show(size)));
                    let ours = store_clients(&all, n, keys, &value, op, args.replicas, secs)?;
                    if args.isolated {
                        trusted.push((n, op, ours.clone()));
                    }
                    let redis = match &redis {
                        Some(r) => Some(match redis_rates.remove(&(size, n, op)) {
                            Some(rate) => rate,
                            None => r.clients(n, keys, &value, op, secs)?,
                        }),
                        None => None,
                    };
                    bar.inc();
                    let m = Measured { ours, redis };
                    rows.push(row(path, provider, format!("{op} x{n}"), size, &m));
                    if n == 1 && op == "get" {
                        let reference = m.redis.as_ref().map(|r| ("redis GET", r));
                        rows.push(latency_row(path, provider, "get", size, &m.ours, reference));
                    }
                    if n == 1 && op == "put" && args.replicas > 1 {
                        bar.set_message(format!("{path} {} put x1 r=1", show(size)));
                        let r1 = store_clients(&all, 1, keys, &value, "put", 1, secs)?;
                        bar.inc();
                        one_client_put_r1 = Some((r1, m.ours));
                    }
                    if let Some(r) = m.redis {
                        redis_rates.insert((size, n, op), r);
                    }
                }
                if n == 1 {
                    // Every key of the client in one call: get_many against MGET.
                    bar.set_message(format!("{path} {} get_many x1", show(size)));
                    let ours = store_clients(&all, 1, keys, &value, "mget", 1, secs)?;
                    let redis = match &redis {
                        Some(r) => Some(match redis_rates.remove(&(size, 0, "mget")) {
                            Some(rate) => rate,
                            None => r.clients(1, keys, &value, "mget", secs)?,
                        }),
                        None => None,
                    };
                    let m = Measured { ours, redis };
                    let mut r = row(path, provider, format!("get_many({keys}) x1"), size, &m);
                    r.reference = r.reference.replace(&format!("get_many({keys})"), "MGET");
                    rows.push(r);
                    if let Some(r) = m.redis {
                        redis_rates.insert((size, 0, "mget"), r);
                    }
                }
            }
            if let Some((r1, r2)) = one_client_put_r1 {
                let name = format!("put r={} vs r=1", args.replicas);
                rows.push(latency_row(
                    path,
                    provider,
                    &name,
                    size,
                    &r2,
                    Some(("put r=1", &r1)),
                ));
            }
            check_one_sided(&servers)?;
            drop((all, servers));
            if args.isolated {
                // The same clients and keys as tenants of isolated servers.
                let servers: Vec<MemoryServer> = (1..=SERVERS)
                    .map(|n| {
                        MemoryServer::start(
                            &ctx,
                            trusted_or_isolated(args.ip, n, server_size, true),
                        )
                    })
                    .collect::<rdmapool::Result<_>>()?;
                let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
                bar.set_message(format!(
                    "{path} {}: isolated, connecting and filling",
                    show(size)
                ));
                let tenants =
                    connect_clients(&args, transport, &addrs, most, next_id, keys, &value)?;
                next_id += most as u64;
                for (n, op, reference) in &trusted {
                    bar.set_message(format!("{path} {} isolated {op} x{n}", show(size)));
                    let ours = store_clients(&tenants, *n, keys, &value, op, args.replicas, secs)?;
                    bar.inc();
                    let m = Measured {
                        ours,
                        redis: Some(reference.clone()),
                    };
                    let mut r = row(path, provider, format!("isolated {op} x{n}"), size, &m);
                    r.reference = format!(
                        "trusted {op} x{n} (p50 {})",
                        super::report::fmt_ns(reference.pair.median_ns)
                    );
                    rows.push(r);
                }
            }
        }
    }
    bar.finish();
    let bench = redis
        .as_ref()
        .map(|r| r.benchmark(&args.size, &args.clients));
    if args.json {
        print_json(&rows);
        if let Some(Ok(b)) = &bench {
            print_json(b);
        }
    } else {
        print_table(&rows);
        if let Some(b) = &bench {
            match b {
                Ok(b) => {
                    crate::outln!(
                        "\nredis-benchmark's own figures (same server, same sizes and clients):"
                    );
                    print_table(b);
                }
                Err(e) => crate::outln!("\nredis-benchmark: {e}"),
            }
        }
        summary(&rows);
    }
    Ok(())
}

/// The goals, under the table.
fn summary(rows: &[Row]) {
    for r in rows.iter().filter(|r| r.op.starts_with("isolated")) {
        crate::outln!(
            "{} {} {}, isolated / trusted: {:.2}x",
            r.transport,
            r.op.trim_start_matches("isolated "),
            show(r.size),
            r.ratio
        );
    }
    let with_ref: Vec<&Row> = rows
        .iter()
        .filter(|r| r.ratio > 0.0 && !r.op.starts_with("isolated"))
        .collect();
    if with_ref.is_empty() {
        return;
    }
    let missed: Vec<String> = with_ref
        .iter()
        .filter(|r| match (r.metric.as_str(), r.op.as_str()) {
            ("latency", "get") => r.ratio > 0.5,
            ("latency", _) => r.ratio > 1.5,
            _ => r.ratio < 1.0,
        })
        .map(|r| {
            format!(
                "{} {} {} {} ({:.2})",
                r.transport,
                r.op,
                r.metric,
                show(r.size),
                r.ratio
            )
        })
        .collect();
    crate::outln!(
        "\ngoals (get latency <= 0.5x Redis, get/put rate >= 1x Redis, r=2 put <= 1.5x r=1): {} of {} rows met{}",
        with_ref.len() - missed.len(),
        with_ref.len(),
        if missed.is_empty() { String::new() } else { format!("; missed: {}", missed.join(", ")) }
    );
}

/// The block a value of `size` bytes takes at most (header and key included).
pub(super) fn block_of(size: usize) -> usize {
    (size + 4096).next_power_of_two().max(64)
}

/// The blocks of values of `size` bytes that can wait out their grace period at once
/// ([`RETIRED_PER_SECOND`]).
pub(super) fn retired_blocks(size: usize) -> usize {
    (RETIRED_PER_SECOND * grace_for(size).as_secs_f64()) as usize
}

/// The size of each of the [`SERVERS`] memory servers for `stored` values of `size` bytes
/// kept at once (each `replicas` times, spread over the servers) by up to `clients`
/// clients, with room for the blocks replaced and waiting out the grace period.
pub(super) fn server_size(size: usize, stored: usize, replicas: usize, clients: usize) -> usize {
    server_size_bytes(
        (stored + retired_blocks(size)) * block_of(size),
        replicas,
        clients,
    )
}

/// The size of each of the [`SERVERS`] memory servers for `bytes` of blocks (one copy of
/// each, stored `replicas` times over the servers) written by up to `clients` clients: with
/// the chunks each client claims for its size classes (a striped value's parts and its
/// manifest take two) and the index.
pub(super) fn server_size_bytes(bytes: usize, replicas: usize, clients: usize) -> usize {
    let need = bytes * replicas / SERVERS as usize;
    let chunks = (3 * clients as u64 + 2) * CHUNK;
    (need as u64 + chunks + CHUNK).next_multiple_of(CHUNK) as usize
}

/// [`SERVERS`] trusted memory servers of `size` bytes each on `ctx`, listening on `ip`.
pub(super) fn start_servers(
    ctx: &rdmapool::fabric::Context,
    ip: IpAddr,
    size: usize,
) -> Result<Vec<MemoryServer>> {
    start_servers_chunked(ctx, ip, size, CHUNK)
}

/// [`start_servers`] with chunks of `chunk` bytes (a store's index is one chunk: its
/// buckets are `chunk / 64`).
pub(super) fn start_servers_chunked(
    ctx: &rdmapool::fabric::Context,
    ip: IpAddr,
    size: usize,
    chunk: u64,
) -> Result<Vec<MemoryServer>> {
    Ok((1..=SERVERS)
        .map(|n| {
            let cfg = ServerConfig {
                chunk_size: chunk,
                ..server_config(ip, n, size)
            };
            MemoryServer::start(ctx, cfg)
        })
        .collect::<rdmapool::Result<_>>()?)
}

/// An error unless `servers` handled no request: the store is one-sided, so their CPUs
/// take no part in a put or a get.
pub(super) fn check_one_sided(servers: &[MemoryServer]) -> Result<()> {
    let handled: u64 = servers.iter().map(|s| s.stats().requests_handled).sum();
    if handled != 0 {
        return Err(ToolError::Msg(format!(
            "the memory servers handled {handled} requests: the store is meant to be one-sided"
        )));
    }
    Ok(())
}

/// A bench client: its store, on a context of its own.
pub(super) struct Client {
    /// The client's store (its own pool client and id).
    pub(super) store: Store,
    _ctx: rdmapool::fabric::Context,
}

/// `n` store clients on `addrs`, each on a context of its own with its own pool client
/// (ids from `first_id`), storing `replicas` copies with the bench's grace period for
/// values of `size` bytes.
pub(super) fn connect_stores(
    device: &DeviceArgs,
    transport: Transport,
    addrs: &[SocketAddr],
    n: usize,
    first_id: u64,
    replicas: usize,
    size: usize,
) -> Result<Vec<Client>> {
    (0..n)
        .map(|i| {
            connect_store(
                device,
                transport,
                addrs,
                first_id + i as u64,
                replicas,
                size,
                None,
            )
        })
        .collect()
}

/// One store client of id `id` on `addrs` (as [`connect_stores`] connects each), in cache
/// mode with `cache` if given.
pub(super) fn connect_store(
    device: &DeviceArgs,
    transport: Transport,
    addrs: &[SocketAddr],
    id: u64,
    replicas: usize,
    size: usize,
    cache: Option<CacheConfig>,
) -> Result<Client> {
    let members = StaticMembership::new(addrs.to_vec());
    let ctx = device.open(transport)?;
    let pd = ctx.alloc_pd()?;
    let pool = PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(id))?;
    let store = Store::new(
        pool,
        StoreConfig {
            replicas,
            grace: grace_for(size),
            cache,
            ..StoreConfig::default()
        },
    )?;
    Ok(Client { store, _ctx: ctx })
}

/// Waits out the grace period of values of `size` bytes, then frees the blocks `all`
/// replaced.
pub(super) fn free_retired(all: &[Client], size: usize) {
    std::thread::sleep(grace_for(size));
    for c in all {
        c.store.block_on(c.store.flush_retired());
    }
}

/// `most` store clients on `addrs`, each with its `keys` keys holding `value` already.
fn connect_clients(
    args: &Args,
    transport: Transport,
    addrs: &[SocketAddr],
    most: usize,
    first_id: u64,
    keys: usize,
    value: &[u8],
) -> Result<Vec<Client>> {
    let all = connect_stores(
        &args.device,
        transport,
        addrs,
        most,
        first_id,
        args.replicas,
        value.len(),
    )?;
    for (i, c) in all.iter().enumerate() {
        for k in 0..keys {
            c.store.block_on(c.store.put(&key(i, k), value))?;
        }
    }
    Ok(all)
}

fn key(client: usize, k: usize) -> Vec<u8> {
    format!("c{client}:k{k}").into_bytes()
}

/// The first `n` of `all` doing `op` on their own keys for `secs` (puts with `replicas`
/// copies); then the blocks their puts replaced are freed once their grace has passed.
fn store_clients(
    all: &[Client],
    n: usize,
    keys: usize,
    value: &[u8],
    op: &str,
    replicas: usize,
    secs: f64,
) -> Result<Rate> {
    let put = op == "put";
    let rate = clients(n, secs, |i| {
        let store = &all[i].store;
        let mut next = 0usize;
        let owned: Vec<Vec<u8>> = (0..keys).map(|k| key(i, k)).collect();
        Ok(move || -> Result<()> {
            let k = key(i, next % keys);
            next += 1;
            if op == "mget" {
                let names: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
                let got = store.block_on(store.get_many(&names));
                if got
                    .iter()
                    .any(|v| !matches!(v, Ok(Some(v)) if v.len() == value.len()))
                {
                    return Err(ToolError::Msg(
                        "bench store: a get_many missed a key it put".into(),
                    ));
                }
            } else if put {
                store.block_on(store.put_with(&k, value, replicas))?;
            } else if store.block_on(store.get(&k))?.map(|v| v.len()) != Some(value.len()) {
                return Err(ToolError::Msg(
                    "bench store: a get missed a key it put".into(),
                ));
            }
            Ok(())
        })
    });
    free_retired(all, value.len());
    rate
}
