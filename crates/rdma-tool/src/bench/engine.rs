//! `bench data --async`, `--batch N`, `--cqs N`: the progress engine and the async API
//! against the raw fabric-level loop on the same provider and peer, in the same run.

use super::harness::{Bench, Op};
use super::loops::{
    async_batches, async_window, rate, raw_batches, raw_batches_of, raw_window, raw_window_of,
};
use super::report::Row;
use super::Stats;
use crate::peer::PeerProcess;
use crate::{Result, ToolError};
use rdmapool::cq::{AsyncQp, Engine, EngineConfig, Progress};
use rdmapool::fabric::*;
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// What the engine benchmarks run against.
pub(super) struct Target<'a> {
    pub(super) peer: &'a PeerProcess,
    pub(super) ctx: &'a Context,
    pub(super) pd: &'a Pd,
    pub(super) cfg: QpConfig,
    /// "soft" or "verbs".
    pub(super) provider: &'static str,
    /// The path or device, for the rows.
    pub(super) path: String,
}

/// A fresh engine with its own CQs and `qps` QPs connected to the peer, spread over them.
struct Rig {
    engine: Engine,
    qps: Vec<(AsyncQp, usize)>,
    remote: RemoteAddr,
}

impl Target<'_> {
    fn rig(&self, cqs: usize, qps: usize, progress: Progress) -> Result<Rig> {
        let cq_list = (0..cqs)
            .map(|_| self.ctx.create_cq(4096))
            .collect::<std::result::Result<Vec<_>, rdmapool::CoreError>>()?;
        let engine = Engine::new(
            cq_list.clone(),
            EngineConfig {
                progress,
                ..EngineConfig::default()
            },
        )?;
        let mut out = Vec::new();
        let mut region = None;
        for k in 0..qps {
            let (qp, r) = self.peer.connect(self.pd, &cq_list[k % cqs], &self.cfg)?;
            region = Some(r);
            out.push((engine.wrap(qp), k % cqs));
        }
        let region = region.ok_or_else(|| ToolError::Msg("a rig needs a QP".into()))?;
        Ok(Rig {
            engine,
            qps: out,
            remote: region.at(0)?,
        })
    }

    fn row(&self, op: String, metric: &str, iters: u64) -> Row {
        Row {
            provider: self.provider.into(),
            transport: self.path.clone(),
            op,
            metric: metric.into(),
            size: 8,
            iters,
            median_ns: 0.0,
            p99_ns: 0.0,
            gbps: 0.0,
            mops: 0.0,
            reference: String::new(),
            reference_value: 0.0,
            ratio: 0.0,
        }
    }

    /// 8-byte WRITE latency through the async API in each progress mode, next to the raw
    /// post-and-poll loop on the same provider and peer. The two alternate in blocks
    /// (ten rounds), so drift on a shared machine hits both alike.
    pub(super) fn async_latency(&self, raw: &Bench, iters: u64) -> Result<Vec<Row>> {
        const ROUNDS: u64 = 10;
        let local = Arc::new(self.pd.alloc_mr(4096, AccessFlags::all_remote())?);
        let mut rows = Vec::new();
        let block = (iters / ROUNDS).max(10);
        let warm = (block / 10).max(10);
        for (mode, name, multi_thread) in [
            (Progress::Caller, "caller-driven", false),
            (
                Progress::BusyPoll,
                "busy-poll thread, current_thread",
                false,
            ),
            (Progress::BusyPoll, "busy-poll thread, multi_thread", true),
            (Progress::Event, "event (AsyncFd), current_thread", false),
            (Progress::Event, "event (AsyncFd), multi_thread", true),
        ] {
            // Event mode needs the runtime when the engine is made; the others ignore it.
            // On a multi-thread runtime (2 workers) the engine's tasks run on the workers and
            // the measuring loop waits in `block_on`, as a `#[tokio::main]` program would.
            let rt = if multi_thread {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            }
            .map_err(|e| ToolError::Io("tokio runtime".into(), e))?;
            let _in_rt = rt.enter();
            let rig = self.rig(1, 1, mode)?;
            let q = &rig.qps[0].0;
            let op = || q.write(local.clone(), 0, 8, rig.remote);
            let (mut ours, mut reference) = (Vec::new(), Vec::new());
            if mode == Progress::Caller {
                for _ in 0..ROUNDS {
                    reference.extend(raw.latency_samples(Op::Write, 8, block)?);
                    for i in 0..warm + block {
                        let t = Instant::now();
                        rig.engine.run_until(op()).0?;
                        if i >= warm {
                            ours.push(t.elapsed().as_nanos() as u64);
                        }
                    }
                }
            } else {
                rt.block_on(async {
                    for _ in 0..ROUNDS {
                        reference.extend(raw.latency_samples(Op::Write, 8, block)?);
                        for i in 0..warm + block {
                            let t = Instant::now();
                            op().await.0?;
                            if i >= warm {
                                ours.push(t.elapsed().as_nanos() as u64);
                            }
                        }
                    }
                    Ok::<_, ToolError>(())
                })?;
            }
            let (lat, raw_lat) = (Stats::from_samples(&ours), Stats::from_samples(&reference));
            rows.push(Row {
                median_ns: lat.median_ns,
                p99_ns: lat.p99_ns,
                reference: "raw post + busy-poll".into(),
                reference_value: raw_lat.median_ns,
                ratio: lat.median_ns / raw_lat.median_ns,
                ..self.row(format!("write async {name}"), "latency", block * ROUNDS)
            });
        }
        Ok(rows)
    }

    /// Message rate of 8-byte WRITEs posted as lists of `n` (one doorbell, last signalled)
    /// against one work request per doorbell with the same number in flight: raw and async.
    pub(super) fn batching(&self, raw: &Bench, n: usize, count: u64) -> Result<Vec<Row>> {
        let count = count / n as u64 * n as u64;
        let depth = 2 * n;
        let single = rate(count, || raw_window(raw, depth, count))?;
        let batched = rate(count, || raw_batches(raw, n, count))?;
        let rig = self.rig(1, 1, Progress::Caller)?;
        let local = Arc::new(self.pd.alloc_mr(4096, AccessFlags::all_remote())?);
        let q = &rig.qps[0].0;
        let a_single = rate(count, || {
            async_window(&rig.engine, q, &local, rig.remote, depth, count, 0)
        })?;
        let a_batched = rate(count, || {
            async_batches(&rig.engine, q, &local, rig.remote, n, count)
        })?;
        let r = |op: String, mops: f64, reference: String, reference_value: f64| Row {
            mops,
            reference,
            reference_value,
            ratio: mops / reference_value,
            ..self.row(op, "rate", count)
        };
        let mut rows = vec![
            r(
                format!("write raw list {n}"),
                batched,
                format!("raw 1 WR/doorbell, {depth} in flight"),
                single,
            ),
            r(
                format!("write async batch {n}"),
                a_batched,
                format!("async 1 op/future, {depth} in flight"),
                a_single,
            ),
        ];
        // READs and FAAs as lists too (raw only): what a pipelined small-operation rate can
        // reach on this path, one doorbell and one completion per list.
        for op in [Op::Read, Op::Faa] {
            let single = rate(count, || raw_window_of(raw, op, depth, count))?;
            let batched = rate(count, || raw_batches_of(raw, op, n, count))?;
            rows.push(r(
                format!("{} raw list {n}", op.name()),
                batched,
                format!("raw 1 WR/doorbell, {depth} in flight"),
                single,
            ));
        }
        Ok(rows)
    }

    /// 8-byte WRITE message rate of `threads` threads, each with its own QP and a window of
    /// 16 futures, over `cqs` CQs; each thread drives the CQ its QP is bound to.
    pub(super) fn cq_scaling(&self, cqs: usize, threads: usize, count: u64) -> Result<f64> {
        let rig = self.rig(cqs, threads, Progress::Caller)?;
        let local = Arc::new(
            self.pd
                .alloc_mr(64 * threads.max(1), AccessFlags::all_remote())?,
        );
        let start = Barrier::new(threads + 1);
        let t = std::thread::scope(|s| {
            let workers: Vec<_> = rig
                .qps
                .iter()
                .enumerate()
                .map(|(k, (q, cq))| {
                    let (engine, local, start) = (&rig.engine, &local, &start);
                    let remote = RemoteAddr {
                        addr: rig.remote.addr + 64 * k as u64,
                        ..rig.remote
                    };
                    s.spawn(move || {
                        start.wait();
                        async_window(engine, q, local, remote, 16, count, *cq).map(|_| ())
                    })
                })
                .collect();
            start.wait();
            let t = Instant::now();
            for w in workers {
                w.join()
                    .map_err(|_| ToolError::Msg("a benchmark thread panicked".into()))??;
            }
            Ok::<_, ToolError>(t.elapsed())
        })?;
        Ok((threads as u64 * count) as f64 / t.as_nanos() as f64 * 1e3)
    }

    /// Rows for 1, 2, 4... CQs, each against the first count in `cqs`.
    pub(super) fn cq_scaling_rows(
        &self,
        cqs: &[usize],
        threads: usize,
        count: u64,
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        let mut base = None;
        for &n in cqs {
            let mops = self.cq_scaling(n, threads, count)?;
            let (first_n, first) = *base.get_or_insert((n, mops));
            rows.push(Row {
                mops,
                reference: format!("{threads} threads on {first_n} CQ"),
                reference_value: first,
                ratio: mops / first,
                ..self.row(
                    format!("write {threads}thr {n}cq"),
                    "rate",
                    count * threads as u64,
                )
            });
        }
        Ok(rows)
    }
}

