//! `rdma-tool monitor`: attaches to a process's metrics endpoint (or runs a probe workload
//! in this process) and shows one metric live: refreshed in place on a terminal, one line
//! per sample otherwise, one JSON object per sample with `--json`.

mod plot;
mod probe;
mod show;
mod source;

use crate::{Result, ToolError};
use source::Source;
use std::time::{Duration, Instant};

/// What to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Metric {
    /// Registration latency percentiles (µs) and count.
    RegLatency,
    /// Deregistration latency percentiles (µs) and count.
    DeregLatency,
    /// Work-request latency (post to polled completion) per opcode, percentiles (µs) and
    /// count, from the target's sampled requests (one in `op_sample_every`).
    OpLatency,
    /// Registration cache hits / (hits + misses), overall and over the last interval.
    CacheHitRate,
    /// Buffer-pool buffers in use, allocations, chunks, empty pools.
    PoolUsage,
    /// Registration errors, retries, timeouts, cancellations, connection errors, error
    /// completions by status.
    Errors,
}

/// The metric's name as on the command line.
pub fn metric_name(m: Metric) -> &'static str {
    match m {
        Metric::RegLatency => "reg_latency",
        Metric::DeregLatency => "dereg_latency",
        Metric::OpLatency => "op_latency",
        Metric::CacheHitRate => "cache_hit_rate",
        Metric::PoolUsage => "pool_usage",
        Metric::Errors => "errors",
    }
}

