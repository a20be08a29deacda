//! Posting without allocation: send, receive and memory-window bind work requests built in
//! stack arrays (`CHUNK` per doorbell), recorded in the QP's work log under the queue's lock
//! so a queue holds exactly its configured depth.

use super::VerbsQp;
use crate::fabric::provider::{BindSpec, MwOps, QpOps};
use crate::fabric::{QpState, RecvWr, SendWr, WcOpcode, WindowError, WrOp};
use crate::{errno_err, ibv_access, VerbsMw};
use crate::{Error, Result};
use rdmapool_sys as sys;

/// Work requests handed to the device per doorbell.
const CHUNK: usize = 16;
/// Most SGEs per work request this layer stages on the stack.
use crate::fabric::MAX_SGE;

impl VerbsQp {
    /// Posts the bind `b` of `mw` (a verbs window); returns the window's new rkey.
    #[inline]
    pub(super) fn post_bind(&self, mw: &dyn MwOps, b: &BindSpec) -> Result<u32> {
        let mw = mw
            .as_any()
            .downcast_ref::<VerbsMw>()
            .ok_or_else(|| Error::Mismatch("a verbs QP binds verbs memory windows".into()))?;
        // The region the lkey names; a dead key gets a bind error completion from the device
        // on rxe, but verbs needs the `ibv_mr` itself, so it is refused here.
        // Held until the bind is posted: a region's drop removes it from this table before
        // deregistering, so the `ibv_mr` stays valid while we use it.
        let mrs = self.pd.ctx.mrs_by_lkey.read();
        let Some(mr) = mrs.get(&b.lkey).copied() else {
            return Err(WindowError::RegionGone { lkey: b.lkey }.into());
        };
        let mr = mr as *mut sys::ibv_mr;
        // SAFETY: `mr` is the live registration behind `b.lkey`: it is in the table, whose
        // read lock we hold, so it cannot be deregistered under us; its `pd` field is set by
        // rdma-core and never changes.
        let mr_pd = unsafe { (*mr).pd };
        if mr_pd != self.pd.pd {
            // rxe 6.1 binds it anyway; the IB spec and the soft provider refuse it.
            return Err(WindowError::RegionOfAnotherPd { lkey: b.lkey }.into());
        }
        let rkey = sys::ibv_inc_rkey(mw.rkey.load(std::sync::atomic::Ordering::Acquire));
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero integers).
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = b.wr_id;
        w.opcode = sys::IBV_WR_BIND_MW;
        w.send_flags = if b.signaled {
            sys::IBV_SEND_SIGNALED
        } else {
            0
        };
        w.__bindgen_anon_2 = sys::ibv_send_wr__bindgen_ty_4 {
            bind_mw: sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                mw: mw.mw,
                rkey,
                bind_info: sys::ibv_mw_bind_info {
                    mr,
                    addr: b.addr,
                    length: b.len,
                    mw_access_flags: ibv_access(b.access),
                },
            },
        };
        let mut sq = self.log.send();
        if sq.room() == 0 {
            return Err(self.queue_full("send"));
        }
        let before = sq.len();
        sq.push(b.wr_id, WcOpcode::BindMw, b.signaled);
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP and one initialised work request naming a live window and a live
        // region (in the context's table, whose read lock `mrs` holds until here).
        let rc = unsafe { sys::ibv_post_send(self.qp, &mut w, &mut bad) };
        drop(mrs);
        if rc != 0 {
            sq.truncate(before);
            return Err(self.post_error(rc, "send"));
        }
        mw.rkey.store(rkey, std::sync::atomic::Ordering::Release);
        // The provider names the window's current key in the next bind's work request (rxe
        // refuses a bind whose `ibv_mw.rkey` is not the kernel's, so a bind after an
        // invalidate failed); verbs leaves updating it to the application.
        // SAFETY: our own live window; rdma-core reads `rkey` only while posting a bind of
        // it, and binds of one window are serialised by the fabric layer's window table
        // (held across this call).
        unsafe { (*mw.mw).rkey = rkey };
        Ok(rkey)
    }

    /// Whether `wr` may go inline: a SEND or WRITE of 1 to `max_inline` bytes.
    #[inline]
    fn inline_candidate(&self, wr: &SendWr<'_>) -> bool {
        let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        matches!(wr.op, WrOp::Send { .. } | WrOp::Write { .. })
            && total > 0
            && total <= u64::from(self.max_inline)
    }

    /// Posts `wrs` in chunks of `CHUNK` (one doorbell each). Small SENDs and WRITEs go
    /// inline when every piece lies inside a live registration of this QP's PD: the
    /// provider then copies the bytes at posting, so the range must be readable memory,
    /// which a live registration guarantees; any other piece is left to the device's own
    /// key and bounds check, as without inline data.
    #[inline]
    pub(super) fn post_sends(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        use std::mem::MaybeUninit;
        for chunk in wrs.chunks(CHUNK) {
            // Held until the chunk is posted: no region of an inline piece is deregistered
            // (nor its memory unmapped) while the provider copies from it.
            let mrs = (self.max_inline > 0 && chunk.iter().any(|w| self.inline_candidate(w)))
                .then(|| self.pd.ctx.mrs_by_lkey.read());
            // Only the entries used are written (zeroing whole arrays per post is measurable).
            let mut ibv = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; CHUNK];
            let mut sges = [const { [MaybeUninit::<sys::ibv_sge>::uninit(); MAX_SGE] }; CHUNK];
            for (i, wr) in chunk.iter().enumerate() {
                // fabric::Qp checked the count against max_sge (<= MAX_SGE, the array size).
                debug_assert!(wr.sg_list.len() <= MAX_SGE);
                for (d, s) in sges[i].iter_mut().zip(wr.sg_list) {
                    d.write(sys::ibv_sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    });
                }
                // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero integers).
                let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                w.wr_id = wr.wr_id;
                w.sg_list = sges[i].as_mut_ptr().cast();
                w.num_sge = wr.sg_list.len() as i32;
                w.send_flags = if wr.signaled {
                    sys::IBV_SEND_SIGNALED
                } else {
                    0
                };
                if let Some(mrs) = &mrs {
                    let registered = |s: &crate::fabric::Sge| {
                        mrs.get(&s.lkey).is_some_and(|&mr| {
                            let mr = mr as *const sys::ibv_mr;
                            // SAFETY: a live registration: it is in the table, whose read
                            // lock we hold, and a region leaves the table before it is
                            // deregistered. Its `pd`, `addr` and `length` never change.
                            let (pd, start, len) =
                                unsafe { ((*mr).pd, (*mr).addr as u64, (*mr).length as u64) };
                            // Another PD's region is the device's to refuse (a local error),
                            // as without inline data.
                            pd == self.pd.pd
                                && s.addr >= start
                                && s.addr
                                    .checked_add(u64::from(s.length))
                                    .is_some_and(|end| end <= start + len)
                        })
                    };
                    if self.inline_candidate(wr) && wr.sg_list.iter().all(registered) {
                        w.send_flags |= sys::IBV_SEND_INLINE;
                    }
                }
                let imm = |w: &mut sys::ibv_send_wr, v: u32| {
                    w.__bindgen_anon_1 = sys::ibv_send_wr__bindgen_ty_1 {
                        imm_data: v.to_be(),
                    }
                };
                let rdma = |remote: crate::fabric::RemoteAddr| sys::ibv_send_wr__bindgen_ty_2 {
                    rdma: sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    },
                };
                let atomic = |remote: crate::fabric::RemoteAddr, compare_add, swap| {
                    sys::ibv_send_wr__bindgen_ty_2 {
                        atomic: sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                            remote_addr: remote.addr,
                            compare_add,
                            swap,
                            rkey: remote.rkey,
                        },
                    }
                };
                match wr.op {
                    WrOp::Send { imm: None } => w.opcode = sys::IBV_WR_SEND,
                    WrOp::Send { imm: Some(v) } => {
                        w.opcode = sys::IBV_WR_SEND_WITH_IMM;
                        imm(&mut w, v);
                    }
                    WrOp::Write { remote, imm: None } => {
                        w.opcode = sys::IBV_WR_RDMA_WRITE;
                        w.wr = rdma(remote);
                    }
                    WrOp::Write {
                        remote,
                        imm: Some(v),
                    } => {
                        w.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
                        imm(&mut w, v);
                        w.wr = rdma(remote);
                    }
                    WrOp::Read { remote } => {
                        w.opcode = sys::IBV_WR_RDMA_READ;
                        w.wr = rdma(remote);
                    }
                    WrOp::CompareSwap {
                        remote,
                        compare,
                        swap,
                    } => {
                        w.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
                        w.wr = atomic(remote, compare, swap);
                    }
                    WrOp::FetchAdd { remote, add } => {
                        w.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
                        w.wr = atomic(remote, add, 0);
                    }
                    WrOp::LocalInvalidate { rkey } => {
                        w.opcode = sys::IBV_WR_LOCAL_INV;
                        w.__bindgen_anon_1 = sys::ibv_send_wr__bindgen_ty_1 {
                            invalidate_rkey: rkey,
                        };
                    }
                }
                ibv[i].write(w);
            }
            // Record and post under the queue's lock: exactly `max_send_wr` outstanding.
            let mut sq = self.log.send();
            let fit = chunk.len().min(sq.room());
            if fit == 0 {
                return Err(self.queue_full("send"));
            }
            let before = sq.len();
            for w in &chunk[..fit] {
                sq.push(w.wr_id, w.op.completion_opcode(), w.signaled);
            }
            let base: *mut sys::ibv_send_wr = ibv.as_mut_ptr().cast();
            for i in 1..fit {
                // SAFETY: entries 0..chunk.len() were written above; `next` links them.
                unsafe { (*base.add(i - 1)).next = base.add(i) };
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: a live QP; the first `fit` entries are initialised and chained (the
            // last one's `next` is null), and they and their SGE arrays live on this stack
            // frame for the call (the device copies work requests at post time). The pieces
            // of inline entries lie inside registrations that `mrs` (read-locked until after
            // the call) keeps live, so in mapped memory the provider may copy from.
            let rc = unsafe { sys::ibv_post_send(self.qp, base, &mut bad) };
            drop(mrs);
            if rc != 0 {
                // Requests from `bad` on were not posted (none, if it is not set).
                let posted = if bad.is_null() {
                    0
                } else {
                    // SAFETY: a non-null `bad` points at one of the entries we chained.
                    unsafe { bad.offset_from(base) }.clamp(0, fit as isize) as usize
                };
                sq.truncate(before + posted);
                return Err(self.post_error(rc, "send"));
            }
            if fit < chunk.len() {
                return Err(self.queue_full("send"));
            }
        }
        Ok(())
    }

    /// Posts `wrs` in chunks of `CHUNK` (one doorbell each).
    #[inline]
    pub(super) fn post_recvs(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        for chunk in wrs.chunks(CHUNK) {
            // SAFETY: all-zero ibv_recv_wr / ibv_sge values are valid plain data.
            let mut ibv: [sys::ibv_recv_wr; CHUNK] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut sges: [[sys::ibv_sge; MAX_SGE]; CHUNK] = unsafe { std::mem::zeroed() };
            for (i, wr) in chunk.iter().enumerate() {
                // fabric::Qp checked the count against max_sge (<= MAX_SGE, the array size).
                debug_assert!(wr.sg_list.len() <= MAX_SGE);
                for (d, s) in sges[i].iter_mut().zip(wr.sg_list) {
                    *d = sys::ibv_sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    };
                }
                ibv[i].wr_id = wr.wr_id;
                ibv[i].sg_list = sges[i].as_mut_ptr();
                ibv[i].num_sge = wr.sg_list.len() as i32;
            }
            for i in 1..chunk.len() {
                let next: *mut sys::ibv_recv_wr = &mut ibv[i];
                ibv[i - 1].next = next;
            }
            let mut rq = self.log.recv();
            let fit = chunk.len().min(rq.room());
            if fit == 0 {
                return Err(self.queue_full("receive"));
            }
            let before = rq.len();
            for w in &chunk[..fit] {
                rq.push(w.wr_id, WcOpcode::Recv, true);
            }
            ibv[fit - 1].next = std::ptr::null_mut();
            let mut bad = std::ptr::null_mut();
            // SAFETY: as in post_send (the first `fit` entries, chained).
            let rc = unsafe { sys::ibv_post_recv(self.qp, ibv.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                let posted = if bad.is_null() {
                    0
                } else {
                    // SAFETY: a non-null `bad` points at one of the entries we chained.
                    unsafe { bad.offset_from(ibv.as_ptr()) }.clamp(0, fit as isize) as usize
                };
                rq.truncate(before + posted);
                return Err(self.post_error(rc, "receive"));
            }
            if fit < chunk.len() {
                return Err(self.queue_full("receive"));
            }
        }
        Ok(())
    }

    fn queue_full(&self, queue: &'static str) -> Error {
        Error::QueueFull {
            queue,
            depth: if queue == "send" {
                self.capacity.send
            } else {
                self.capacity.recv
            },
        }
    }

    fn post_error(&self, rc: i32, queue: &'static str) -> Error {
        match rc {
            libc::ENOMEM => self.queue_full(queue),
            libc::EINVAL => match self.state() {
                s @ (QpState::Reset | QpState::Init | QpState::Rtr) if queue == "send" => {
                    Error::InvalidQpState {
                        qpn: self.qpn(),
                        state: s,
                        needed: "posting sends needs RTS",
                    }
                }
                _ => errno_err("ibv_post", rc),
            },
            e => errno_err("ibv_post", e),
        }
    }
}
