//! Sampled work-request latency per opcode: the time from [`crate::fabric::Qp::post_send`]
//! to [`crate::fabric::Cq::poll`] returning the request's completion.
//!
//! Off by default, so the data path pays one relaxed atomic load per post and per poll.
//! [`ContextMetrics::sample_op_latency`](super::ContextMetrics::sample_op_latency)`(n)` (or
//! an exporter (`rdmapool_exporter::Endpoint`) watching the context) turns it on: one signalled
//! work request in `n` per thread has its post time kept under `(qp_num, wr_id)` in a small
//! table, and the poll that returns a completion with that key records the difference in the
//! histogram of the completion's opcode. A work request is matched by its `wr_id`, so the
//! figure is exact when ids are unique among a QP's outstanding requests (as the async
//! engine's are); a caller reusing one id for many outstanding requests gets the latency to
//! the first of them to complete.

use super::latency::{latency, merged, Latency, LatencySummary};
use super::opt_in::OptIn;
use crate::fabric::{Completion, SendWr, WcOpcode, WcStatus, WrOp};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The sampling rate a watching exporter (`rdmapool_exporter::Endpoint`) sets when none was chosen:
/// one signalled work request in 64 per thread.
pub const DEFAULT_OP_SAMPLE_EVERY: u32 = 64;

/// Requests waiting for their completion, at most this many (a sample finding the table full
/// is dropped, and entries whose completion never came are cleared when it is).
const MAX_PENDING: usize = 4096;

/// The opcodes timed, in the order a snapshot lists them.
#[doc(hidden)]
pub const TIMED: [WcOpcode; 5] = [
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
    WcOpcode::Send,
];

/// One context's sampler: the requests waiting for their completion, and a histogram per
/// timed opcode.
#[doc(hidden)]
pub struct OpSampler {
    /// 0: off; n: one signalled request in n is timed.
    every: OptIn,
    /// Entries in `pending`, read without the lock by the poll path.
    pending_len: AtomicUsize,
    pending: Mutex<BTreeMap<(u32, u64), Instant>>,
    hist: [Mutex<Latency>; TIMED.len()],
}

impl Default for OpSampler {
    fn default() -> Self {
        Self {
            every: OptIn::off(),
            pending_len: AtomicUsize::new(0),
            pending: Mutex::new(BTreeMap::new()),
            hist: std::array::from_fn(|_| latency()),
        }
    }
}

thread_local! {
    static POSTED: Cell<u32> = const { Cell::new(0) };
}

fn timed_index(op: &WrOp) -> Option<usize> {
    let code = match op {
        WrOp::Write { .. } => WcOpcode::RdmaWrite,
        WrOp::Read { .. } => WcOpcode::RdmaRead,
        WrOp::CompareSwap { .. } => WcOpcode::CompSwap,
        WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        WrOp::Send { .. } => WcOpcode::Send,
        _ => return None,
    };
    TIMED.iter().position(|&c| c == code)
}

impl OpSampler {
    /// Times one signalled work request in `every` per thread from now on; 0 turns timing
    /// off (requests already being timed still complete into the histograms).
    #[doc(hidden)]
    pub fn sample(&self, every: u32) {
        self.every.choose(every);
    }

    /// What a watching endpoint does: [`DEFAULT_OP_SAMPLE_EVERY`] unless a rate was chosen.
    #[doc(hidden)]
    pub fn default_on(&self) {
        self.every.default_to(DEFAULT_OP_SAMPLE_EVERY);
    }

    /// The current sampling rate (0: off).
    #[doc(hidden)]
    pub fn every(&self) -> u32 {
        self.every.get()
    }

    /// Called by `Qp::post_send` before `wrs` are posted on QP `qp_num`: keeps the post time of
    /// at most one of them when sampling says so, and returns its key so that a failed post can
    /// take it back ([`post_failed`]). Kept before posting, so a completion polled at once by
    /// another thread still finds it.
    #[doc(hidden)]
    pub fn before_post(
        &self,
        qp_num: impl FnOnce() -> u32,
        wrs: &[SendWr<'_>],
    ) -> Option<(u32, u64)> {
        let every = self.every.get();
        if every == 0 {
            return None;
        }
        let wr = wrs
            .iter()
            .find(|w| w.signaled && timed_index(&w.op).is_some())?;
        let take = POSTED.with(|n| {
            let v = n.get().wrapping_add(1);
            n.set(v);
            v % every == 0
        });
        if !take {
            return None;
        }
        let key = (qp_num(), wr.wr_id);
        let mut p = self.pending.lock();
        if p.len() >= MAX_PENDING {
            // Completions that never came (a QP destroyed with work outstanding, a caller that
            // stopped polling): start over rather than keep them forever.
            p.clear();
        }
        p.insert(key, Instant::now());
        self.pending_len.store(p.len(), Ordering::Relaxed);
        Some(key)
    }

    /// The post that [`before_post`] sampled failed: nothing will complete.
    #[doc(hidden)]
    pub fn post_failed(&self, key: (u32, u64)) {
        let mut p = self.pending.lock();
        p.remove(&key);
        self.pending_len.store(p.len(), Ordering::Relaxed);
    }

    /// Called by `Cq::poll` with what it returned: records the latency of the sampled ones.
    #[doc(hidden)]
    pub fn completed(&self, done: &[Completion]) {
        if done.is_empty() || self.pending_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = Instant::now();
        let g = self;
        let mut p = g.pending.lock();
        for c in done {
            let Some(t) = p.remove(&(c.qp_num, c.wr_id)) else {
                continue;
            };
            // Failed requests are counted by status, not timed: a flush says nothing of speed.
            if c.status != WcStatus::Success {
                continue;
            }
            if let Some(i) = TIMED.iter().position(|&o| o == c.opcode) {
                g.hist[i].lock().record(now.saturating_duration_since(t));
            }
        }
        self.pending_len.store(p.len(), Ordering::Relaxed);
    }
}

/// The latency summary of each timed opcode that has recorded something, over these
/// samplers together.
#[doc(hidden)]
pub fn summaries<'a>(
    samplers: impl Iterator<Item = &'a OpSampler> + Clone,
) -> Vec<(WcOpcode, LatencySummary)> {
    TIMED
        .iter()
        .enumerate()
        .map(|(i, &op)| (op, merged(samplers.clone().map(|s| &s.hist[i]))))
        .filter(|(_, s)| s.count > 0)
        .collect()
}

/// The `opcode` label of a completion opcode: `rdma_write`, `rdma_read`, `comp_swap`,
/// `fetch_add`, `send` (its `ibv_wc_opcode` name without `IBV_WC_`, in lower case).
pub fn opcode_label(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::Send => "send",
        WcOpcode::RdmaWrite => "rdma_write",
        WcOpcode::RdmaRead => "rdma_read",
        WcOpcode::CompSwap => "comp_swap",
        WcOpcode::FetchAdd => "fetch_add",
        WcOpcode::Recv => "recv",
        WcOpcode::RecvRdmaWithImm => "recv_rdma_with_imm",
        WcOpcode::BindMw => "bind_mw",
        WcOpcode::LocalInv => "local_inv",
    }
}
