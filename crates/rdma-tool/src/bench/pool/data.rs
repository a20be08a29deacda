//! READ and WRITE through the pool next to a raw QP on the same memory.

use super::windowed::windowed;
use super::*;
use crate::bench::harness::{count_for, iters_for, Bench, Op};
use crate::bench::report::Row;
use crate::bench::Stats;
use crate::device_args::DeviceArgs;
use crate::units::show;
use crate::Result;
use rdmapool::conn::{self, Manager};
use rdmapool::remote::{
    ClientConfig, ClientHello, MemoryServer, PoolClient, PoolDescriptor, RemotePtr,
    StaticMembership,
};
use std::sync::Arc;
use std::time::Instant;

pub(super) fn best_of(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut best = 0f64;
    for _ in 0..BEST_OF {
        best = best.max(f()?);
    }
    Ok(best)
}

/// READ/WRITE through the pool next to a raw QP on the same memory.
#[allow(clippy::too_many_arguments)]
pub(super) fn data_rows(
    device: &DeviceArgs,
    transport: Transport,
    server: &MemoryServer,
    id: u64,
    lat_sizes: &[usize],
    bw_sizes: &[usize],
    max: usize,
    base_iters: u64,
    bar: &mut crate::progress::Steps,
) -> Result<Vec<Row>> {
    let members = StaticMembership::new(vec![server.addr()]);
    // The pool client and the raw QP each get a context of their own (the server's is ctx),
    // as a client on another node would.
    let pool_ctx = device.open(transport)?;
    let pd = pool_ctx.alloc_pd()?;
    let client = PoolClient::connect(&pool_ctx, &pd, &members, ClientConfig::new(id))?;
    let ptr: RemotePtr = client.block_on(client.alloc(max as u64, None))?;
    let local = Arc::new(pd.alloc_mr(max, AccessFlags::LOCAL_WRITE)?);
    local.write_at(0, &vec![0x5a; max])?;
    // The raw QP: its own context, connected to the same server (a client hello gets it the
    // descriptor; it takes no lease), aimed at the same allocation.
    let raw_ctx = device.open(transport)?;
    let raw_pd = raw_ctx.alloc_pd()?;
    let raw_cq = raw_ctx.create_cq(4096)?;
    let hello = ClientHello::new(id + 1)?.encode();
    let c = conn::connect(
        Manager::from(&raw_pd),
        server.addr(),
        &conn::ConnectSpec::new(&raw_pd, &raw_cq, &QpConfig::default())
            .private_data(&hello)
            .timeout(WAIT),
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
            provider: device.kind().name().into(),
            transport: path(device.kind(), transport),
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
            bar.inc();
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
            bar.inc();
        }
    }
    bar.set_message("pool batches".into());
    rows.extend(super::batch::batch_rows(
        device,
        transport,
        &client,
        ptr,
        &local,
        &raw,
        base_iters.max(super::batch::BATCH as u64) * 4,
    )?);
    bar.inc();
    client.block_on(client.free(ptr))?;
    Ok(rows)
}