/// Arguments of `monitor`.
#[derive(clap::Args)]
pub struct Args {
    /// The metric to show.
    #[arg(long, value_enum, default_value_t = Metric::RegLatency)]
    metric: Metric,
    /// Percentiles of latency metrics, comma-separated (50,99,99.9). Over a Unix socket (and
    /// the probe): 50, 75, 90, 95, 99, 99.9, 99.99 or 100 (the maximum); over HTTP any
    /// value in (0, 100], estimated from the histogram buckets.
    #[arg(long, value_delimiter = ',', default_value = "50,99", value_parser = crate::units::percentile_arg)]
    percentile: Vec<f64>,
    /// The endpoint: a Unix socket path, an abstract socket `@name`, or
    /// `http://127.0.0.1:PORT[/metrics]`. Without it, a probe workload runs in this process
    /// (on --provider/--device, soft by default) and its own metrics are shown.
    #[arg(long)]
    target: Option<String>,
    /// Time between samples (`1s`, `500ms`, `2m`).
    #[arg(long, default_value = "1s", value_parser = crate::units::duration_arg)]
    interval: Duration,
    /// Stop after this many samples (default: until interrupted).
    #[arg(long, value_parser = crate::units::count_arg(u64::MAX))]
    count: Option<u64>,
    /// One JSON object per sample, one per line.
    #[arg(long)]
    json: bool,
    /// The device the probe workload (no --target) runs on.
    #[command(flatten)]
    device: crate::device_args::DeviceArgs,
    /// When the monitor ends (after --count samples, or on Ctrl-C/SIGTERM), draw the
    /// metric over the run to this file (`.svg` or `.png`): each requested percentile, the
    /// hit rates, or the counters, against time.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

fn check_percentiles(ps: &[f64], src: &Source) -> Result<()> {
    for &p in ps {
        if !(p > 0.0 && p <= 100.0) {
            return Err(ToolError::Msg(format!(
                "--percentile {p}: must be in (0, 100]"
            )));
        }
        let known = rdmapool::metrics::PERCENTILES
            .iter()
            .any(|&q| (q - p).abs() < 1e-9);
        if !src.any_percentile() && !known {
            return Err(ToolError::Msg(format!(
                "--percentile {p}: a JSON snapshot carries {:?} only (HTTP targets estimate any \
                 percentile from buckets)",
                rdmapool::metrics::PERCENTILES
            )));
        }
    }
    Ok(())
}

/// Runs the monitor.
pub fn run(args: Args) -> Result<()> {
    if args.count == Some(0) {
        return Err(ToolError::Msg("--count must be at least 1".into()));
    }
    if args.target.is_some() && (args.device.provider.is_some() || args.device.device.is_some()) {
        return Err(ToolError::Msg(
            "--provider/--device choose the probe's device; a --target process uses its own \
             (drop them, or drop --target to run the probe)"
                .into(),
        ));
    }
    if let Some(p) = &args.plot {
        crate::plot::check_path(p)?;
    }
    let mut src = Source::parse(args.target.as_deref())?;
    check_percentiles(&args.percentile, &src)?;
    // Ctrl-C and SIGTERM end the loop like --count does: the line is ended, the plot drawn.
    crate::signals::install()?;
    let mut recorder = args
        .plot
        .clone()
        .map(|p| plot::Recorder::new(p, args.metric));
    let _probe = match &mut src {
        Source::Local(metrics) => {
            let p = probe::Probe::start(&args.device)?;
            *metrics = Some(p.metrics());
            Some(p)
        }
        _ => None,
    };
    let mut out = show::Output::new(args.metric, args.json, args.target.as_deref());
    let started = Instant::now();
    let mut prev = None;
    let mut n = 0u64;
    let result = loop {
        let s = match src.read(&args.percentile) {
            Ok(s) => s,
            Err(e) => break Err(e),
        };
        n += 1;
        let at = started.elapsed();
        match out.sample(n, at, &s, prev.as_ref()) {
            Ok(v) => {
                if let Some(r) = &mut recorder {
                    r.sample(at.as_secs_f64(), &v);
                }
            }
            Err(e) => break Err(e),
        }
        prev = Some(s);
        if args.count.is_some_and(|c| n >= c) || pause(args.interval) {
            break Ok(());
        }
    };
    // The in-place line is ended and the plot written whatever stopped the loop.
    out.finish()?;
    if let Some(r) = recorder {
        if n > 0 {
            r.write(args.target.as_deref().unwrap_or("the probe workload"))?;
        }
    }
    result
}

/// Sleeps `d` in short steps; true when SIGINT/SIGTERM arrived meanwhile.
fn pause(d: Duration) -> bool {
    let until = Instant::now() + d;
    loop {
        if crate::signals::stopped() {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_targets_off_this_host_are_refused_before_anything_is_sent() {
        // Parsing resolves the address and connects to nothing.
        for t in [
            "http://10.1.1.1:80",
            "http://192.0.2.7:9464/metrics",
            "http://[2001:db8::1]:80",
        ] {
            let e = source::Source::parse(Some(t)).err().expect(t).to_string();
            assert!(e.contains("loopback only") && e.contains(t), "{t}: {e}");
        }
        for t in [
            "http://127.0.0.1:9464",
            "http://127.0.0.2:1/metrics",
            "http://[::1]:80",
            "http://localhost:9464",
        ] {
            assert!(source::Source::parse(Some(t)).is_ok(), "{t}");
        }
    }

    #[test]
    fn op_latency_reads_the_same_from_json_and_prometheus() {
        let ctx =
            rdmapool::fabric::Context::open(rdmapool::fabric::SoftConfig::from_env().unwrap())
                .unwrap();
        let ops = probe::Ops::new(&ctx, &ctx.alloc_pd().unwrap()).unwrap();
        ctx.metrics().sample_op_latency(1);
        // Each round is one WRITE, READ, CAS and FAA.
        for i in 0..10 {
            ops.round(i).unwrap();
        }
        let snap = ctx.metrics().snapshot();
        let ps = [50.0, 100.0];
        let j = source::from_json(&snap.to_json(), &ps).unwrap();
        let p = source::from_prometheus(&snap.to_prometheus(), &ps);
        let (jf, pf) = (&j.ops["fetch_add"], &p.ops["fetch_add"]);
        assert_eq!(jf.count, 10);
        assert_eq!(jf.count, pf.count);
        assert_eq!(j.c["op_sample_every"], p.c["op_sample_every"]);
        // Bucket interpolation is coarse: only ask that both put the median in (0, max].
        assert!(pf.percentiles_us[0].1 > 0.0 && jf.percentiles_us[0].1 > 0.0);
    }

    #[test]
    fn qp_errors_read_the_same_from_json_and_prometheus() {
        let ctx =
            rdmapool::fabric::Context::open(rdmapool::fabric::SoftConfig::from_env().unwrap())
                .unwrap();
        ctx.metrics().track_objects(true);
        let ops = probe::Ops::new(&ctx, &ctx.alloc_pd().unwrap()).unwrap();
        let done = ops.wrong_rkey_write();
        assert_eq!(done.status, rdmapool::fabric::WcStatus::RemAccessErr);

        let snap = ctx.metrics().snapshot();
        let j = source::from_json(&snap.to_json(), &[]).unwrap();
        let p = source::from_prometheus(&snap.to_prometheus(), &[]);
        let (qp, peer) = ops.qpns();
        let name = |n: u32| format!("{}/{n}", ctx.device().name);
        assert_eq!(
            j.qp_errors[&name(qp)]["rem_access_err"],
            1,
            "{:?}",
            j.qp_errors
        );
        assert_eq!(j.qp_errors, p.qp_errors);
        assert!(!j.qp_errors.contains_key(&name(peer)));
    }

    #[test]
    fn percentile_from_buckets() {
        let b = [(1e-3, 50), (2e-3, 100), (f64::INFINITY, 100)];
        assert!((source::bucket_percentile(&b, 100, 50.0) - 1000.0).abs() < 1e-6);
        assert!((source::bucket_percentile(&b, 100, 75.0) - 1500.0).abs() < 1e-6);
        assert_eq!(source::bucket_percentile(&b, 0, 99.0), 0.0);
    }
}
