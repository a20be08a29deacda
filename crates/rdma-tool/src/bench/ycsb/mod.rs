//! `rdma-tool bench ycsb`: YCSB workloads against the replicated store, and against
//! redis-server and memcached started here, in the same run and with the same key streams.
//!
//! For each transport, three memory servers start in this process (as `bench store` sets
//! them up) and each client thread gets its own `Store` (its own pool client and id). The
//! load phase inserts every record (`--records` of `--record-size` bytes, the clients
//! sharing them out); then each workload runs at each client count for `--duration` (or
//! `--ops`), every client drawing its requests from a stream of its own seeded from
//! `--seed` (`workload.rs`). The same streams are then replayed against a `redis-server`
//! (one `redis`-crate connection per client: GET, SET; a read-modify-write is a GET then a
//! SET) and a `memcached` (`memcached_ref.rs`), each loaded with the same records first.
//! Their figures do not depend on our transport: they are measured once, with the first
//! transport, and compared with every transport's.
//!
//! `--trace FILE.csv` replaces the generated workloads with a cache trace (`trace.rs`):
//! every system starts each replay with none of the trace's keys (removed first), and the
//! replay runs to the trace's end unless `--duration` or `--ops` stops it before.
//!
//! `--hit-rate` adds hit-rate runs at cache sizes of a percent of the working set: the store
//! in cache mode against Redis (`allkeys-lru`), memcached and an exact LRU, on a Zipfian
//! stream of gets with miss fills, and on the same stream mixed with scans (`hit.rs` says
//! what each system is given and how the streams are made). With it, the throughput
//! workloads run only when `--workload` names them.
//!
//! Rows: one per (workload, transport, client count, reference), `op` the workload and the
//! client count (`ycsb-b x2`, `trace x1`), metric `rate` (operations per second, all clients
//! together; a read-modify-write counts one), ratio = ours / the reference's (higher is
//! better); then the hit-rate rows, metric `hit_rate` (`hit.rs`).

mod hit;
mod kv;
mod lru;
mod memcached_ref;
mod plot;
mod trace;
mod workload;

use super::pool::{clients_until, Rate, Until};
use super::report::{print_json, print_table, Row};
use super::store::{self, redis_ref::RedisServer};
use crate::device_args::DeviceArgs;
use crate::progress::Steps;
use crate::units::{count_arg, duration_arg, message_size_arg, show, usize_arg};
use crate::Result;
use kv::{trace_request, ycsb_request, Kv, RedisKv, Scratch, StoreKv};
use memcached_ref::MemcachedServer;
use rdmapool::fabric::{ProviderKind, Transport};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use trace::{Trace, TraceRequest};
use workload::{Generator, Op, Request, Workload};

