//! Protection domains, memory regions and memory windows on verbs.

use super::{os_err, qp, VerbsContext, VerbsCqHandle};
use crate::fabric::provider::{provider_cq, CqOps, MrOps, PdOps, QpOps};
use crate::fabric::{AccessFlags, QpConfig};
use crate::{Error, Result};
use rdmapool_sys as sys;
use std::any::Any;
use std::sync::Arc;

/// A protection domain.
pub(crate) struct VerbsPd {
    pub(crate) ctx: Arc<VerbsContext>,
    pub(crate) pd: *mut sys::ibv_pd,
}

// SAFETY: a verbs handle; rdma-core allows use from any thread.
unsafe impl Send for VerbsPd {}
// SAFETY: as above.
unsafe impl Sync for VerbsPd {}

impl Drop for VerbsPd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc to this PD, so none is alive.
        unsafe { (self.ctx.v.ibv_dealloc_pd)(self.pd) };
    }
}

pub(crate) fn ibv_access(a: AccessFlags) -> u32 {
    let mut f = 0;
    for (ours, theirs) in [
        (AccessFlags::LOCAL_WRITE, sys::IBV_ACCESS_LOCAL_WRITE),
        (AccessFlags::REMOTE_WRITE, sys::IBV_ACCESS_REMOTE_WRITE),
        (AccessFlags::REMOTE_READ, sys::IBV_ACCESS_REMOTE_READ),
        (AccessFlags::REMOTE_ATOMIC, sys::IBV_ACCESS_REMOTE_ATOMIC),
        (AccessFlags::ON_DEMAND, sys::IBV_ACCESS_ON_DEMAND),
        (AccessFlags::MW_BIND, sys::IBV_ACCESS_MW_BIND),
    ] {
        if a.contains(ours) {
            f |= theirs;
        }
    }
    f
}

impl VerbsPd {
    fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: bool,
    ) -> Result<Box<dyn MrOps>> {
        self.ctx.info.check_registration(len, access)?;
        // SAFETY: a live PD; the caller keeps the range mapped while the MR lives.
        let mr =
            unsafe { sys::ibv_reg_mr(self.ctx.v, self.pd, addr.cast(), len, ibv_access(access)) };
        if mr.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(errno @ (libc::ENOMEM | libc::EAGAIN | libc::EPERM)) => Error::MemlockLimit {
                    requested: len,
                    limit: crate::os::pin::memlock_limit_text(),
                    errno,
                },
                _ => Error::Sys {
                    call: "ibv_reg_mr",
                    source: e,
                },
            });
        }
        self.ctx
            .live_mrs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a live MR.
        let lkey = unsafe { (*mr).lkey };
        self.ctx.mrs_by_lkey.write().insert(lkey, mr as usize);
        Ok(Box::new(VerbsMr {
            pd: self.clone(),
            mr,
            access,
            owned: owned.then_some((addr, len)),
        }))
    }
}

/// A protection domain as the provider interface sees it.
pub(crate) struct PdHandle(pub(crate) Arc<VerbsPd>);

impl std::ops::Deref for PdHandle {
    type Target = VerbsPd;
    fn deref(&self) -> &VerbsPd {
        &self.0
    }
}

impl PdOps for PdHandle {
    fn device_name(&self) -> String {
        self.ctx.info.name.clone()
    }

    fn alloc_mw(&self) -> Result<Box<dyn crate::fabric::provider::MwOps>> {
        // SAFETY: a live PD.
        let mw = unsafe { sys::ibv_alloc_mw(self.pd, sys::IBV_MW_TYPE_2) };
        if mw.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::ENOSYS) => Error::Unsupported(format!(
                    "device {} has no type-2 memory windows (ibv_alloc_mw: {e})",
                    self.ctx.info.name
                )),
                _ => Error::Sys {
                    call: "ibv_alloc_mw",
                    source: e,
                },
            });
        }
        Ok(Box::new(VerbsMw {
            pd: self.0.clone(),
            mw,
            // SAFETY: a live window.
            rkey: std::sync::atomic::AtomicU32::new(unsafe { (*mw).rkey }),
        }))
    }

    fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Box<dyn MrOps>> {
        self.ctx.info.check_registration(len, access)?; // before mapping anything
                                                        // SAFETY: an anonymous private mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap"));
        }
        let r = self.0.register(p.cast(), len, access, true);
        if r.is_err() {
            // SAFETY: the mapping made above, never registered.
            unsafe { libc::munmap(p, len) };
        }
        r
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        self.0.register(addr, len, access, false)
    }

    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        cfg: &QpConfig,
    ) -> Result<Box<dyn QpOps>> {
        let verbs_cq = |c| provider_cq::<VerbsCqHandle>(c, "verbs").map(|h| h.0.clone());
        qp::VerbsQp::create(self.0.clone(), verbs_cq(send_cq)?, verbs_cq(recv_cq)?, cfg)
    }
}

/// A registration; dropping it deregisters (and unmaps memory it owns).
struct VerbsMr {
    pd: Arc<VerbsPd>,
    mr: *mut sys::ibv_mr,
    access: AccessFlags,
    owned: Option<(*mut u8, usize)>,
}

// SAFETY: a verbs handle plus a mapping we own; usable from any thread.
unsafe impl Send for VerbsMr {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for VerbsMr {}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        self.pd.ctx.mrs_by_lkey.write().remove(&self.lkey());
        // SAFETY: registered once, deregistered once.
        let rc = unsafe { (self.pd.ctx.v.ibv_dereg_mr)(self.mr) };
        if rc != 0 {
            // rxe refuses (EINVAL) while memory windows are bound to the region (IBA
            // 10.6.7.2.6): the device can still write the pages through them, so memory we
            // own is left mapped (leaked) rather than handed back for reuse.
            tracing::error!(
                lkey = self.lkey(),
                errno = rc,
                "ibv_dereg_mr failed (memory windows still bound?); the region's memory stays \
                 reachable by the device and is not reused"
            );
        } else if let Some((p, len)) = self.owned {
            // SAFETY: our own mapping; the device stopped using it when dereg returned.
            unsafe { libc::munmap(p.cast(), len) };
        }
        self.pd
            .ctx
            .live_mrs
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl MrOps for VerbsMr {
    fn addr(&self) -> u64 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).addr as u64 }
    }
    fn len(&self) -> usize {
        // SAFETY: a live MR.
        unsafe { (*self.mr).length }
    }
    fn lkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).rkey }
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
}

/// A type-2 memory window. verbs leaves its `rkey` to the application after a bind through
/// a work request, so the current one is kept here.
pub(crate) struct VerbsMw {
    pd: Arc<VerbsPd>,
    pub(crate) mw: *mut sys::ibv_mw,
    pub(crate) rkey: std::sync::atomic::AtomicU32,
}

// SAFETY: a verbs handle, used from any thread by rdma-core's rules.
unsafe impl Send for VerbsMw {}
// SAFETY: as above; the rkey is atomic.
unsafe impl Sync for VerbsMw {}

impl Drop for VerbsMw {
    fn drop(&mut self) {
        // SAFETY: allocated once, deallocated once; the PD outlives it (Arc held).
        unsafe { sys::ibv_dealloc_mw(self.mw) };
        let _ = &self.pd;
    }
}

impl crate::fabric::provider::MwOps for VerbsMw {
    fn rkey(&self) -> u32 {
        self.rkey.load(std::sync::atomic::Ordering::Acquire)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
