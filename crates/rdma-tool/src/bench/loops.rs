//! The measured loops of the engine benchmarks (`bench data --async --batch`, `bench pool`'s
//! batch rows): a window of single work requests or futures, lists or batches of `n`, raw
//! and through the async engine, and the best-of-three rate around them.

use super::harness::{Bench, Op};
use crate::Result;
use rdmapool::cq::{AsyncQp, Engine, OpFuture};
use rdmapool::fabric::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Instant;

/// Runs `f` (which performs `count` operations) three times; the best rate in Mop/s.
pub(super) fn rate(count: u64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        f()?;
        best = best.max(count as f64 / t.elapsed().as_nanos() as f64 * 1e3);
    }
    Ok(best)
}

/// Raw: one signalled 8-byte WRITE per post, `depth` in flight.
pub(super) fn raw_window(b: &Bench, depth: usize, count: u64) -> Result<()> {
    raw_window_of(b, Op::Write, depth, count)
}

/// Raw: one signalled 8-byte `op` per post, `depth` in flight.
pub(super) fn raw_window_of(b: &Bench, op: Op, depth: usize, count: u64) -> Result<()> {
    let (wr_op, sge) = b.wr(op, 8, 0)?;
    let sg = [sge];
    let mut buf = [Completion::EMPTY; 64];
    let (mut posted, mut done) = (0u64, 0u64);
    while done < count {
        while posted < count && posted - done < depth as u64 {
            b.qp.post_send(&[SendWr {
                wr_id: posted,
                op: wr_op,
                sg_list: &sg,
                signaled: true,
            }])?;
            posted += 1;
        }
        done += b.wait_one(&mut buf)? as u64;
    }
    Ok(())
}

/// Raw: lists of `n` 8-byte WRITEs in one post, only the last signalled, two lists in
/// flight.
pub(super) fn raw_batches(b: &Bench, n: usize, count: u64) -> Result<()> {
    raw_batches_of(b, Op::Write, n, count)
}

/// Raw: lists of `n` 8-byte `op`s in one post, only the last signalled, two lists in flight.
pub(super) fn raw_batches_of(b: &Bench, op: Op, n: usize, count: u64) -> Result<()> {
    let (wr_op, sge) = b.wr(op, 8, 0)?;
    let sg = [sge];
    let list: Vec<SendWr<'_>> = (0..n)
        .map(|i| SendWr {
            wr_id: i as u64,
            op: wr_op,
            sg_list: &sg,
            signaled: i == n - 1,
        })
        .collect();
    let mut buf = [Completion::EMPTY; 4];
    let (mut posted, mut done) = (0u64, 0u64);
    while done < count {
        while posted < count && posted - done < 2 * n as u64 {
            b.qp.post_send(&list)?;
            posted += n as u64;
        }
        done += (b.wait_one(&mut buf)? * n) as u64;
    }
    Ok(())
}

/// Async: `depth` single-WRITE futures in flight, driven on this thread (polling CQ `cq`).
pub(super) fn async_window(
    engine: &Engine,
    q: &AsyncQp,
    local: &Arc<Mr>,
    remote: RemoteAddr,
    depth: usize,
    count: u64,
    cq: usize,
) -> Result<()> {
    let mut window: Vec<Option<OpFuture<'_, Arc<Mr>>>> = (0..depth).map(|_| None).collect();
    let mut cx = TaskContext::from_waker(Waker::noop());
    let (mut started, mut done) = (0u64, 0u64);
    let mut idle = 0u32;
    while done < count {
        let mut progressed = false;
        for f in window.iter_mut() {
            if f.is_none() && started < count {
                *f = Some(q.write(local.clone(), 0, 8, remote));
                started += 1;
            }
            if let Some(fut) = f {
                if let Poll::Ready(r) = Pin::new(fut).poll(&mut cx) {
                    r.0?;
                    *f = None;
                    done += 1;
                    progressed = true;
                }
            }
        }
        if progressed || engine.progress_cq(cq) > 0 {
            idle = 0;
        } else {
            // Polite polling: with more threads than cores, a spinning thread would take
            // the core from the one (or the responder) that has work.
            idle += 1;
            if idle.is_multiple_of(64) {
                std::thread::yield_now();
            }
        }
    }
    Ok(())
}

/// Async: batches of `n` WRITEs (one future each), two in flight.
pub(super) fn async_batches(
    engine: &Engine,
    q: &AsyncQp,
    local: &Arc<Mr>,
    remote: RemoteAddr,
    n: usize,
    count: u64,
) -> Result<()> {
    let batch = || {
        q.batch(
            (0..n)
                .map(|_| (WrOp::Write { remote, imm: None }, local.clone(), 0, 8))
                .collect(),
        )
    };
    let mut window: [Option<OpFuture<'_, Vec<Arc<Mr>>>>; 2] = [None, None];
    let mut cx = TaskContext::from_waker(Waker::noop());
    let (mut started, mut done) = (0u64, 0u64);
    while done < count {
        let mut progressed = false;
        for f in window.iter_mut() {
            if f.is_none() && started < count {
                *f = Some(batch());
                started += n as u64;
            }
            if let Some(fut) = f {
                if let Poll::Ready(r) = Pin::new(fut).poll(&mut cx) {
                    r.0?;
                    *f = None;
                    done += n as u64;
                    progressed = true;
                }
            }
        }
        if !progressed {
            engine.progress();
        }
    }
    Ok(())
}
