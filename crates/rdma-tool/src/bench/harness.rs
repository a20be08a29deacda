//! The measuring harness every data-path benchmark shares: the operations, a connected
//! initiator QP with a registered local buffer (`Bench`), and how many iterations a size gets.
//! `data` (raw and reference rows), `engine` (async rows) and `verbs` use it; it uses none of
//! them.

use super::Stats;
use crate::peer::PeerProcess;
use crate::{Result, ToolError};
use rdmapool::fabric::*;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Op {
    Write,
    Read,
    Cas,
    Faa,
}

impl Op {
    pub(super) fn parse(s: &str) -> Result<Op> {
        Ok(match s.trim() {
            "write" => Op::Write,
            "read" => Op::Read,
            "cas" => Op::Cas,
            "faa" => Op::Faa,
            o => {
                return Err(ToolError::Msg(format!(
                    "unknown op {o:?}: expected write, read, cas or faa"
                )))
            }
        })
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Cas => "cas",
            Op::Faa => "faa",
        }
    }
    pub(super) fn is_atomic(self) -> bool {
        matches!(self, Op::Cas | Op::Faa)
    }
}

const WAIT: Duration = Duration::from_secs(30);
/// Requests kept in flight for bandwidth runs.
const WINDOW: usize = 16;

pub(super) struct Bench {
    pub(super) cq: Cq,
    pub(super) qp: Qp,
    pub(super) local: Mr,
    pub(super) region: RemoteRegion,
}

impl Bench {
    /// The work request of an 8-byte (or `size`-byte) `op` on the region's first bytes, with
    /// its local piece (atomics: the 8 bytes at `slot * 8`).
    pub(super) fn wr(&self, op: Op, size: usize, slot: usize) -> Result<(WrOp, Sge)> {
        let remote = self.region.at(0)?;
        let sge = self
            .local
            .sge(if op.is_atomic() { slot * 8 } else { 0 }, size as u32)?;
        Ok((
            match op {
                Op::Write => WrOp::Write { remote, imm: None },
                Op::Read => WrOp::Read { remote },
                Op::Cas => WrOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 0,
                },
                Op::Faa => WrOp::FetchAdd { remote, add: 1 },
            },
            sge,
        ))
    }

    pub(super) fn wait_one(&self, buf: &mut [Completion]) -> Result<usize> {
        // The deadline is armed only after many empty polls, so a completion that is already
        // there costs no clock read (a measurable share of a latency sample).
        let mut deadline = None;
        let mut empty = 0u32;
        loop {
            let n = self.cq.poll(buf)?;
            if n > 0 {
                if let Some(bad) = buf[..n].iter().find(|c| !c.is_ok()) {
                    return Err(ToolError::Msg(format!(
                        "work request failed: {}",
                        bad.status
                    )));
                }
                return Ok(n);
            }
            empty += 1;
            if empty.is_multiple_of(4096) {
                let d = *deadline.get_or_insert_with(|| Instant::now() + WAIT);
                if Instant::now() > d {
                    return Err(ToolError::Msg("no completion within 30 s".into()));
                }
            }
        }
    }

    /// One operation at a time: post, busy-poll its completion.
    pub(super) fn latency(&self, op: Op, size: usize, iters: u64) -> Result<Stats> {
        Ok(Stats::from_samples(&self.latency_samples(op, size, iters)?))
    }

    /// The samples (ns) behind [`Bench::latency`], after a warm-up of a tenth.
    pub(super) fn latency_samples(&self, op: Op, size: usize, iters: u64) -> Result<Vec<u64>> {
        let (wop, sge) = self.wr(op, size, 0)?;
        let sg = [sge];
        let mut buf = [Completion::EMPTY; 1];
        let warm = (iters / 10).max(10);
        let mut samples = Vec::with_capacity(iters as usize);
        for i in 0..warm + iters {
            let t = Instant::now();
            self.qp.post_send(&[SendWr {
                wr_id: i,
                op: wop,
                sg_list: &sg,
                signaled: true,
            }])?;
            self.wait_one(&mut buf)?;
            if i >= warm {
                samples.push(t.elapsed().as_nanos() as u64);
            }
        }
        Ok(samples)
    }

    /// A window of operations in flight; returns GB/s of payload.
    pub(super) fn bandwidth(&self, op: Op, size: usize, count: u64) -> Result<f64> {
        let mut buf = [Completion::EMPTY; WINDOW];
        let mut posted = 0u64;
        let mut done = 0u64;
        let t = Instant::now();
        while done < count {
            while posted < count && posted - done < WINDOW as u64 {
                let (wop, sge) = self.wr(op, size, (posted % WINDOW as u64) as usize)?;
                self.qp.post_send(&[SendWr {
                    wr_id: posted,
                    op: wop,
                    sg_list: &[sge],
                    signaled: true,
                }])?;
                posted += 1;
            }
            done += self.wait_one(&mut buf)? as u64;
        }
        Ok((count * size as u64) as f64 / t.elapsed().as_nanos() as f64)
    }
}

/// Opens the context `device` selects and connects a QP to `peer` over `transport`, with a local
/// region of `local_size` bytes: what every data benchmark starts from.
pub(super) fn connect_bench(
    device: &crate::device_args::DeviceArgs,
    peer: &PeerProcess,
    transport: Transport,
    local_size: usize,
) -> Result<(Context, Pd, Bench)> {
    let ctx = device.open(transport)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4096)?;
    let cfg = QpConfig::default();
    let (qp, region) = peer.connect(&pd, &cq, &cfg)?;
    let local = pd.alloc_mr(local_size, AccessFlags::all_remote())?;
    let bench = Bench {
        cq,
        qp,
        local,
        region,
    };
    Ok((ctx, pd, bench))
}

/// Fewer latency iterations for larger messages, to bound run time: at least 50 (or `base`
/// when it is smaller; `--iters` may be 1), at most `base`.
pub(super) fn iters_for(size: usize, base: u64) -> u64 {
    (base.saturating_mul(8) / size.max(8) as u64).clamp(base.min(50), base)
}

pub(super) fn count_for(size: usize) -> u64 {
    ((256u64 << 20) / size as u64).clamp(400, 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_shrink_with_size_within_bounds_for_any_base() {
        assert_eq!(iters_for(8, 20000), 20000);
        assert_eq!(iters_for(1 << 20, 20000), 50);
        // --iters below the floor of 50 (was a 'min > max' panic).
        for base in [1, 10, 49, 50] {
            assert_eq!(iters_for(8, base), base);
            assert_eq!(iters_for(4 << 20, base), base.min(50));
        }
    }
}
