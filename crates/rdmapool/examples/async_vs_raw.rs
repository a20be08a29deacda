//! 8-byte WRITEs on the soft provider's intra-host path, one at a time: through the raw
//! fabric loop (`post_send` + `Cq::poll`) or through the async engine (`Engine::run_until`);
//! or `list`: raw lists of 32, only the last signalled; or `event` (`busy`): the async engine
//! driven by its completion channel (a busy-polling thread) on a current-thread tokio runtime.
//! Meant for instruction counts, which are repeatable on a noisy machine
//! (`OP_SAMPLE=64` turns on the metrics' op latency sampling, 1 request in 64;
//! `PER_OBJECT=1` their completion counts per CQ and per QP):
//!
//! ```sh
//! cargo build --release -p rdmapool --example async_vs_raw
//! valgrind --tool=callgrind target/release/examples/async_vs_raw raw 20000
//! valgrind --tool=callgrind target/release/examples/async_vs_raw async 20000
//! ```

use rdmapool::cq::{Engine, EngineConfig, Progress};
use rdmapool::fabric::*;
use std::sync::Arc;

fn main() -> rdmapool::Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "async".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    // OP_SAMPLE=N: time one work request in N (the metrics' op latency), to count its cost.
    let op_sample: Option<u32> = std::env::var("OP_SAMPLE").ok().and_then(|v| v.parse().ok());
    // PER_OBJECT=1: count completions per CQ and per QP, to count its cost.
    let per_object = std::env::var("PER_OBJECT").is_ok_and(|v| v == "1");
    let local_path = || -> rdmapool::Result<Context> {
        let ctx = Context::open(SoftConfig::from_env()?.with_transport(Transport::Local))?;
        if let Some(every) = op_sample {
            ctx.metrics().sample_op_latency(every);
        }
        ctx.metrics().track_objects(per_object);
        Ok(ctx)
    };
    let (a, b) = (local_path()?, local_path()?);
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let cfg = QpConfig::default();
    let target = pb.alloc_mr(4096, AccessFlags::all_remote())?;
    let remote = target.remote_at(0)?;
    let local = Arc::new(pa.alloc_mr(4096, AccessFlags::all_remote())?);
    let cq_b = b.create_cq(4096)?;
    let peer = pb.create_qp(&cq_b, &cq_b, &cfg)?;
    let t = std::time::Instant::now();
    if mode == "list" {
        // Lists of 32 with only the last signalled: one doorbell and one completion each.
        let cq = a.create_cq(4096)?;
        let qp = pa.create_qp(&cq, &cq, &cfg)?;
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.endpoint())?;
        let sg = [local.sge(0, 8)?];
        let list: Vec<SendWr<'_>> = (0..32)
            .map(|i| SendWr {
                wr_id: i,
                op: WrOp::Write { remote, imm: None },
                sg_list: &sg,
                signaled: i == 31,
            })
            .collect();
        let mut buf = [Completion::EMPTY; 1];
        for _ in 0..n / 32 {
            qp.post_send(&list)?;
            while cq.poll(&mut buf)? == 0 {}
        }
    } else if mode == "raw" {
        let cq = a.create_cq(4096)?;
        let qp = pa.create_qp(&cq, &cq, &cfg)?;
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.endpoint())?;
        let sg = [local.sge(0, 8)?];
        let mut buf = [Completion::EMPTY; 1];
        for i in 0..n {
            qp.post_send(&[SendWr {
                wr_id: i,
                op: WrOp::Write { remote, imm: None },
                sg_list: &sg,
                signaled: true,
            }])?;
            while cq.poll(&mut buf)? == 0 {}
        }
    } else if mode == "event" || mode == "busy" {
        // Event-driven progress (or a busy-polling thread) on a current-thread runtime,
        // awaited in block_on.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let _in_rt = rt.enter();
        let engine = Engine::new(
            vec![a.create_cq(4096)?],
            EngineConfig {
                progress: if mode == "event" {
                    Progress::Event
                } else {
                    Progress::BusyPoll
                },
                ..EngineConfig::default()
            },
        )?;
        let qp = if std::env::var("WRAP").is_ok() {
            engine.wrap(pa.create_qp(&engine.cqs()[0], &engine.cqs()[0], &cfg)?)
        } else {
            engine.create_qp(&pa, &cfg)?
        };
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.qp().endpoint())?;
        rt.block_on(async {
            for _ in 0..n {
                qp.write(local.clone(), 0, 8, remote).await.0?;
            }
            Ok::<_, rdmapool::Error>(())
        })?;
        println!("wakeups: {}", engine.stats().wakeups);
    } else {
        let engine = Engine::new(
            vec![a.create_cq(4096)?],
            EngineConfig {
                progress: Progress::Caller,
                ..EngineConfig::default()
            },
        )?;
        let qp = engine.create_qp(&pa, &cfg)?;
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.qp().endpoint())?;
        for _ in 0..n {
            engine.run_until(qp.write(local.clone(), 0, 8, remote)).0?;
        }
    }
    println!("{mode}: {n} WRITEs, {:?} each", t.elapsed() / n as u32);
    Ok(())
}
