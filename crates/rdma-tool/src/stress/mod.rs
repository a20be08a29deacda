//! `rdma-tool stress`: threads register and deregister memory `--count` times through the
//! asynchronous registrar and report what registration costs, apart from allocation.
//!
//! By default each thread allocates its memory once (and touches it) and registers and
//! deregisters it every round, as a service with pooled memory does; `--memory fresh`
//! allocates (and touches) new memory every round, timed separately. Regions of 2 MiB or
//! more use 2 MiB pages unless `--small-pages` (`--hugepages` forces them for smaller ones).

mod memory;
mod mix;
mod report;

use crate::{Result, ToolError};
use memory::{Buffers, MemoryMode};
use rdmapool::fabric::AccessFlags;
use rdmapool::mr::{Registrar, RegistrarConfig};
use report::{Progress, Summary};
use std::time::Instant;

/// Arguments of `stress`.
#[derive(clap::Args)]
pub struct Args {
    /// Bytes registered per round, split evenly across the threads (K/M/G suffixes).
    #[arg(long, default_value = "64M", value_parser = crate::units::size_arg)]
    size: usize,
    /// Rounds: every round registers `size` bytes and deregisters them again.
    #[arg(long, default_value_t = 100, value_parser = crate::units::count_arg(1_000_000_000))]
    count: u64,
    /// Registration worker threads (one region per thread per round, at most 1024).
    #[arg(long, default_value_t = 4, value_parser = crate::units::usize_arg(1024))]
    threads: usize,
    /// pooled: allocate once, register every round; fresh: allocate every round too.
    #[arg(long, value_enum, default_value_t = MemoryMode::Pooled)]
    memory: MemoryMode,
    /// Back the memory with 2 MiB pages (hugetlbfs if reserved, else transparent huge
    /// pages). The default when each region is at least 2 MiB: pinning 4 KiB pages costs
    /// the kernel about 512 times more page walks.
    #[arg(long, conflicts_with = "small_pages")]
    hugepages: bool,
    /// Use 4 KiB pages even for regions of 2 MiB or more.
    #[arg(long)]
    small_pages: bool,
    #[command(flatten)]
    device: crate::device_args::DeviceArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also draw the latency CDFs (registration, deregistration, allocation; with --mix,
    /// one per kind) to this file, `.svg` or `.png`.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Serve this process's metrics on a Unix socket (a path, or `@name` for an abstract
    /// socket) while it runs, for `rdma-tool monitor --target`. Without it, the
    /// RDMAPOOL_METRICS_SOCKET and RDMAPOOL_METRICS_HTTP variables are honoured.
    #[arg(long)]
    metrics_socket: Option<String>,
    /// Run these kinds of work together, comma-separated (any of reg,cache,pool), each
    /// thread one operation of each kind per round, as a loaded service would. reg:
    /// register and deregister the thread's region (--size / --threads) through the
    /// asynchronous registrar; cache: look buffers up in a registration cache (hits on a
    /// shared working set, every --cache-miss-every'th lookup a new buffer that registers);
    /// pool: allocate --pool-size from a pre-registered buffer pool (the last 4 held per
    /// thread, the oldest freed). The summary has each kind apart. Without it: plain
    /// registration rounds. Everything pinned must fit the memlock limit (`ulimit -l`)
    /// unless the process has CAP_IPC_LOCK; the run is refused up front if it cannot.
    #[arg(long, value_delimiter = ',')]
    mix: Vec<mix::Kind>,
    /// With --mix cache: bytes of each buffer looked up (default: the thread's region / 8,
    /// at least 4K, at most 4M).
    #[arg(long, value_parser = crate::units::size_arg)]
    cache_size: Option<usize>,
    /// With --mix cache: buffers in the working set all threads look up.
    #[arg(long, default_value_t = 8, value_parser = crate::units::usize_arg(65536))]
    cache_buffers: usize,
    /// With --mix cache: one lookup in this many is on a buffer the cache has not seen.
    #[arg(long, default_value_t = 8, value_parser = crate::units::count_arg(1_000_000_000))]
    cache_miss_every: u64,
    /// With --mix pool: bytes per pool allocation (default: the thread's region, at most
    /// 64K; the pool serves up to 2M).
    #[arg(long, value_parser = crate::units::size_arg)]
    pool_size: Option<usize>,
}

/// A latency histogram in ns, up to an hour.
fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

fn record(h: &mut hdrhistogram::Histogram<u64>, since: Instant) {
    h.saturating_record(since.elapsed().as_nanos().max(1) as u64);
}

/// Runs the stress loop.
pub fn run(args: Args) -> Result<()> {
    let size = args.size;
    crate::units::fits_in_memory("--size", size)?;
    if let Some(p) = &args.plot {
        crate::plot::check_path(p)?;
    }
    if args.threads == 0 || args.count == 0 {
        return Err(ToolError::Msg(
            "--threads and --count must be at least 1".into(),
        ));
    }
    let most = Registrar::MAX_WORKERS;
    if args.threads > most {
        return Err(ToolError::Msg(format!(
            "--threads {} is more than {most}: each thread is a registration worker with a \
             stack of its own; registration is bounded by page pinning, so use at most {most}",
            args.threads
        )));
    }
    let per_region = size / args.threads;
    if per_region == 0 {
        return Err(ToolError::Msg(format!(
            "--size {} is smaller than one byte per thread",
            crate::units::show(args.size)
        )));
    }
    // Ctrl-C or SIGTERM ends the run after the round in flight, with the summary of the
    // rounds done (installed before the metrics endpoint: once it answers, a signal is
    // caught).
    crate::signals::install()?;
    let metrics = match &args.metrics_socket {
        Some(s) => Some(
            rdmapool_exporter::Endpoint::start(rdmapool_exporter::EndpointConfig {
                unix: Some(rdmapool_exporter::UnixName::parse(s)),
                http: None,
            })
            .map_err(|e| ToolError::Msg(format!("--metrics-socket: {e}")))?,
        ),
        // Otherwise RDMAPOOL_METRICS_SOCKET / RDMAPOOL_METRICS_HTTP, if set.
        None => rdmapool_exporter::Endpoint::from_env()
            .map_err(|e| ToolError::Msg(format!("metrics endpoint: {e}")))?,
    };
    let plan = (!args.mix.is_empty())
        .then(|| mix_plan(&args, per_region))
        .transpose()?;
    let ctx = args.device.open(rdmapool::fabric::Transport::Auto)?;
    if let Some(ep) = &metrics {
        ep.watch(ctx.metrics());
    }
    if let Some(plan) = plan {
        return run_mix(&args, &plan, &ctx);
    }
    let reg = Registrar::new(
        ctx.alloc_pd()?,
        RegistrarConfig {
            workers: args.threads,
            ..RegistrarConfig::default()
        },
    )?;
    let hugepages = args.hugepages || (!args.small_pages && per_region >= 2 << 20);
    let mut s = Summary {
        provider: args.device.kind().name().to_string(),
        memory: args.memory,
        hugepages,
        size,
        count: args.count,
        threads: args.threads,
        region_bytes: per_region,
        rounds_done: 0,
        registered_bytes: 0,
        wall: 0.0,
        alloc: histogram(),
        reg: histogram(),
        dereg: histogram(),
        failures: 0,
        retries: 0,
        first_error: None,
        stopped_early: None,
        interrupted: false,
    };
    let mut buffers = Buffers::new(args.memory, hugepages, per_region, args.threads);
    let mut progress = Progress::new(args.count, args.json);
    let started = Instant::now();
    for round in 0..args.count {
        let bufs = buffers.take(&mut s.alloc)?;
        let pending: Vec<_> = bufs
            .into_iter()
            .map(|b| {
                (
                    Instant::now(),
                    reg.submit_owned(b, AccessFlags::all_remote()),
                )
            })
            .collect();
        let mut ok = 0;
        let mut back = Vec::with_capacity(args.threads);
        for (t, h) in pending {
            match h.wait() {
                Ok(registered) => {
                    record(&mut s.reg, t);
                    let t = Instant::now();
                    back.push(registered.into_inner()); // deregisters
                    record(&mut s.dereg, t);
                    ok += 1;
                }
                Err(e) => {
                    s.failures += 1;
                    s.first_error.get_or_insert(e.error.to_string());
                    back.push(e.into_inner());
                }
            }
        }
        buffers.give_back(back);
        s.rounds_done = round + 1;
        s.registered_bytes += ok * per_region as u64;
        if ok == 0 {
            // Nothing registered in a whole round: the cause will not go away by repeating.
            s.stopped_early = Some(round + 1);
            break;
        }
        progress.tick(&s, started);
        if crate::signals::stopped() {
            s.interrupted = true;
            break;
        }
    }
    progress.finish();
    s.wall = started.elapsed().as_secs_f64();
    s.retries = reg.stats().retries;
    report::print(&s, args.json);
    if let Some(path) = &args.plot {
        let title = format!(
            "rdma-tool stress on {}: {} rounds x {} threads x {}",
            s.provider,
            s.rounds_done,
            s.threads,
            crate::units::show(s.region_bytes)
        );
        crate::plot::latency_cdf(
            path,
            &title,
            &[
                ("registration", &s.reg),
                ("deregistration", &s.dereg),
                ("allocation and touch", &s.alloc),
            ],
        )?;
    }
    match (&s.stopped_early, s.failures) {
        (Some(r), _) => Err(ToolError::Msg(format!(
            "stopped after round {r}: nothing registered in it ({})",
            s.first_error.as_deref().unwrap_or("no error recorded")
        ))),
        _ if s.interrupted => Err(interrupted(s.rounds_done, s.count)),
        (None, 0) => Ok(()),
        (None, n) => Err(ToolError::Msg(format!("{n} registrations failed"))),
    }
}

/// The error of a run that SIGINT or SIGTERM ended early (its summary is printed first).
fn interrupted(rounds_done: u64, count: u64) -> ToolError {
    ToolError::Msg(format!(
        "interrupted after round {rounds_done} of {count}: the summary covers the rounds done"
    ))
}

/// The mixed run's plan from the flags, checked against the memlock limit.
fn mix_plan(args: &Args, per_region: usize) -> Result<mix::Plan> {
    let mut kinds = Vec::new();
    for &k in &args.mix {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let cache_size = args
        .cache_size
        .unwrap_or((per_region / 8).clamp(4096, 4 << 20));
    let pool_size = args.pool_size.unwrap_or(per_region.min(64 << 10));
    let most = rdmapool::buf::CLASSES[rdmapool::buf::CLASSES.len() - 1];
    if pool_size == 0 || pool_size > most {
        return Err(ToolError::Msg(format!(
            "--pool-size {pool_size}: the pool serves 1 byte to {}",
            crate::units::show(most)
        )));
    }
    if cache_size == 0 || args.cache_buffers == 0 || args.cache_miss_every == 0 {
        return Err(ToolError::Msg(
            "--cache-size, --cache-buffers and --cache-miss-every must be at least 1".into(),
        ));
    }
    let plan = mix::Plan {
        kinds,
        threads: args.threads,
        count: args.count,
        region_bytes: per_region,
        hugepages: args.hugepages || (!args.small_pages && per_region >= 2 << 20),
        cache_size,
        cache_buffers: args.cache_buffers,
        cache_miss_every: args.cache_miss_every,
        pool_size,
    };
    memory::check_memlock(plan.pinned_bytes())?;
    Ok(plan)
}

/// Runs `--mix` and reports each kind apart.
fn run_mix(args: &Args, plan: &mix::Plan, ctx: &rdmapool::fabric::Context) -> Result<()> {
    let r = mix::run(plan, &ctx.alloc_pd()?)?;
    report::print_mix(plan, &r, args.device.kind().name(), args.json);
    if let Some(path) = &args.plot {
        let names: Vec<&str> = plan.kinds.iter().map(|k| k.name()).collect();
        let title = format!(
            "rdma-tool stress --mix {} on {}: {} threads x {} rounds",
            names.join(","),
            args.device.kind().name(),
            plan.threads,
            plan.count
        );
        let labels: Vec<String> = r
            .kinds
            .iter()
            .map(|k| match k.kind {
                mix::Kind::Reg => "reg: registration, submit to ready".to_string(),
                mix::Kind::Cache => "cache: lookup (hits and misses)".to_string(),
                mix::Kind::Pool => "pool: allocation".to_string(),
            })
            .collect();
        let mut series: Vec<(&str, &hdrhistogram::Histogram<u64>)> = r
            .kinds
            .iter()
            .zip(&labels)
            .map(|(k, l)| (l.as_str(), &k.latency))
            .collect();
        if let Some(k) = r.kinds.iter().find(|k| k.kind == mix::Kind::Reg) {
            series.push(("reg: deregistration", &k.dereg));
        }
        if let Some(k) = r.kinds.iter().find(|k| k.kind == mix::Kind::Cache) {
            series.push(("cache: lookups on new buffers (misses)", &k.misses));
        }
        crate::plot::latency_cdf(path, &title, &series)?;
    }
    if let Some(done) = r.interrupted_after {
        return Err(interrupted(done, plan.count));
    }
    let failed: u64 = r.kinds.iter().map(|k| k.failures).sum();
    if failed > 0 {
        return Err(ToolError::Msg(format!(
            "{failed} operations failed ({})",
            r.kinds
                .iter()
                .filter_map(|k| k
                    .first_error
                    .as_deref()
                    .map(|e| format!("{}: {e}", k.kind.name())))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    Ok(())
}