/// Arguments of `bench ycsb`.
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
    /// Client counts, comma-separated (a thread and a connection or store client each).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4", value_parser = usize_arg(64))]
    clients: Vec<usize>,
    /// YCSB core workloads, comma-separated: a (50% read, 50% update), b (95/5), c (read
    /// only), d (95% read, 5% insert, reads of the latest), f (50% read, 50%
    /// read-modify-write). Default a,b,c,f,d; none with --hit-rate. E (range scans) is left
    /// out: neither the store nor memcached has an ordered index.
    #[arg(long, value_delimiter = ',', value_parser = Workload::parse)]
    workload: Vec<Workload>,
    /// Records loaded before the workloads run (at most 100000).
    #[arg(long, default_value_t = 10_000, value_parser = usize_arg(MAX_RECORDS))]
    records: usize,
    /// Bytes per record (at most 1M).
    #[arg(long, default_value = "1K", value_parser = record_size_arg)]
    record_size: usize,
    /// How long each workload runs at each client count on each system: `2s`, `500ms`
    /// (default 2s; with --trace, the whole trace).
    #[arg(long, value_parser = duration_arg, conflicts_with = "ops")]
    duration: Option<Duration>,
    /// Operations per run instead of a duration, all clients together.
    #[arg(long, value_parser = count_arg(MAX_OPS))]
    ops: Option<u64>,
    /// The seed of the clients' request streams (the same seed, the same requests).
    #[arg(long, default_value_t = 44, value_parser = clap::value_parser!(u64))]
    seed: u64,
    /// Replicas of every record in the store.
    #[arg(long, default_value_t = 2, value_parser = usize_arg(3))]
    replicas: usize,
    /// Replay a cache trace instead of the workloads: CSV lines of timestamp,key,size,op
    /// (op get, set or delete; a get that misses sets the key; a header line is taken).
    #[arg(long, value_name = "FILE.csv", conflicts_with_all = ["workload", "records", "record_size", "hit_rate"])]
    trace: Option<PathBuf>,
    /// Also measure hit rates at --cache-sizes: the store in cache mode, Redis (maxmemory,
    /// allkeys-lru), memcached (-m) and an exact LRU, on a Zipfian stream of gets with miss
    /// fills and on the same stream with scans. The workloads then run only if --workload
    /// names them.
    #[arg(long)]
    hit_rate: bool,
    /// Cache sizes of --hit-rate, comma-separated, in percent of the working set (--records
    /// x --record-size): more than 0, at most 100.
    #[arg(long, value_delimiter = ',', default_value = "1,10", value_parser = hit::cache_size_arg, requires = "hit_rate")]
    cache_sizes: Vec<f64>,
    /// Gets measured per hit-rate run, after a warm-up of --records gets (at most 10M).
    #[arg(long, default_value_t = 100_000, value_parser = count_arg(hit::MAX_HIT_GETS), requires = "hit_rate")]
    hit_gets: u64,
    /// Skip Redis.
    #[arg(long)]
    no_redis: bool,
    /// Skip memcached.
    #[arg(long)]
    no_memcached: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw the throughput per workload against the client count (`.svg` or `.png`):
    /// ours on each transport next to Redis and memcached; with --hit-rate, a panel per
    /// hit-rate stream too (hit rate against the cache size).
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// The most records loaded.
const MAX_RECORDS: usize = 100_000;
/// The largest record.
const MAX_RECORD: usize = 1 << 20;
/// The most operations of one run.
const MAX_OPS: u64 = 1 << 40;
/// How long a run lasts without `--duration` or `--ops` (generated workloads).
const DEFAULT_DURATION: Duration = Duration::from_secs(2);
/// Bytes a memcached item takes besides its key and value, with room to spare.
const MEMCACHED_ITEM: usize = 150;

/// `--record-size`: a size up to [`MAX_RECORD`].
fn record_size_arg(s: &str) -> std::result::Result<usize, String> {
    let n = message_size_arg(s)?;
    if n > MAX_RECORD {
        return Err(format!("{s:?}: a record is at most {}", show(MAX_RECORD)));
    }
    Ok(n)
}

/// What one measurement runs.
#[derive(Clone, Copy)]
enum Phase<'a> {
    /// A YCSB workload.
    Ycsb(Workload),
    /// The trace.
    Trace(&'a Trace),
    /// Inserting every record.
    Load,
    /// Removing every key of the trace.
    Clear(&'a Trace),
}

impl Phase<'_> {
    /// The name its rows carry.
    fn name(&self) -> &'static str {
        match self {
            Phase::Ycsb(w) => w.name(),
            Phase::Trace(_) => "trace",
            Phase::Load => "load",
            Phase::Clear(_) => "clear",
        }
    }
}

/// What every client's stream is drawn from.
#[derive(Clone, Copy)]
struct Plan {
    records: u64,
    /// The record size, or the trace's largest value.
    size: usize,
    seed: u64,
}

/// One client's requests in one phase.
enum Stream<'a> {
    Ycsb(Box<Generator>),
    Load { next: u64, step: u64, end: u64 },
    Trace(&'a Trace, Box<dyn Iterator<Item = &'a TraceRequest> + 'a>),
    Clear(&'a Trace, Box<dyn Iterator<Item = u32> + 'a>),
}

impl<'a> Stream<'a> {
    /// Client `i` of `n`'s stream of `phase`.
    fn new(plan: Plan, phase: Phase<'a>, i: usize, n: usize) -> Self {
        match phase {
            Phase::Ycsb(w) => Stream::Ycsb(Box::new(Generator::new(
                w,
                plan.seed,
                plan.records,
                i as u64,
                n as u64,
            ))),
            Phase::Load => Stream::Load {
                next: i as u64,
                step: n as u64,
                end: plan.records,
            },
            Phase::Trace(t) => Stream::Trace(t, Box::new(t.share(i, n))),
            Phase::Clear(t) => Stream::Clear(t, Box::new(t.keys_of(i, n))),
        }
    }

