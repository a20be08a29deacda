//! RC queue pairs on verbs: creation, the RESET→INIT→RTR→RTS transitions for InfiniBand
//! (LID) and RoCE (GID) addressing, and posting without allocation.

mod post;

use super::addr::{ack_timeout_exponent, rnr_timer_code, VerbsAddress};
use super::oplog::WorkLog;
use super::{errno_err, os_err, VerbsCq, VerbsPd};
use crate::fabric::provider::{BindSpec, MwOps, QpOps};
use crate::fabric::{Endpoint, ProviderKind, QpCapacity, QpConfig, QpState, RecvWr, SendWr};
use crate::{Error, Result};
use rdmapool_sys as sys;
use std::sync::Arc;

/// An RC queue pair.
pub(crate) struct VerbsQp {
    pd: Arc<VerbsPd>,
    _send_cq: Arc<VerbsCq>,
    _recv_cq: Arc<VerbsCq>,
    qp: *mut sys::ibv_qp,
    cfg: QpConfig,
    psn: u32,
    /// The queue depths, exactly as configured (enforced with `log`).
    capacity: QpCapacity,
    log: Arc<WorkLog>,
    /// Bytes a SEND or WRITE may carry inline (copied into the work request at posting,
    /// no DMA read of the buffer): what the device granted of [`INLINE_REQUEST`].
    max_inline: u32,
}

/// Inline data asked for per work request: enough for the small WRITEs of counters, locks
/// and pool metadata.
const INLINE_REQUEST: u32 = 64;

// SAFETY: a verbs handle; rdma-core QPs may be posted to from any thread.
unsafe impl Send for VerbsQp {}
// SAFETY: as above.
unsafe impl Sync for VerbsQp {}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        self.pd.ctx.work_logs.remove(self.qpn());
        // SAFETY: created once, destroyed once; the CQs and PD outlive it (Arcs held).
        unsafe { (self.pd.ctx.v.ibv_destroy_qp)(self.qp) };
    }
}

