//! `rdma-tool bench ...`.

mod copy;
mod data;
mod engine;
mod harness;
mod loops;
mod perftest;
mod plot;
mod pool;
mod reference;
mod reg;
mod report;
mod store;
mod ucx;
mod verbs;
mod ycsb;

use crate::Result;

/// Benchmark kinds.
#[derive(clap::Subcommand)]
pub enum Command {
    /// One-sided WRITE/READ/CAS/FAA latency and bandwidth, next to raw references measured
    /// in the same run (memcpy, TCP and Unix-socket ping-pong and stream, UCX perftest).
    Data(data::Args),
    /// Registration: caller-blocking time of async vs sync, cache hit vs miss, pooled vs
    /// per-transfer registration, page size and alignment, parallel chunked vs one call.
    Reg(reg::Args),
    /// The cross-node memory pool: alloc+free pairs/s with 1, 2, 4, 8 clients against a
    /// two-sided SEND/RECV allocation server, and READ/WRITE latency and bandwidth through
    /// the pool against a raw QP to the same memory, all in one run.
    Pool(pool::Args),
    /// The replicated object store (put and get, one-sided, two replicas) against a
    /// redis-server started here, at 1, 2 and 4 clients and 64 B, 4 KiB and 1 MiB values,
    /// with redis-benchmark's own figures.
    Store(store::Args),
    /// The intra-host path's copy at every relative alignment 0..63 against an aligned
    /// memcpy of the same size, with the C library's copy at the same misalignments beside.
    Copy(copy::Args),
    /// YCSB workloads A, B, C, D and F (Zipfian keys, 1 KiB records) against the replicated
    /// store, and with the same key streams against a redis-server and a memcached
    /// started here, at 1, 2 and 4 clients; or a cache trace (--trace) replayed on all
    /// three. Workload E (range scans) is left out: no ordered index.
    Ycsb(ycsb::Args),
}

/// Runs a benchmark.
pub fn run(c: Command) -> Result<()> {
    match c {
        Command::Data(a) => data::run(a),
        Command::Reg(a) => reg::run(a),
        Command::Pool(a) => pool::run(a),
        Command::Store(a) => store::run(a),
        Command::Copy(a) => copy::run(a),
        Command::Ycsb(a) => ycsb::run(a),
    }
}

/// Latency statistics of one measurement.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    /// Median, ns.
    pub median_ns: f64,
    /// 99th percentile, ns.
    pub p99_ns: f64,
}

impl Stats {
    /// Median and p99 of `samples` (ns) through an HDR histogram (3 significant digits).
    pub fn from_samples(samples: &[u64]) -> Self {
        // Bounds up to one hour: saturating_record clamps instead of resizing.
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("valid bounds");
        for &s in samples {
            h.saturating_record(s.max(1));
        }
        Stats {
            median_ns: h.value_at_quantile(0.5) as f64,
            p99_ns: h.value_at_quantile(0.99) as f64,
        }
    }
}
