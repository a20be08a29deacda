//! The data-path ports: posting sends and receives, polling and arming CQs, memory windows.

use super::*;

/// Port of `ibv_post_send`: posts a linked list of send work requests.
///
/// ```c
/// return qp->context->ops.post_send(qp, wr, bad_wr);
/// ```
///
/// Returns 0 or an errno value; on failure `*bad_wr` points at the first request not posted.
///
/// # Safety
///
/// `qp` must be a live QP (so `qp->context` is its live context); `wr` must be a valid list
/// of work requests whose SGEs name registered memory, as the provider requires; `bad_wr`
/// must be writable.
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is live (caller), so its `context` pointer is a live context whose `ops`
    // table is read by value.
    let op = unsafe { (*(*qp).context).ops.post_send };
    match op {
        // SAFETY: the provider installed this op for this context; the arguments are the
        // caller's, passed through unchanged as in the header, under the same contract.
        Some(post_send) => unsafe { post_send(qp, wr, bad_wr) },
        None => EOPNOTSUPP,
    }
}

/// Port of `ibv_alloc_mw`: allocates a memory window of `type_` on `pd`.
///
/// ```c
/// if (!pd->context->ops.alloc_mw) { errno = EOPNOTSUPP; return NULL; }
/// return pd->context->ops.alloc_mw(pd, type);
/// ```
///
/// Returns null with `errno` set on failure (EOPNOTSUPP where the provider has no windows).
///
/// # Safety
///
/// `pd` must be a live protection domain.
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    // SAFETY: `pd` is live (caller), so `pd->context` is a live context; `ops` read by value.
    let op = unsafe { (*(*pd).context).ops.alloc_mw };
    match op {
        // SAFETY: the provider's op for this context, called with the caller's arguments.
        Some(alloc_mw) => unsafe { alloc_mw(pd, type_) },
        None => {
            // SAFETY: glibc's errno location for this thread is always valid and writable.
            unsafe { *libc::__errno_location() = EOPNOTSUPP };
            std::ptr::null_mut()
        }
    }
}

/// Port of `ibv_dealloc_mw`: deallocates a memory window.
///
/// ```c
/// return mw->context->ops.dealloc_mw(mw);
/// ```
///
/// # Safety
///
/// `mw` must be a live memory window, not used afterwards.
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: `mw` is live (caller), so `mw->context` is a live context; `ops` read by value.
    let op = unsafe { (*(*mw).context).ops.dealloc_mw };
    match op {
        // SAFETY: the provider's op for this context, called with the caller's window.
        Some(dealloc_mw) => unsafe { dealloc_mw(mw) },
        None => EOPNOTSUPP,
    }
}

/// Port of `ibv_post_recv`: posts a linked list of receive work requests.
///
/// ```c
/// return qp->context->ops.post_recv(qp, wr, bad_wr);
/// ```
///
/// # Safety
///
/// As [`ibv_post_send`]: a live `qp`, a valid `wr` list over registered memory, a writable
/// `bad_wr`.
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is live (caller), so `qp->context` is a live context; `ops` read by value.
    let op = unsafe { (*(*qp).context).ops.post_recv };
    match op {
        // SAFETY: the provider's op for this context, called with the caller's arguments.
        Some(post_recv) => unsafe { post_recv(qp, wr, bad_wr) },
        None => EOPNOTSUPP,
    }
}

/// Port of `ibv_poll_cq`: polls up to `num_entries` completions into `wc`.
///
/// ```c
/// return cq->context->ops.poll_cq(cq, num_entries, wc);
/// ```
///
/// Returns the number of completions written (0 if the CQ is empty) or a negative value on
/// error.
///
/// # Safety
///
/// `cq` must be a live CQ and `wc` must have room for `num_entries` `ibv_wc`s.
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live (caller), so `cq->context` is a live context; `ops` read by value.
    let op = unsafe { (*(*cq).context).ops.poll_cq };
    match op {
        // SAFETY: the provider's op for this context; `wc` has room for `num_entries` (caller).
        Some(poll_cq) => unsafe { poll_cq(cq, num_entries, wc) },
        None => EOPNOTSUPP,
    }
}

/// Port of `ibv_req_notify_cq`: arms the CQ to signal its completion channel on the next
/// (solicited, if `solicited_only != 0`) completion.
///
/// ```c
/// return cq->context->ops.req_notify_cq(cq, solicited_only);
/// ```
///
/// # Safety
///
/// `cq` must be a live CQ.
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: `cq` is live (caller), so `cq->context` is a live context; `ops` read by value.
    let op = unsafe { (*(*cq).context).ops.req_notify_cq };
    match op {
        // SAFETY: the provider's op for this context, called with the caller's arguments.
        Some(req_notify_cq) => unsafe { req_notify_cq(cq, solicited_only) },
        None => EOPNOTSUPP,
    }
}

/// Port of `ibv_post_srq_recv`: posts receive work requests to a shared receive queue.
///
/// ```c
/// return srq->context->ops.post_srq_recv(srq, recv_wr, bad_recv_wr);
/// ```
///
/// # Safety
///
/// `srq` must be a live SRQ; `recv_wr` a valid list over registered memory; `bad_recv_wr`
/// writable.
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is live (caller), so `srq->context` is a live context; `ops` read by value.
    let op = unsafe { (*(*srq).context).ops.post_srq_recv };
    match op {
        // SAFETY: the provider's op for this context, called with the caller's arguments.
        Some(post_srq_recv) => unsafe { post_srq_recv(srq, recv_wr, bad_recv_wr) },
        None => EOPNOTSUPP,
    }
}
