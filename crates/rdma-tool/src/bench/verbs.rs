//! `bench data --provider verbs`: the same measurements on rdma-core, against a peer process
//! on the same device, next to perftest in the same run.

use super::harness::{connect_bench, count_for, iters_for, Op};
use super::perftest::{self, Target};
use super::report::Row;
use crate::device_args::DeviceArgs;
use crate::peer::PeerProcess;
use crate::progress::Steps;
use crate::Result;
use rdmapool::fabric::Transport;

/// Measures `ops` at `sizes` on the verbs device `dev` selects; adds perftest rows when it
/// can.
pub fn run(
    dev: &DeviceArgs,
    ops: &[Op],
    sizes: &[usize],
    iters: u64,
    perftest_ip: Option<String>,
    json: bool,
) -> Result<Vec<Row>> {
    let max_size = sizes.iter().copied().max().unwrap_or(8).max(4096);
    let peer = PeerProcess::spawn_on(dev, max_size, "auto", false)?;
    let (ctx, _pd, b) = connect_bench(dev, &peer, Transport::Auto, max_size)?;
    let device = ctx.device().name.clone();
    let mut rows = Vec::new();
    let total: usize = ops
        .iter()
        .map(|o| if o.is_atomic() { 1 } else { sizes.len() })
        .sum();
    let mut bar = Steps::new("bench data", total as u64, json);
    for &op in ops {
        let op_sizes: Vec<usize> = if op.is_atomic() {
            vec![8]
        } else {
            sizes.to_vec()
        };
        for size in op_sizes {
            bar.set_message(format!(
                "{device} {} {}",
                op.name(),
                crate::units::show(size)
            ));
            let n = iters_for(size, iters);
            let lat = b.latency(op, size, n)?;
            let gbps = b.bandwidth(op, size, count_for(size).min(20_000))?;
            rows.push(Row {
                provider: "verbs".into(),
                transport: device.clone(),
                op: op.name().into(),
                metric: "latency".into(),
                size,
                iters: n,
                median_ns: lat.median_ns,
                p99_ns: lat.p99_ns,
                gbps,
                mops: 0.0,
                reference: "-".into(),
                reference_value: 0.0,
                ratio: 0.0,
            });
            bar.inc();
        }
    }
    bar.finish();
    let Some(ip) = perftest_ip else {
        crate::errln!(
            "perftest comparison skipped: give --perftest-ip (the address of the device's netdev)"
        );
        return Ok(rows);
    };
    if !perftest::available() {
        crate::errln!(
            "perftest comparison skipped: perftest is not installed (apt-get install perftest)"
        );
        return Ok(rows);
    }
    let target = Target {
        device,
        gid_index: std::env::var("RDMAPOOL_GID_INDEX").ok(),
        ip,
    };
    for r in &mut rows {
        // (perftest test, its value column, scale to ns or GB/s; ib_write_lat reports half a
        // round trip, so ×2)
        let (test, col, scale, metric) = match (r.op.as_str(), r.size) {
            ("write", 8) => ("ib_write_lat", 4, 2000.0, "latency"),
            ("read", 8) => ("ib_read_lat", 4, 1000.0, "latency"),
            ("write", s) if s >= 65536 => ("ib_write_bw", 3, 1.048576e-3, "bandwidth"),
            _ => continue,
        };
        let n = if metric == "latency" {
            r.iters.max(1000)
        } else {
            5000
        };
        let Some(v) = perftest::run(&target, test, r.size, n).and_then(|v| v.get(col).copied())
        else {
            crate::errln!("{test} gave no result");
            continue;
        };
        let value = v * scale; // ns for latency (t_typical), GB/s for bandwidth (BW average)
        r.metric = metric.into();
        r.reference = format!(
            "perftest {test}{}",
            if test == "ib_write_lat" { " x2" } else { "" }
        );
        r.reference_value = value;
        r.ratio = if metric == "latency" {
            r.median_ns / value
        } else {
            r.gbps / value
        };
    }
    Ok(rows)
}
