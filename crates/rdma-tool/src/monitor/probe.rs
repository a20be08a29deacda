//! The workload `monitor` runs when given no `--target`: on the device of
//! `--provider`/`--device`, a background thread registers and deregisters regions of a few sizes through a registrar, looks
//! buffers up in a registration cache, takes buffers from a pool and runs WRITE, READ, CAS
//! and FAA between two connected QPs (every one timed: the probe samples 1 in 1), so every
//! metric the monitor shows has real numbers behind it (from the probe context's metrics).

use crate::device_args::DeviceArgs;
use crate::Result;
use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::*;
use rdmapool::metrics::ContextMetrics;
use rdmapool::mr::{CacheConfig, RegCache, Registrar, RegistrarConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The running probe; dropping it stops the thread.
pub struct Probe {
    /// The probe context's metrics (what monitor shows).
    metrics: ContextMetrics,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Probe {
    /// Sets up the objects (errors are reported here) and starts the thread.
    pub fn start(device: &DeviceArgs) -> Result<Self> {
        let ctx = device.open(Transport::Auto)?;
        let pd = ctx.alloc_pd()?;
        let ops = Ops::new(&ctx, &pd)?;
        let metrics = ctx.metrics();
        metrics.sample_op_latency(1);
        let reg = Registrar::new(pd.clone(), RegistrarConfig::default())?;
        let cache = RegCache::new(pd.clone(), CacheConfig::default())?;
        let pool = BufferPool::new(pd, PoolConfig::default())?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("monitor-probe".into())
            .spawn(move || work(&reg, cache, &pool, &ops, &s))
            .map_err(|e| crate::ToolError::Io("starting the probe thread".into(), e))?;
        Ok(Self {
            metrics,
            stop,
            thread: Some(thread),
        })
    }

    /// What the probe's context records.
    pub fn metrics(&self) -> ContextMetrics {
        self.metrics.clone()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two connected QPs on one soft NIC and the memory the probe's data operations use.
pub(super) struct Ops {
    cq: Cq,
    qp: Qp,
    _peer: Qp,
    local: Mr,
    target: Mr,
}

impl Ops {
    pub(super) fn new(ctx: &Context, pd: &Pd) -> Result<Self> {
        let cq = ctx.create_cq(16)?;
        let cfg = QpConfig::default();
        let (qp, peer) = (pd.create_qp(&cq, &cq, &cfg)?, pd.create_qp(&cq, &cq, &cfg)?);
        qp.connect(&peer.endpoint())?;
        peer.connect(&qp.endpoint())?;
        Ok(Self {
            local: pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?,
            target: pd.alloc_mr(4096, AccessFlags::all_remote())?,
            cq,
            qp,
            _peer: peer,
        })
    }

    /// One WRITE, READ, CAS and FAA, each waited for; the first failure ends the round.
    pub(super) fn round(&self, i: u64) -> Result<()> {
        let remote = self.target.remote_at(0)?;
        let ops = [
            (WrOp::Write { remote, imm: None }, 256),
            (WrOp::Read { remote }, 256),
            (
                WrOp::CompareSwap {
                    remote,
                    compare: i,
                    swap: i + 1,
                },
                8,
            ),
            (WrOp::FetchAdd { remote, add: 1 }, 8),
        ];
        for (k, (op, len)) in ops.into_iter().enumerate() {
            self.qp.post_send(&[SendWr {
                wr_id: i << 2 | k as u64,
                op,
                sg_list: &[self.local.sge(0, len)?],
                signaled: true,
            }])?;
            let done = self.cq.wait(1, Duration::from_secs(5))?;
            if let Some(c) = done.iter().find(|c| c.status != WcStatus::Success) {
                return Err(crate::ToolError::Msg(format!(
                    "probe work request {} completed with {:?}",
                    c.wr_id, c.status
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
impl Ops {
    /// A WRITE with a wrong rkey, waited for: the error completion the tests look for.
    pub(super) fn wrong_rkey_write(&self) -> Completion {
        let mut remote = self.target.remote_at(0).unwrap();
        remote.rkey ^= 1;
        self.qp
            .post_send(&[SendWr {
                wr_id: u64::MAX,
                op: WrOp::Write { remote, imm: None },
                sg_list: &[self.local.sge(0, 8).unwrap()],
                signaled: true,
            }])
            .unwrap();
        self.cq.wait(1, Duration::from_secs(5)).unwrap()[0]
    }

    /// The QP the requests are posted on, and its peer.
    pub(super) fn qpns(&self) -> (u32, u32) {
        (self.qp.qpn(), self._peer.qpn())
    }
}

fn work(reg: &Registrar, cache: RegCache, pool: &BufferPool, ops: &Ops, stop: &AtomicBool) {
    const SIZES: [usize; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];
    // Eight buffers looked up in the cache in turn: misses at first, hits after.
    let bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 64 << 10]).collect();
    let mut held = std::collections::VecDeque::new();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let len = SIZES[i % SIZES.len()];
        if let Ok(mr) = reg.submit(len, AccessFlags::LOCAL_WRITE).wait() {
            drop(mr); // deregisters
        }
        let b = &bufs[i % bufs.len()];
        // SAFETY: `bufs` outlives the cache (dropped explicitly below, before `bufs`), and
        // the handle is dropped at once.
        drop(unsafe { cache.get(b.as_ptr(), b.len()) });
        // A few buffers held at a time (the oldest returned), so usage is never idle.
        if let Ok(b) = pool.alloc(4096 << (i % 3)) {
            held.push_back(b);
        }
        if held.len() > 3 {
            held.pop_front();
        }
        // A QP in error stays so; the other metrics go on without data operations.
        let _ = ops.round(i as u64);
        std::thread::sleep(Duration::from_millis(10));
        i += 1;
    }
    drop(cache); // its registrations go before the memory they cover
    drop(bufs);
}
