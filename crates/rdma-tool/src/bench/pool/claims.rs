//! What an isolated server's wipe costs (issue #41): an allocation that claims a chunk
//! handed out before, which the server zeroes before binding the new window, next to one that
//! claims a chunk never used since the server started, in the same run and on the same
//! server, for 256 KiB and 2 MiB chunks. Each object takes a chunk of its own, so every
//! allocation is a claim (one control round trip and the chunk header's WRITE) and every
//! free a release.

use super::{path, server_config, Row, Stats, Steps};
use crate::device_args::DeviceArgs;
use crate::units::show;
use crate::Result;
use rdmapool::fabric::Transport;
use rdmapool::remote::{ClientConfig, MemoryServer, PoolClient, ServerConfig, StaticMembership};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

/// The chunk sizes measured.
pub(super) const CHUNK_SIZES: [u64; 2] = [256 << 10, 2 << 20];
/// Rounds of allocating every chunk and freeing them all: the first claims fresh chunks,
/// the others wiped ones.
const ROUNDS: usize = 3;

/// One row per chunk size: the latency of an allocation that claims a wiped chunk against
/// one that claims a fresh chunk.
pub(super) fn claim_rows(
    device: &DeviceArgs,
    transport: Transport,
    ip: IpAddr,
    client_id: u64,
    bar: &mut Steps,
) -> Result<Vec<Row>> {
    let ctx = device.open(transport)?;
    let pd = ctx.alloc_pd()?;
    let mut rows = Vec::new();
    for chunk in CHUNK_SIZES {
        bar.set_message(format!("isolated claims, {} chunks", show(chunk as usize)));
        let server = MemoryServer::start(
            &ctx,
            ServerConfig {
                chunk_size: chunk,
                isolation: rdmapool::remote::Isolation::Isolated,
                ..server_config(SocketAddr::new(ip, 0), 64 << 20)
            },
        )?;
        let members = StaticMembership::new(vec![server.addr()]);
        let client = PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(client_id))?;
        // Over half a chunk: one object per chunk.
        let object = chunk * 3 / 4;
        let chunks = server.descriptor().layout.chunk_count - 1;
        let (mut fresh, mut wiped) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let mut held = Vec::with_capacity(chunks as usize);
            for _ in 0..chunks {
                let t = Instant::now();
                held.push(client.block_on(client.alloc(object, None))?);
                let ns = t.elapsed().as_nanos() as u64;
                if round == 0 { &mut fresh } else { &mut wiped }.push(ns);
            }
            for p in held {
                client.block_on(client.free(p))?;
            }
        }
        let (f, w) = (Stats::from_samples(&fresh), Stats::from_samples(&wiped));
        rows.push(Row {
            provider: device.kind().name().into(),
            transport: path(device.kind(), transport),
            op: "isolated alloc claiming a wiped chunk".into(),
            metric: "latency".into(),
            size: chunk as usize,
            iters: wiped.len() as u64,
            median_ns: w.median_ns,
            p99_ns: w.p99_ns,
            gbps: 0.0,
            mops: 0.0,
            reference: format!("claiming a fresh chunk ({} claims)", fresh.len()),
            reference_value: f.median_ns,
            ratio: w.median_ns / f.median_ns,
        });
        bar.inc();
    }
    Ok(rows)
}