    /// Runs the next request on `kv`; false when there is none left.
    fn step<K: Kv>(&mut self, kv: &mut K, s: &mut Scratch) -> Result<bool> {
        match self {
            Stream::Ycsb(g) => ycsb_request(kv, g.next_request(), s)?,
            Stream::Load { next, step, end } => {
                if *next >= *end {
                    return Ok(false);
                }
                let record = *next;
                *next += *step;
                let req = Request {
                    op: Op::Insert,
                    record,
                };
                ycsb_request(kv, req, s)?
            }
            Stream::Trace(t, share) => match share.next() {
                Some(req) => trace_request(kv, t, req, s)?,
                None => return Ok(false),
            },
            Stream::Clear(t, keys) => match keys.next() {
                Some(id) => kv.delete(t.key(id))?,
                None => return Ok(false),
            },
        }
        Ok(true)
    }
}

/// `n` clients of one system (each connected by `connect`) running `phase` until `until`.
fn measure<K, F>(plan: Plan, phase: Phase<'_>, n: usize, until: Until, connect: F) -> Result<Rate>
where
    K: Kv,
    F: Fn(usize) -> Result<K> + Sync,
{
    clients_until(n, until, 0, |i| {
        let mut kv = connect(i)?;
        let mut scratch = Scratch::new(plan.size);
        let mut stream = Stream::new(plan, phase, i, n);
        Ok(move || stream.step(&mut kv, &mut scratch))
    })
}

/// The bound of a phase that runs to its end (load, clear).
const TO_THE_END: Until = Until {
    time: None,
    ops: None,
};

/// A reference system started here.
enum Reference {
    Redis(RedisServer),
    Memcached(MemcachedServer),
}

impl Reference {
    fn name(&self) -> &'static str {
        match self {
            Reference::Redis(_) => "redis-server",
            Reference::Memcached(_) => "memcached",
        }
    }

    /// [`measure`] on this system.
    fn measure(&self, plan: Plan, phase: Phase<'_>, n: usize, until: Until) -> Result<Rate> {
        match self {
            Reference::Redis(r) => measure(plan, phase, n, until, |_| Ok(RedisKv(r.connect()?))),
            Reference::Memcached(m) => measure(plan, phase, n, until, |_| m.connect()),
        }
    }
}

/// Starts the references asked for; one that cannot start is left out, saying why.
fn start_references(args: &Args, memcached_mb: usize) -> Vec<Reference> {
    let mut refs = Vec::new();
    if !args.no_redis {
        match RedisServer::start() {
            Ok(r) => refs.push(Reference::Redis(r)),
            Err(e) => crate::errln!("rdma-tool bench ycsb: {e}; no redis-server rows"),
        }
    }
    if !args.no_memcached {
        match MemcachedServer::start(memcached_mb) {
            Ok(m) => refs.push(Reference::Memcached(m)),
            Err(e) => crate::errln!("rdma-tool bench ycsb: {e}; no memcached rows"),
        }
    }
    refs
}

/// How much memory the store's servers and memcached need.
struct Sizes {
    /// Each memory server's size.
    server: usize,
    /// memcached's `-m`, MiB.
    memcached_mb: usize,
}

fn sizes(args: &Args, trace: Option<&Trace>, most: usize) -> Result<Sizes> {
    let (server, items) = match trace {
        None => {
            // The records, and as many again for D's inserts, with room to spare.
            let stored = 3 * args.records;
            let server = store::server_size(args.record_size, stored, args.replicas, most);
            (
                server,
                2 * args.records * (args.record_size + 24 + MEMCACHED_ITEM),
            )
        }
        Some(t) => {
            let largest = t.largest_per_key();
            let mean = largest.iter().sum::<usize>() / largest.len().max(1);
            let blocks: usize = largest.iter().map(|&s| store::block_of(s)).sum();
            let grace_size = largest.iter().copied().max().unwrap_or(0);
            let retired = store::retired_blocks(grace_size) * store::block_of(mean);
            let server = store::server_size_bytes(2 * blocks + retired, args.replicas, most);
            let items = t
                .keys()
                .zip(&largest)
                .map(|(k, s)| k.len() + s + MEMCACHED_ITEM)
                .sum();
            (server, items)
        }
    };
    // Slabs of 1 MiB a size class, filled to 80% at worst; 64 MiB at least.
    let memcached_mb = (items * 5 / 4).div_ceil(1 << 20) + 64;
    let total = server * store::SERVERS as usize + (memcached_mb << 20);
    let what = if trace.is_some() {
        "--trace"
    } else {
        "--records x --record-size"
    };
    crate::units::fits_in_memory(&format!("{what}: servers and memcached of"), total)?;
    Ok(Sizes {
        server,
        memcached_mb,
    })
}

