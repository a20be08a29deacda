//! `rdma-tool stress`: threads register and deregister memory `--count` times through the
//! asynchronous registrar and report what registration costs, apart from allocation.
//!
//! By default each thread allocates its memory once (and touches it) and registers and
//! deregisters it every round, as a service with pooled memory does; `--memory fresh`
//! allocates (and touches) new memory every round, timed separately. Regions of 2 MiB or
//! more use 2 MiB pages unless `--small-pages` (`--hugepages` forces them for smaller ones).

mod memory;
mod report;

use crate::sizes::parse_size;
use crate::{Result, ToolError};
use memory::{Buffers, MemoryMode};
use rdmapool::fabric::{AccessFlags, Context, ProviderKind};
use rdmapool::mr::{Registrar, RegistrarConfig};
use report::{Progress, Summary};
use std::time::Instant;

/// Arguments of `stress`.
#[derive(clap::Args)]
pub struct Args {
    /// Bytes registered per round, split evenly across the threads (K/M/G suffixes).
    #[arg(long, default_value = "64M")]
    size: String,
    /// Rounds: every round registers `size` bytes and deregisters them again.
    #[arg(long, default_value_t = 100)]
    count: u64,
    /// Registration worker threads (one region per thread per round, at most 1024).
    #[arg(long, default_value_t = 4)]
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
    /// soft or verbs.
    #[arg(long, default_value = "soft")]
    provider: String,
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
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

fn record(h: &mut hdrhistogram::Histogram<u64>, since: Instant) {
    h.saturating_record(since.elapsed().as_nanos().max(1) as u64);
}

/// Runs the stress loop.
pub fn run(args: Args) -> Result<()> {
    let size = parse_size(&args.size)?;
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
            args.size
        )));
    }
    let _metrics = match &args.metrics_socket {
        Some(s) => Some(
            rdmapool::metrics::Endpoint::start(rdmapool::metrics::EndpointConfig {
                unix: Some(rdmapool::metrics::UnixName::parse(s)),
                http: None,
            })
            .map_err(|e| ToolError::Msg(format!("--metrics-socket: {e}")))?,
        ),
        // Otherwise RDMAPOOL_METRICS_SOCKET / RDMAPOOL_METRICS_HTTP, if set.
        None => rdmapool::metrics::Endpoint::from_env()
            .map_err(|e| ToolError::Msg(format!("metrics endpoint: {e}")))?,
    };
    let ctx = match ProviderKind::parse(&args.provider)? {
        ProviderKind::Soft => Context::open_soft()?,
        p => Context::open_provider(p, None)?,
    };
    let reg = Registrar::new(
        ctx.alloc_pd()?,
        RegistrarConfig {
            workers: args.threads,
            ..RegistrarConfig::default()
        },
    )?;
    let hugepages = args.hugepages || (!args.small_pages && per_region >= 2 << 20);
    let mut s = Summary {
        provider: args.provider.clone(),
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
    }
    progress.finish();
    s.wall = started.elapsed().as_secs_f64();
    s.retries = reg.stats().retries;
    report::print(&s, args.json);
    if let Some(path) = &args.plot {
        let title = format!(
            "rdma-tool stress on {}: {} rounds x {} threads x {} bytes",
            s.provider, s.rounds_done, s.threads, s.region_bytes
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
        (None, 0) => Ok(()),
        (None, n) => Err(ToolError::Msg(format!("{n} registrations failed"))),
    }
}
