//! Sampled work-request latency per opcode: the time from [`crate::fabric::Qp::post_send`]
//! to [`crate::fabric::Cq::poll`] returning the request's completion.
//!
//! Off by default, so the data path pays one relaxed atomic load per post and per poll.
//! [`sample_op_latency`]`(n)` (or a started [`super::Endpoint`]) turns it on: one signalled
//! work request in `n` per thread has its post time kept under `(qp_num, wr_id)` in a small
//! table, and the poll that returns a completion with that key records the difference in the
//! histogram of the completion's opcode. A work request is matched by its `wr_id`, so the
//! figure is exact when ids are unique among a QP's outstanding requests (as the async
//! engine's are); a caller reusing one id for many outstanding requests gets the latency to
//! the first of them to complete.

use super::latency::{latency, Latency, LatencySummary};
use super::opt_in::OptIn;
use crate::fabric::{Completion, SendWr, WcOpcode, WcStatus, WrOp};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// The sampling rate a started [`super::Endpoint`] sets when none was chosen: one signalled
/// work request in 64 per thread.
pub const DEFAULT_OP_SAMPLE_EVERY: u32 = 64;

/// Requests waiting for their completion, at most this many (a sample finding the table full
/// is dropped, and entries whose completion never came are cleared when it is).
const MAX_PENDING: usize = 4096;

/// 0: off; n: one signalled request in n is timed.
static SAMPLE_EVERY: OptIn = OptIn::off();
/// Entries in [`Ops::pending`], read without the lock by the poll path.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// The opcodes timed, in the order a snapshot lists them.
pub(crate) const TIMED: [WcOpcode; 5] = [
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
    WcOpcode::Send,
];

struct Ops {
    pending: Mutex<BTreeMap<(u32, u64), Instant>>,
    hist: [Mutex<Latency>; TIMED.len()],
}

fn ops() -> &'static Ops {
    static O: OnceLock<Ops> = OnceLock::new();
    O.get_or_init(|| Ops {
        pending: Mutex::new(BTreeMap::new()),
        hist: std::array::from_fn(|_| latency()),
    })
}

thread_local! {
    static POSTED: Cell<u32> = const { Cell::new(0) };
}

/// Times one signalled work request in `every` per thread from now on; 0 turns timing off
/// (requests already being timed still complete into the histograms).
///
/// ```
/// rdmapool::metrics::sample_op_latency(1); // every request: for tests and probes
/// assert_eq!(rdmapool::metrics::op_sample_every(), 1);
/// rdmapool::metrics::sample_op_latency(0);
/// ```
pub fn sample_op_latency(every: u32) {
    SAMPLE_EVERY.choose(every);
}

/// What a started endpoint does: [`DEFAULT_OP_SAMPLE_EVERY`] unless a rate was chosen.
pub(crate) fn default_on() {
    SAMPLE_EVERY.default_to(DEFAULT_OP_SAMPLE_EVERY);
}

/// The current sampling rate (0: off).
pub fn op_sample_every() -> u32 {
    SAMPLE_EVERY.get()
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

/// Called by `Qp::post_send` before `wrs` are posted on QP `qp_num`: keeps the post time of
/// at most one of them when sampling says so, and returns its key so that a failed post can
/// take it back ([`post_failed`]). Kept before posting, so a completion polled at once by
/// another thread still finds it.
pub(crate) fn before_post(qp_num: impl FnOnce() -> u32, wrs: &[SendWr<'_>]) -> Option<(u32, u64)> {
    let every = SAMPLE_EVERY.get();
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
    let mut p = ops().pending.lock();
    if p.len() >= MAX_PENDING {
        // Completions that never came (a QP destroyed with work outstanding, a caller that
        // stopped polling): start over rather than keep them forever.
        p.clear();
    }
    p.insert(key, Instant::now());
    PENDING.store(p.len(), Ordering::Relaxed);
    Some(key)
}

/// The post that [`before_post`] sampled failed: nothing will complete.
pub(crate) fn post_failed(key: (u32, u64)) {
    let mut p = ops().pending.lock();
    p.remove(&key);
    PENDING.store(p.len(), Ordering::Relaxed);
}

/// Called by `Cq::poll` with what it returned: records the latency of the sampled ones.
pub(crate) fn completed(done: &[Completion]) {
    if done.is_empty() || PENDING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let now = Instant::now();
    let g = ops();
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
    PENDING.store(p.len(), Ordering::Relaxed);
}

/// The latency summary of each timed opcode that has recorded something.
pub(crate) fn summaries() -> Vec<(WcOpcode, LatencySummary)> {
    let g = ops();
    TIMED
        .iter()
        .zip(g.hist.iter())
        .map(|(&op, h)| (op, h.lock().summary()))
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