/// The value size every client's buffers hold: the record size, or the trace's largest.
fn plan_size(trace: Option<&Trace>, args: &Args) -> usize {
    match trace {
        Some(t) => t.largest_per_key().into_iter().max().unwrap_or(0),
        None => args.record_size,
    }
}

/// The workloads' default order (YCSB's: D last, as its inserts add records).
const DEFAULT_WORKLOADS: [Workload; 5] = [
    Workload::A,
    Workload::B,
    Workload::C,
    Workload::F,
    Workload::D,
];

/// The hit-rate references' results by (stream, cache size): measured once, with the
/// first transport, each with the name its rows carry.
type HitReferences = HashMap<(usize, usize), Vec<(&'static str, hit::Measured)>>;

/// The hit-rate runs on one transport: ours on fresh servers for each (stream, cache
/// size), the references the first time; rows and notes pushed.
struct HitRuns<'a> {
    args: &'a Args,
    plan: &'a hit::HitPlan,
    /// Each stream of [`hit::Mix::ALL`].
    streams: &'a [Vec<u32>],
    references: HitReferences,
    /// Redis or memcached could not start: not tried again.
    no_redis: bool,
    no_memcached: bool,
    rows: Vec<hit::HitRow>,
    notes: Vec<String>,
}

impl HitRuns<'_> {
    /// The progress steps of one transport's runs, and of the references'.
    fn steps(&self) -> (usize, usize) {
        let runs = hit::Mix::ALL.len() * self.plan.sizes.len();
        let refs = usize::from(!self.args.no_redis) + usize::from(!self.args.no_memcached);
        (runs, runs * refs)
    }

    fn run(
        &mut self,
        transport: Transport,
        path: &str,
        next_id: &mut u64,
        bar: &mut Steps,
    ) -> Result<()> {
        let (args, plan) = (self.args, self.plan);
        let provider = args.device.kind();
        for (m, mix) in hit::Mix::ALL.into_iter().enumerate() {
            let stream = &self.streams[m];
            for (c, &percent) in plan.sizes.iter().enumerate() {
                let op = hit::HitPlan::op(mix, percent);
                bar.set_message(format!("{path} {op}: the store"));
                let ours = hit::ours(
                    &args.device,
                    transport,
                    args.ip,
                    plan,
                    stream,
                    percent,
                    *next_id,
                )?;
                *next_id += 1;
                bar.inc();
                if !self.references.contains_key(&(m, c)) {
                    let mut theirs = Vec::new();
                    if !args.no_redis {
                        if !self.no_redis {
                            bar.set_message(format!("redis-server {op}"));
                            match hit::redis(plan, stream, percent)? {
                                Some(r) => theirs.push(("redis-server x1", r)),
                                None => self.no_redis = true,
                            }
                        }
                        bar.inc();
                    }
                    if !args.no_memcached {
                        if !self.no_memcached {
                            bar.set_message(format!("memcached {op}"));
                            match hit::memcached(plan, stream, percent)? {
                                Some(r) => theirs.push(("memcached x1", r)),
                                None => self.no_memcached = true,
                            }
                        }
                        bar.inc();
                    }
                    theirs.push(("exact-lru", hit::exact_lru(plan, stream, percent)));
                    self.references.insert((m, c), theirs);
                }
                let theirs = &self.references[&(m, c)];
                let mut held = vec![ours.held.clone()];
                for (name, t) in theirs {
                    self.rows
                        .push(hit::row(provider, path, &op, plan.size, &ours, (name, t)));
                    held.push(t.held.clone());
                }
                self.notes.push(format!("{path} {op}: {}", held.join("; ")));
            }
        }
        Ok(())
    }
}

