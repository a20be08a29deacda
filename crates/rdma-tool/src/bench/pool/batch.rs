//! Pool batches (`PoolClient::batch`): the message rate of small operations posted as one
//! list per batch, next to the same operations one future each through the pool, and next
//! to a raw QP posting lists of the same length to the same memory.

use super::windowed::windowed;
use super::*;
use crate::bench::harness::{Bench, Op};
use crate::bench::loops::{rate, raw_batches};
use crate::bench::report::Row;
use std::sync::Arc;

/// Operations per batch (and per raw list).
pub(super) const BATCH: usize = 32;

/// Rows: pool batches of WRITE and FAA against single pool operations with as many in
/// flight, and pool WRITE batches against raw lists.
#[allow(clippy::too_many_arguments)]
pub(super) fn batch_rows(
    device: &DeviceArgs,
    transport: Transport,
    client: &PoolClient,
    ptr: RemotePtr,
    local: &Arc<Mr>,
    raw: &Bench,
    count: u64,
) -> Result<Vec<Row>> {
    let n = BATCH;
    let count = (count / n as u64).max(1) * n as u64;
    let batches = count / n as u64;
    let one_batch = |op: Op| {
        let local = local.clone();
        async move {
            let mut batch = client.batch::<Arc<Mr>>();
            for i in 0..n {
                match op {
                    Op::Faa => batch.fetch_and_add(ptr, 0, 1),
                    _ => batch.write(ptr, 8 * (i as u64 % 8), local.clone(), 0, 8),
                };
            }
            for o in batch.run().await {
                o.result?;
            }
            Ok(())
        }
    };
    let single = |op: Op| {
        let local = local.clone();
        async move {
            match op {
                Op::Faa => client.fetch_and_add(ptr, 0, 1).await.map(|_| ()),
                _ => client.write(ptr, 0, local, 0, 8).await.0,
            }
        }
    };
    let row = |op: String, mops: f64, reference: String, reference_value: f64| Row {
        provider: device.kind().name().into(),
        transport: path(device.kind(), transport),
        op,
        metric: "rate".into(),
        size: 8,
        iters: count,
        median_ns: 0.0,
        p99_ns: 0.0,
        gbps: 0.0,
        mops,
        reference,
        reference_value,
        ratio: mops / reference_value,
    };
    let mut rows = Vec::new();
    for op in [Op::Write, Op::Faa] {
        // Two batches in flight against 2n single operations in flight.
        let ours = rate(count, || {
            Ok(client.block_on(windowed(batches, 2, || one_batch(op)))?)
        })?;
        let singles = rate(count, || {
            Ok(client.block_on(windowed(count, 2 * n, || single(op)))?)
        })?;
        rows.push(row(
            format!("pool batch {} {n}", op.name()),
            ours,
            format!("pool 1 op/future, {} in flight", 2 * n),
            singles,
        ));
        if op == Op::Write {
            let lists = rate(count, || raw_batches(raw, n, count))?;
            rows.push(row(
                format!("pool batch {} {n}", op.name()),
                ours,
                format!("raw qp lists of {n}, 2 in flight"),
                lists,
            ));
        }
    }
    Ok(rows)
}
