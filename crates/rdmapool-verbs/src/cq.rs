//! Completion queues on verbs: polling (with the work log's exact opcodes for error
//! completions), arming and the completion channel.

use super::{errno_err, oplog, os_err, VerbsContext};
use crate::fabric::provider::CqOps;
use crate::fabric::{Completion, WcOpcode, WcStatus};
use crate::{Error, Result};
use rdmapool_sys as sys;
use std::any::Any;
use std::sync::Arc;

/// Creates a CQ of `depth` entries with a non-blocking completion channel of its own.
pub(super) fn create(ctx: &Arc<VerbsContext>, depth: u32) -> Result<Arc<dyn CqOps>> {
    if depth == 0 || depth > ctx.info.max_cqe {
        return Err(Error::OutOfLimits {
            what: "CQ depth",
            value: depth.into(),
            min: 1,
            max: ctx.info.max_cqe.into(),
        });
    }
    // SAFETY: a live context.
    let channel = unsafe { (ctx.v.ibv_create_comp_channel)(ctx.ctx) };
    if channel.is_null() {
        return Err(os_err("ibv_create_comp_channel"));
    }
    // Non-blocking, so ack_events never waits.
    // SAFETY: fcntl on the channel's own fd.
    unsafe {
        let fd = (*channel).fd;
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
    }
    // SAFETY: a live context and channel; vector 0.
    let cq =
        unsafe { (ctx.v.ibv_create_cq)(ctx.ctx, depth as i32, std::ptr::null_mut(), channel, 0) };
    if cq.is_null() {
        let e = os_err("ibv_create_cq");
        // SAFETY: the channel we just made, unused.
        unsafe { (ctx.v.ibv_destroy_comp_channel)(channel) };
        return Err(e);
    }
    let overrun = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(e) = &ctx.events {
        e.watch_cq(cq, &overrun);
    }
    Ok(Arc::new(VerbsCqHandle(Arc::new(VerbsCq {
        ctx: ctx.clone(),
        cq,
        channel,
        unacked: std::sync::atomic::AtomicU32::new(0),
        depth,
        overrun,
    }))))
}

/// A completion queue.
pub(crate) struct VerbsCq {
    ctx: Arc<VerbsContext>,
    pub(crate) cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    /// Events read from the channel but not yet acknowledged (acked before destroy).
    unacked: std::sync::atomic::AtomicU32,
    depth: u32,
    /// Set by the event thread when the device reports this CQ overran.
    overrun: Arc<std::sync::atomic::AtomicBool>,
}

// SAFETY: a verbs handle; polling is thread-safe in rdma-core providers.
unsafe impl Send for VerbsCq {}
// SAFETY: as above.
unsafe impl Sync for VerbsCq {}

impl Drop for VerbsCq {
    fn drop(&mut self) {
        if let Some(e) = &self.ctx.events {
            e.unwatch_cq(self.cq);
        }
        // SAFETY: QPs hold an Arc to their CQs, so none uses it any more; every event read
        // from the channel is acknowledged before the CQ is destroyed, as verbs requires.
        unsafe {
            let n = self.unacked.swap(0, std::sync::atomic::Ordering::AcqRel);
            if n > 0 {
                (self.ctx.v.ibv_ack_cq_events)(self.cq, n);
            }
            (self.ctx.v.ibv_destroy_cq)(self.cq);
            (self.ctx.v.ibv_destroy_comp_channel)(self.channel);
        }
    }
}

pub(super) struct VerbsCqHandle(pub(super) Arc<VerbsCq>);

fn wc_status(s: u32) -> WcStatus {
    WcStatus::from_u8(s.min(255) as u8).unwrap_or(WcStatus::GeneralErr)
}

fn wc_opcode(o: u32) -> WcOpcode {
    match o {
        sys::IBV_WC_SEND => WcOpcode::Send,
        sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        sys::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        sys::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        sys::IBV_WC_BIND_MW => WcOpcode::BindMw,
        sys::IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        _ => WcOpcode::Recv,
    }
}

impl CqOps for VerbsCqHandle {
    fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        if self.0.overrun.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::CqOverrun {
                depth: self.0.depth,
            });
        }
        const CHUNK: usize = 16;
        let mut wcs = [const { std::mem::MaybeUninit::<sys::ibv_wc>::uninit() }; CHUNK];
        let mut n = 0;
        // The QP of the last completion and its work log (a CQ mostly serves few QPs).
        let mut log: Option<(u32, Option<Arc<oplog::WorkLog>>)> = None;
        while n < out.len() {
            let want = (out.len() - n).min(CHUNK);
            // SAFETY: a live CQ and room for `want` completions.
            let got = unsafe { sys::ibv_poll_cq(self.0.cq, want as i32, wcs.as_mut_ptr().cast()) };
            if got < 0 {
                return Err(errno_err("ibv_poll_cq", -got));
            }
            for wc in &wcs[..got as usize] {
                // SAFETY: ibv_poll_cq wrote the first `got` entries.
                let wc = unsafe { wc.assume_init_ref() };
                let imm = (wc.wc_flags & sys::IBV_WC_WITH_IMM != 0)
                    // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data (big-endian).
                    .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
                let status = wc_status(wc.status);
                if log.as_ref().is_none_or(|(qpn, _)| *qpn != wc.qp_num) {
                    log = Some((wc.qp_num, self.0.ctx.work_logs.get(wc.qp_num)));
                }
                let qp_log = log.as_ref().and_then(|(_, l)| l.as_deref());
                let opcode = if status == WcStatus::Success {
                    let op = wc_opcode(wc.opcode);
                    if let Some(l) = qp_log {
                        l.complete(wc.wr_id, Some(op));
                    }
                    op
                } else {
                    // Undefined in an error completion: report what was posted.
                    qp_log
                        .and_then(|l| l.complete(wc.wr_id, None))
                        .unwrap_or(WcOpcode::Send)
                };
                out[n] = Completion {
                    wr_id: wc.wr_id,
                    status,
                    opcode,
                    byte_len: wc.byte_len,
                    imm,
                    qp_num: wc.qp_num,
                };
                n += 1;
            }
            if (got as usize) < want {
                break;
            }
        }
        Ok(n)
    }
    fn depth(&self) -> u32 {
        self.0.depth
    }
    fn req_notify(&self) -> Result<()> {
        // SAFETY: a live CQ; 0 = notify on any completion.
        let rc = unsafe { sys::ibv_req_notify_cq(self.0.cq, 0) };
        if rc != 0 {
            return Err(errno_err("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
    fn event_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: a live channel.
        unsafe { (*self.0.channel).fd }
    }
    fn ack_events(&self) -> Result<usize> {
        let mut n = 0u32;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: a live, non-blocking channel and out-pointers.
            if unsafe { (self.0.ctx.v.ibv_get_cq_event)(self.0.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            n += 1;
        }
        if n > 0 {
            // SAFETY: acknowledging exactly the events read above, on their CQ.
            unsafe { (self.0.ctx.v.ibv_ack_cq_events)(self.0.cq, n) };
        }
        Ok(n as usize)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