/// Runs the benchmark and prints the table or JSON.
pub fn run(args: Args) -> Result<()> {
    args.device.check()?;
    if let Some(p) = &args.plot {
        crate::plot::check_path(p)?;
    }
    let trace = args.trace.as_deref().map(Trace::read).transpose()?;
    let trace = trace.as_ref();
    let hit_plan = if args.hit_rate {
        let plan = hit::HitPlan::new(
            args.records,
            args.record_size,
            args.seed,
            args.replicas,
            &args.cache_sizes,
            args.hit_gets,
        )?;
        plan.check_memory()?;
        Some(plan)
    } else {
        None
    };
    let mut phases: Vec<Phase> = Vec::new();
    match trace {
        Some(t) => phases.push(Phase::Trace(t)),
        None => {
            let workloads: &[Workload] = match (&args.workload[..], args.hit_rate) {
                ([], false) => &DEFAULT_WORKLOADS,
                (given, _) => given,
            };
            for &w in workloads {
                if !phases
                    .iter()
                    .any(|p| matches!(p, Phase::Ycsb(x) if *x == w))
                {
                    phases.push(Phase::Ycsb(w));
                }
            }
        }
    }
    let until = Until {
        time: match (trace, args.ops) {
            (None, None) => Some(args.duration.unwrap_or(DEFAULT_DURATION)),
            _ => args.duration,
        },
        ops: args.ops,
    };
    let plan = Plan {
        records: args.records as u64,
        size: plan_size(trace, &args),
        seed: args.seed,
    };
    // A row's size: the record size, or the trace's mean request.
    let row_size = trace.map_or(args.record_size, Trace::mean_size);
    let most = args.clients.iter().copied().max().unwrap_or(1);
    let throughput = !phases.is_empty();
    let sizes = if throughput {
        Some(sizes(&args, trace, most)?)
    } else {
        None
    };
    let transports: Vec<String> = args.transport.split(',').map(|t| t.trim().into()).collect();
    let provider = args.device.kind();
    let refs = match &sizes {
        Some(s) => start_references(&args, s.memcached_mb),
        None => Vec::new(),
    };
    let streams: Vec<Vec<u32>> = match &hit_plan {
        Some(h) => hit::Mix::ALL.into_iter().map(|m| h.stream(m)).collect(),
        None => Vec::new(),
    };
    let mut hits = hit_plan.as_ref().map(|plan| HitRuns {
        args: &args,
        plan,
        streams: &streams,
        references: HashMap::new(),
        no_redis: false,
        no_memcached: false,
        rows: Vec::new(),
        notes: Vec::new(),
    });
    let runs = phases.len() * args.clients.len();
    let hit_steps = hits.as_ref().map_or(0, |h| {
        let (ours, theirs) = h.steps();
        ours * transports.len() + theirs
    });
    let steps = runs * (transports.len() + refs.len()) + hit_steps;
    let mut bar = Steps::new("bench ycsb", steps as u64, args.json);
    let mut rows = Vec::new();
    // The references' rates by (phase, client count, reference): measured once.
    let mut measured: HashMap<(usize, usize, usize), Rate> = HashMap::new();
    let mut loaded = vec![false; refs.len()];
    let mut next_id = 1u64;
    for tname in &transports {
        let transport = Transport::parse(tname)?;
        let path = if transport == Transport::Tcp {
            "tcp"
        } else {
            "local"
        };
        if let Some(sizes) = &sizes {
            let ctx = args.device.open(transport)?;
            let servers = store::start_servers(&ctx, args.ip, sizes.server)?;
            let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
            bar.set_message(format!("{path}: connecting {most} store clients"));
            let all = store::connect_stores(
                &args.device,
                transport,
                &addrs,
                most,
                next_id,
                args.replicas,
                plan.size,
            )?;
            next_id += most as u64;
            let ours = |phase: Phase<'_>, n: usize, until: Until| {
                measure(plan, phase, n, until, |i| {
                    Ok(StoreKv {
                        store: &all[i].store,
                        replicas: args.replicas,
                    })
                })
            };
            if trace.is_none() {
                bar.set_message(format!("{path}: loading {} records", args.records));
                ours(Phase::Load, most, TO_THE_END)?;
            }
            for (p, &phase) in phases.iter().enumerate() {
                for &n in &args.clients {
                    let op = format!("{} x{n}", phase.name());
                    bar.set_message(format!("{path} {op}"));
                    if let Phase::Trace(t) = phase {
                        ours(Phase::Clear(t), most, TO_THE_END)?;
                    }
                    let rate = ours(phase, n, until)?;
                    store::free_retired(&all, plan.size);
                    bar.inc();
                    for (r, reference) in refs.iter().enumerate() {
                        let theirs = match measured.get(&(p, n, r)) {
                            Some(rate) => rate.clone(),
                            None => {
                                bar.set_message(format!("{} {op}", reference.name()));
                                if let Phase::Trace(t) = phase {
                                    reference.measure(plan, Phase::Clear(t), most, TO_THE_END)?;
                                } else if !loaded[r] {
                                    reference.measure(plan, Phase::Load, most, TO_THE_END)?;
                                    loaded[r] = true;
                                }
                                let rate = reference.measure(plan, phase, n, until)?;
                                bar.inc();
                                measured.insert((p, n, r), rate.clone());
                                rate
                            }
                        };
                        let name = format!("{} x{n}", reference.name());
                        rows.push(row(
                            provider,
                            path,
                            &op,
                            row_size,
                            &rate,
                            Some((name, &theirs)),
                        ));
                    }
                    if refs.is_empty() {
                        rows.push(row(provider, path, &op, row_size, &rate, None));
                    }
                }
            }
            store::check_one_sided(&servers)?;
            drop((all, servers));
        }
        if let Some(h) = &mut hits {
            h.run(transport, path, &mut next_id, &mut bar)?;
        }
    }
    bar.finish();
    drop(refs);
    let (hit_rows, notes) = hits.map_or_else(Default::default, |h| (h.rows, h.notes));
    if let Some(p) = &args.plot {
        plot::draw(p, provider.name(), &rows, &hit_rows)?;
    }
    if args.json {
        print_json(&rows);
        hit::print_json(&hit_rows);
    } else {
        if throughput {
            print_table(&rows);
            summary(&rows);
        }
        if !hit_rows.is_empty() {
            if throughput {
                crate::outln!();
            }
            hit::print_table(&hit_rows);
            hit::print_notes(&notes);
            hit::summary(&hit_rows);
        }
    }
    Ok(())
}

