//! `rdma-tool stress`: threads register and deregister regions that sum to `--size`,
//! `--count` times, through the asynchronous registrar; prints throughput, latency
//! percentiles, failures and retries.

use crate::sizes::{parse_size, show};
use crate::{Result, ToolError};
use rdmapool::fabric::{AccessFlags, Context, ProviderKind};
use rdmapool::mr::{Registrar, RegistrarConfig};
use serde_json::json;
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
    /// Registration worker threads (one region per thread per round).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// soft or verbs.
    #[arg(long, default_value = "soft")]
    provider: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// Runs the stress loop.
pub fn run(args: Args) -> Result<()> {
    let size = parse_size(&args.size)?;
    if args.threads == 0 || args.count == 0 {
        return Err(ToolError::Msg(
            "--threads and --count must be at least 1".into(),
        ));
    }
    let most = rdmapool::mr::Registrar::MAX_WORKERS;
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
    let (mut latency, mut blocking) = (histogram(), histogram());
    let mut failures = 0u64;
    let mut first_error = None;
    let bar = indicatif::ProgressBar::new(args.count);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} rounds {msg}")
            .expect("valid template"),
    );
    let started = Instant::now();
    for _ in 0..args.count {
        let mut pending = Vec::with_capacity(args.threads);
        for _ in 0..args.threads {
            let t = Instant::now();
            let h = reg.submit(per_region, AccessFlags::all_remote());
            blocking.saturating_record(t.elapsed().as_nanos().max(1) as u64);
            pending.push((t, h));
        }
        let mut mrs = Vec::with_capacity(args.threads);
        for (t, h) in pending {
            match h.wait() {
                Ok(mr) => {
                    latency.saturating_record(t.elapsed().as_nanos().max(1) as u64);
                    mrs.push(mr);
                }
                Err(e) => {
                    failures += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
        drop(mrs); // deregister the round
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let stats = reg.stats();
    let registered = (args.count * args.threads as u64 - failures) * per_region as u64;
    let q = |h: &hdrhistogram::Histogram<u64>, p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    if args.json {
        let v = json!({
            "provider": args.provider, "size": size, "count": args.count, "threads": args.threads,
            "region_bytes": per_region, "registered_bytes": registered, "seconds": wall,
            "gbps": registered as f64 / wall / 1e9,
            "latency_us": { "p50": q(&latency, 0.5), "p90": q(&latency, 0.9), "p99": q(&latency, 0.99), "max": latency.max() as f64 / 1000.0 },
            "submit_blocking_us": { "p50": q(&blocking, 0.5), "p99": q(&blocking, 0.99), "max": blocking.max() as f64 / 1000.0 },
            "failures": failures, "retries": stats.retries, "first_error": first_error,
        });
        println!("{v}");
    } else {
        println!(
            "{} rounds x {} threads x {} = {} registered and deregistered in {:.2} s: {:.2} GB/s",
            args.count,
            args.threads,
            show(per_region),
            show(registered as usize),
            wall,
            registered as f64 / wall / 1e9
        );
        println!(
            "registration latency (submit to ready): p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us",
            q(&latency, 0.5),
            q(&latency, 0.9),
            q(&latency, 0.99),
            latency.max() as f64 / 1000.0
        );
        println!(
            "caller blocked in submit: p50 {:.2} us, p99 {:.2} us, max {:.2} us",
            q(&blocking, 0.5),
            q(&blocking, 0.99),
            blocking.max() as f64 / 1000.0
        );
        println!(
            "failures {failures}, retries {}{}",
            stats.retries,
            first_error
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
    }
    if failures > 0 {
        return Err(ToolError::Msg(format!("{failures} registrations failed")));
    }
    Ok(())
}