/// Which engine benchmarks to run (from `bench data`'s flags).
pub(super) struct Selection {
    /// Async latency in the three progress modes.
    pub(super) latency: bool,
    /// List lengths for the batching comparison.
    pub(super) batch: Vec<usize>,
    /// CQ counts for the scaling comparison.
    pub(super) cqs: Vec<usize>,
    /// Threads for the scaling comparison.
    pub(super) threads: usize,
    /// Latency iterations.
    pub(super) iters: u64,
    /// Operations per rate measurement (per thread for scaling).
    pub(super) count: u64,
}

impl Selection {
    /// Whether any engine benchmark was asked for.
    pub(super) fn any(&self) -> bool {
        self.latency || !self.batch.is_empty() || !self.cqs.is_empty()
    }

    /// How many measurements [`Selection::run`] makes on one path (its progress steps).
    pub(super) fn steps(&self) -> usize {
        usize::from(self.latency) + self.batch.len() + usize::from(!self.cqs.is_empty())
    }

    /// Runs what was asked for against `target`, with `raw` as the fabric-level reference;
    /// each measurement is one step of `bar`.
    pub(super) fn run(
        &self,
        target: &Target<'_>,
        raw: &Bench,
        bar: &mut crate::progress::Steps,
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        if (!self.batch.is_empty() || !self.cqs.is_empty()) && self.count < 1000 {
            return Err(ToolError::Msg(format!(
                "--count {}: message rates need at least 1000 operations",
                self.count
            )));
        }
        if self.latency && self.iters < 100 {
            return Err(ToolError::Msg(format!(
                "--iters {}: latency needs at least 100 samples",
                self.iters
            )));
        }
        if self.latency {
            bar.set_message(format!("{} async latency", target.path));
            rows.extend(target.async_latency(raw, self.iters)?);
            bar.inc();
        }
        for &n in &self.batch {
            if n == 0 || n as u32 * 2 > target.cfg.max_send_wr {
                return Err(ToolError::Msg(format!(
                    "--batch {n}: lists must be 1..={} long (two in flight fill the send queue)",
                    target.cfg.max_send_wr / 2
                )));
            }
            bar.set_message(format!("{} batches of {n}", target.path));
            rows.extend(target.batching(raw, n, self.count)?);
            bar.inc();
        }
        if !self.cqs.is_empty() {
            if self.cqs.contains(&0) || self.threads == 0 {
                return Err(ToolError::Msg(
                    "--cqs and --threads take positive numbers".into(),
                ));
            }
            bar.set_message(format!("{} CQ scaling", target.path));
            rows.extend(target.cq_scaling_rows(&self.cqs, self.threads, self.count / 4)?);
            bar.inc();
        }
        Ok(rows)
    }
}