/// A row: our rate against `reference` (its name and rate), if any.
fn row(
    provider: ProviderKind,
    transport: &str,
    op: &str,
    size: usize,
    ours: &Rate,
    reference: Option<(String, &Rate)>,
) -> Row {
    let (name, value) = match reference {
        Some((name, r)) => (name, r.mops()),
        None => ("-".into(), 0.0),
    };
    Row {
        provider: provider.name().into(),
        transport: transport.into(),
        op: op.into(),
        metric: "rate".into(),
        size,
        iters: ours.pairs,
        median_ns: ours.pair.median_ns,
        p99_ns: ours.pair.p99_ns,
        gbps: 0.0,
        mops: ours.mops(),
        reference: name,
        reference_value: value,
        ratio: if value > 0.0 {
            ours.mops() / value
        } else {
            0.0
        },
    }
}

/// The goal of a row against Redis: B and C at least 2x intra-host and 1x over TCP, A and
/// F at least 1x intra-host; none for the others.
fn goal(r: &Row) -> Option<f64> {
    if !r.reference.starts_with("redis-server") || r.ratio <= 0.0 {
        return None;
    }
    let workload = r.op.split(' ').next().unwrap_or("");
    match (workload, r.transport.as_str()) {
        ("ycsb-b" | "ycsb-c", "local") => Some(2.0),
        ("ycsb-b" | "ycsb-c", "tcp") => Some(1.0),
        ("ycsb-a" | "ycsb-f", "local") => Some(1.0),
        _ => None,
    }
}

/// The goals, under the table: which rows met them.
fn summary(rows: &[Row]) {
    let judged: Vec<(&Row, f64)> = rows
        .iter()
        .filter_map(|r| goal(r).map(|g| (r, g)))
        .collect();
    let title = "goals (YCSB B and C >= 2x Redis intra-host and >= 1x over TCP; A and F >= 1x \
                 Redis intra-host)";
    if judged.is_empty() {
        // A trace has no goal; YCSB rows without Redis cannot be judged.
        if rows.iter().any(|r| r.op.starts_with("ycsb-")) {
            crate::outln!("\n{title}: no row to judge (no Redis rows of these workloads)");
        }
        return;
    }
    let show =
        |(r, g): &&(&Row, f64)| format!("{} {} {:.2}x (goal {g}x)", r.transport, r.op, r.ratio);
    let (met, missed): (Vec<_>, Vec<_>) = judged.iter().partition(|(r, g)| r.ratio >= *g);
    crate::outln!("\n{title}: {} of {} rows met", met.len(), judged.len());
    if !met.is_empty() {
        let list: Vec<String> = met.iter().map(show).collect();
        crate::outln!("met: {}", list.join(", "));
    }
    if !missed.is_empty() {
        let list: Vec<String> = missed.iter().map(show).collect();
        crate::outln!("missed: {}", list.join(", "));
    }
}