impl VerbsQp {
    pub(crate) fn create(
        pd: Arc<VerbsPd>,
        send_cq: Arc<VerbsCq>,
        recv_cq: Arc<VerbsCq>,
        cfg: &QpConfig,
    ) -> Result<Box<dyn QpOps>> {
        let info = &pd.ctx;
        // SAFETY: all-zero is a valid ibv_qp_init_attr (null pointers, zero integers).
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.cq;
        init.recv_cq = recv_cq.cq;
        init.qp_type = sys::IBV_QPT_RC;
        init.cap.max_send_wr = cfg.max_send_wr;
        init.cap.max_recv_wr = cfg.max_recv_wr.max(1);
        init.cap.max_send_sge = cfg.max_sge;
        init.cap.max_recv_sge = cfg.max_sge;
        init.cap.max_inline_data = INLINE_REQUEST;
        // SAFETY: a live PD and an initialised attribute struct.
        let mut qp = unsafe { (info.v.ibv_create_qp)(pd.pd, &mut init) };
        if qp.is_null() {
            // A device without inline data (or with less): the same QP without it.
            init.cap.max_inline_data = 0;
            // SAFETY: as above.
            qp = unsafe { (info.v.ibv_create_qp)(pd.pd, &mut init) };
        }
        if qp.is_null() {
            return Err(os_err("ibv_create_qp"));
        }
        // What the device granted (rdma-core writes the capabilities back).
        let max_inline = init.cap.max_inline_data;
        let mut r = [0u8; 4];
        let _ = getrandom::fill(&mut r);
        let psn = u32::from_le_bytes(r) & 0xff_ffff;
        // Exactly what was asked for: the device may have rounded its rings up (rxe makes
        // 7 of 4, and reports 4), and the work log enforces the configured depth.
        let capacity = QpCapacity {
            send: cfg.max_send_wr,
            recv: cfg.max_recv_wr,
        };
        let log = Arc::new(WorkLog::new(capacity.send, capacity.recv));
        // SAFETY: a live QP.
        pd.ctx
            .work_logs
            .insert(unsafe { (*qp).qp_num }, log.clone());
        Ok(Box::new(VerbsQp {
            pd,
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            qp,
            cfg: cfg.clone(),
            psn,
            capacity,
            log,
            max_inline,
        }))
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32, what: &'static str) -> Result<()> {
        // SAFETY: a live QP and an initialised attribute struct.
        let rc = unsafe { (self.pd.ctx.v.ibv_modify_qp)(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(match rc {
                libc::EINVAL => Error::InvalidQpState {
                    qpn: self.qpn(),
                    state: self.state(),
                    needed: what,
                },
                e => errno_err("ibv_modify_qp", e),
            });
        }
        Ok(())
    }

    fn zeroed_attr() -> sys::ibv_qp_attr {
        // SAFETY: all-zero is a valid ibv_qp_attr (integers and a zero GID).
        unsafe { std::mem::zeroed() }
    }
}

fn from_ibv_state(s: u32) -> QpState {
    match s {
        sys::IBV_QPS_RESET => QpState::Reset,
        sys::IBV_QPS_INIT => QpState::Init,
        sys::IBV_QPS_RTR => QpState::Rtr,
        sys::IBV_QPS_RTS => QpState::Rts,
        _ => QpState::Error,
    }
}

impl QpOps for VerbsQp {
    fn qpn(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.qp).qp_num }
    }

    fn state(&self) -> QpState {
        let mut attr = Self::zeroed_attr();
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live QP and writable attribute structs.
        let rc = unsafe {
            (self.pd.ctx.v.ibv_query_qp)(self.qp, &mut attr, sys::IBV_QP_STATE as i32, &mut init)
        };
        if rc != 0 {
            return QpState::Error;
        }
        from_ibv_state(attr.qp_state)
    }

    fn endpoint(&self) -> Endpoint {
        let p = &self.pd.ctx.port;
        Endpoint {
            provider: ProviderKind::Verbs,
            qpn: self.qpn(),
            address: VerbsAddress {
                lid: p.lid,
                gid: p.gid,
                psn: self.psn,
                mtu: p.active_mtu as u8,
                link_layer: p.link_layer,
            }
            .encode(),
        }
    }

    fn to_init(&self) -> Result<()> {
        self.pd.ctx.require_active_port()?;
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.pd.ctx.port.num;
        a.qp_access_flags = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_ATOMIC;
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut a, mask, "INIT needs RESET")
    }

    fn to_rtr(&self, remote: &Endpoint) -> Result<()> {
        if remote.provider != ProviderKind::Verbs {
            return Err(Error::Mismatch(format!(
                "verbs QP {} cannot connect to a {} endpoint",
                self.qpn(),
                remote.provider
            )));
        }
        let r = VerbsAddress::decode(&remote.address)?;
        let port = &self.pd.ctx.port;
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_RTR;
        a.path_mtu = (port.active_mtu).min(r.mtu as u32).max(sys::IBV_MTU_256);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = r.psn;
        a.max_dest_rd_atomic = self.rd_atomic();
        a.min_rnr_timer = rnr_timer_code(self.cfg.rnr_timeout.as_secs_f64() * 1000.0 / 7.0);
        a.ah_attr.dlid = r.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = port.num;
        // RoCE (Ethernet link layer) always routes by GID; IB does when the peer has no LID.
        if port.link_layer == sys::IBV_LINK_LAYER_ETHERNET as u8 || r.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: r.gid };
            a.ah_attr.grh.sgid_index = port.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "RTR needs INIT and a reachable peer")
    }

    fn to_rts(&self) -> Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_RTS;
        a.retry_cnt = 7;
        a.timeout = ack_timeout_exponent(self.cfg.timeout, 7);
        a.rnr_retry = 6;
        a.sq_psn = self.psn;
        a.max_rd_atomic = self.rd_atomic();
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "RTS needs RTR")
    }

    fn capacity(&self) -> QpCapacity {
        self.capacity
    }

    fn post_bind_mw(&self, mw: &dyn MwOps, b: &BindSpec) -> Result<u32> {
        self.post_bind(mw, b)
    }

    fn rd_atomic(&self) -> Result<Option<(u8, u8)>> {
        self.query_rd_atomic().map(Some)
    }

    fn set_error(&self) {
        let mut a = Self::zeroed_attr();
        a.qp_state = sys::IBV_QPS_ERR;
        let _ = self.modify(&mut a, sys::IBV_QP_STATE, "ERR");
    }

    /// Without RDMA CM a verbs QP has no source of peer events (`Qp::wait_event` reads RDMA
    /// CM's when it connected the QP): waits out `timeout` and reports none.
    fn wait_event(&self, timeout: std::time::Duration) -> Option<crate::fabric::QpEvent> {
        std::thread::sleep(timeout);
        None
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_sends(wrs)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.post_recvs(wrs)
    }
}

impl VerbsQp {
    /// Applies attributes computed elsewhere (RDMA CM's `rdma_init_qp_attr`).
    pub(crate) fn modify_raw(&self, attr: &mut sys::ibv_qp_attr, mask: u32) -> Result<()> {
        self.modify(attr, mask, "the transition RDMA CM asked for")
    }

    /// Outstanding RDMA READ/atomic depth: the configured one, bounded by the device.
    pub(crate) fn rd_atomic(&self) -> u8 {
        let device = self.pd.ctx.max_rd_atomic;
        match self.cfg.max_rd_atomic {
            0 => device,
            n => n.min(device),
        }
    }

    /// The QP's READ/atomic depths as the device has them now: (`max_rd_atomic` as
    /// initiator, `max_dest_rd_atomic` as responder).
    pub(crate) fn query_rd_atomic(&self) -> Result<(u8, u8)> {
        let mut attr = Self::zeroed_attr();
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = sys::IBV_QP_MAX_QP_RD_ATOMIC | sys::IBV_QP_MAX_DEST_RD_ATOMIC;
        // SAFETY: a live QP and initialised out-structs.
        let rc =
            unsafe { (self.pd.ctx.v.ibv_query_qp)(self.qp, &mut attr, mask as i32, &mut init) };
        if rc != 0 {
            return Err(errno_err("ibv_query_qp", rc));
        }
        Ok((attr.max_rd_atomic, attr.max_dest_rd_atomic))
    }
}
