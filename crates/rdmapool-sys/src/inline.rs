//! Rust ports of the `static inline` functions of `infiniband/verbs.h` and `rdma/rdma_cma.h`.
//!
//! libibverbs does not export these: in C they are compiled into the caller. The data-path
//! verbs dispatch through the function pointers a provider (mlx5, rxe, ...) installs in
//! `context->ops`; the extended verbs go through the `struct verbs_context` that surrounds an
//! extended `ibv_context`. Each port follows the rdma-core 44 header statement for statement;
//! the header's code is quoted in each function's documentation.
//!
//! One deliberate difference: where C would call through a NULL `ops` slot (undefined
//! behaviour; libibverbs never leaves one NULL, it fills unimplemented ops with its "dummy"
//! ops), the port returns what libibverbs' dummy op returns, `EOPNOTSUPP`, without touching the
//! other arguments.

use std::ffi::{c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::ptr;

use crate::bindings::*;
use crate::Verbs;

/// `__VERBS_ABI_IS_EXTENDED` (`(void *)UINTPTR_MAX`): the value of `ibv_context::abi_compat`
/// that marks the context as the last member of a `struct verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = ptr::without_provenance_mut(usize::MAX);

/// `EOPNOTSUPP`, the value libibverbs' dummy ops (and the extended inlines) return for an
/// operation the provider does not implement.
const EOPNOTSUPP: c_int = libc::EOPNOTSUPP;

/// Port of `verbs_get_ctx`:
///
/// ```c
/// if (ctx->abi_compat != __VERBS_ABI_IS_EXTENDED)
///         return NULL;
/// return (struct verbs_context *)(((uint8_t *)ctx) - offsetof(struct verbs_context, context));
/// ```
///
/// The result may point *before* the start of the provider's allocation: `verbs_context`
/// grows at its front, and a provider built against older headers allocates a smaller one
/// (its `sz` field says how big). So never read it as a whole `verbs_context` (no references
/// to it); read fields with [`verbs_get_ctx_op!`](crate::verbs_get_ctx_op), which checks `sz` first as C does. The
/// pointer is computed with wrapping arithmetic, so holding it is always defined.
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context` (one from `ibv_open_device`, or one laid out the
/// same way).
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: the caller guarantees `ctx` points to a live ibv_context; `abi_compat` is one
    // of its fields, read by value without creating a reference.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return ptr::null_mut();
    }
    ctx.wrapping_byte_sub(offset_of!(verbs_context, context))
        .cast::<verbs_context>()
}

/// Reads one field of a `verbs_context` through a pointer from [`verbs_get_ctx`], by
/// address arithmetic from the embedded context (never by projecting through `*vctx`, whose
/// start may lie outside the allocation). `_field` is only used to infer the field's type: it
/// is never called.
///
/// # Safety
///
/// `vctx` must come from [`verbs_get_ctx`] on a live extended context, and the field at
/// `offset` must be inside the provider's `verbs_context` (for `sz`, always; for an op, only
/// once `sz` says so).
#[doc(hidden)]
pub unsafe fn __vctx_read<F: Copy>(
    vctx: *const verbs_context,
    offset: usize,
    _field: fn(&verbs_context) -> &F,
) -> F {
    // SAFETY: per the contract, `vctx + offset` lies inside the live verbs_context the
    // context is embedded in (the pointer carries the context allocation's provenance), is
    // aligned like the field (verbs_context is repr(C)), and holds a valid `F`.
    unsafe { vctx.wrapping_byte_add(offset).cast::<F>().read() }
}

/// Port of the `verbs_get_ctx_op(ctx, op)` macro, returning the op itself.
///
/// ```c
/// #define verbs_get_ctx_op(ctx, op) ({ \
///         struct verbs_context *__vctx = verbs_get_ctx(ctx); \
///         (!__vctx || (__vctx->sz < sizeof(*__vctx) - offsetof(struct verbs_context, op)) || \
///          !__vctx->op) ? NULL : __vctx; })
/// ```
///
/// C returns the `verbs_context` (or NULL) and the caller then reads `vctx->op`; this returns
/// `Option<fn>`: `None` exactly where C returns NULL, otherwise `Some(vctx->op)`.
///
/// Must be used inside `unsafe`: `$ctx` must point to a live `ibv_context`.
///
/// ```
/// use rdmapool_sys::{ibv_context, verbs_get_ctx_op};
/// # let ctx: *mut ibv_context = std::ptr::null_mut();
/// # if !ctx.is_null() {
/// // SAFETY: `ctx` is a live context from ibv_open_device.
/// let query_port = unsafe { verbs_get_ctx_op!(ctx, query_port) };
/// # }
/// ```
#[macro_export]
macro_rules! verbs_get_ctx_op {
    ($ctx:expr, $op:ident) => {{
        let __vctx = $crate::verbs_get_ctx($ctx);
        if __vctx.is_null() {
            ::core::option::Option::None
        } else if $crate::__vctx_read(
            __vctx,
            ::core::mem::offset_of!($crate::verbs_context, sz),
            |__v| &__v.sz,
        ) < ::core::mem::size_of::<$crate::verbs_context>()
            - ::core::mem::offset_of!($crate::verbs_context, $op)
        {
            ::core::option::Option::None
        } else {
            $crate::__vctx_read(
                __vctx,
                ::core::mem::offset_of!($crate::verbs_context, $op),
                |__v| &__v.$op,
            )
        }
    }};
}

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

/// The compat `ibv_query_port` export's type (the fallback of [`ibv_query_port`]).
pub(crate) type CompatQueryPort =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int;

/// Port of `___ibv_query_port`, which the `ibv_query_port` macro expands to:
///
/// ```c
/// struct verbs_context *vctx = verbs_get_ctx_op(context, query_port);
/// if (!vctx) {
///         int rc;
///         memset(port_attr, 0, sizeof(*port_attr));
///         rc = ibv_query_port(context, port_num, (struct _compat_ibv_port_attr *)port_attr);
///         return rc;
/// }
/// return vctx->query_port(context, port_num, port_attr, sizeof(*port_attr));
/// ```
///
/// `verbs` supplies the exported compat `ibv_query_port` for the fallback.
///
/// # Safety
///
/// `context` must be a live context and `port_attr` must point to writable memory for one
/// `ibv_port_attr`.
pub unsafe fn ibv_query_port(
    verbs: &Verbs,
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded from this function's contract; `verbs.ibv_query_port` is the compat
    // export with the prototype `CompatQueryPort`.
    unsafe { query_port_with(verbs.ibv_query_port, context, port_num, port_attr) }
}

/// [`ibv_query_port`] with the compat fallback passed in (so tests can supply a fake).
///
/// # Safety
///
/// As [`ibv_query_port`]; `compat` must behave like the compat export.
pub(crate) unsafe fn query_port_with(
    compat: CompatQueryPort,
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: `context` is a live context (caller).
    match unsafe { verbs_get_ctx_op!(context, query_port) } {
        None => {
            // SAFETY: `port_attr` is writable for one ibv_port_attr (caller); all-zero bytes
            // are a valid ibv_port_attr (integers only).
            unsafe { ptr::write_bytes(port_attr, 0, 1) };
            // SAFETY: a live context and the caller's zeroed ibv_port_attr, cast as the header
            // casts it: `struct _compat_ibv_port_attr` is an incomplete type in verbs.h, and
            // the compat export writes only a prefix (the pre-extension layout) of it.
            unsafe { compat(context, port_num, port_attr.cast()) }
        }
        // SAFETY: the provider's extended op, present and inside its verbs_context (checked by
        // the macro); it writes at most `sizeof(ibv_port_attr)` bytes to `port_attr`.
        Some(query_port) => unsafe {
            query_port(context, port_num, port_attr, size_of::<ibv_port_attr>())
        },
    }
}

/// Port of `ibv_query_device_ex`: device attributes including ODP capabilities
/// (`odp_caps`), falling back to `ibv_query_device` when the provider has no extended query.
///
/// ```c
/// if (input && input->comp_mask)
///         return EINVAL;
/// vctx = verbs_get_ctx_op(context, query_device_ex);
/// if (!vctx)
///         goto legacy;
/// ret = vctx->query_device_ex(context, input, attr, sizeof(*attr));
/// if (ret == EOPNOTSUPP || ret == ENOSYS)
///         goto legacy;
/// return ret;
/// legacy:
/// memset(attr, 0, sizeof(*attr));
/// ret = ibv_query_device(context, &attr->orig_attr);
/// return ret;
/// ```
///
/// # Safety
///
/// `context` must be a live context, `input` NULL or valid, `attr` writable for one
/// `ibv_device_attr_ex`.
pub unsafe fn ibv_query_device_ex(
    verbs: &Verbs,
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: `input` is NULL or valid (caller); read by value.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: `context` is a live context (caller).
    if let Some(query_device_ex) = unsafe { verbs_get_ctx_op!(context, query_device_ex) } {
        // SAFETY: the provider's extended op (present, checked by the macro); `attr` is
        // writable for `sizeof(ibv_device_attr_ex)` bytes (caller).
        let ret = unsafe { query_device_ex(context, input, attr, size_of::<ibv_device_attr_ex>()) };
        if ret != EOPNOTSUPP && ret != libc::ENOSYS {
            return ret;
        }
    }
    // legacy:
    // SAFETY: `attr` is writable (caller); all-zero bytes are a valid ibv_device_attr_ex
    // (integers and arrays of integers only).
    unsafe { ptr::write_bytes(attr, 0, 1) };
    // SAFETY: the exported ibv_query_device with a live context and a pointer to the
    // `orig_attr` field of the caller's writable `attr` (no reference created).
    unsafe { (verbs.ibv_query_device)(context, &raw mut (*attr).orig_attr) }
}

/// Port of `ibv_advise_mr`: e.g. prefetch (`IBV_ADVISE_MR_ADVICE_PREFETCH*`) pages of an ODP
/// (`IBV_ACCESS_ON_DEMAND`) memory region.
///
/// ```c
/// vctx = verbs_get_ctx_op(pd->context, advise_mr);
/// if (!vctx)
///         return EOPNOTSUPP;
/// return vctx->advise_mr(pd, advice, flags, sg_list, num_sge);
/// ```
///
/// # Safety
///
/// `pd` must be a live PD and `sg_list` must point to `num_sge` valid SGEs.
pub unsafe fn ibv_advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: `pd` is live (caller), so `pd->context` is a live context.
    match unsafe { verbs_get_ctx_op!((*pd).context, advise_mr) } {
        None => EOPNOTSUPP,
        // SAFETY: the provider's extended op (present, checked by the macro), called with
        // the caller's arguments.
        Some(advise_mr) => unsafe { advise_mr(pd, advice, flags, sg_list, num_sge) },
    }
}

/// Port of the `ibv_reg_mr` macro and the `__ibv_reg_mr` inline it expands to:
///
/// ```c
/// if (is_access_const && (access & IBV_ACCESS_OPTIONAL_RANGE) == 0)
///         return ibv_reg_mr(pd, addr, length, (int)access);
/// else
///         return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, access);
/// ```
///
/// `is_access_const` is `__builtin_constant_p(...)`, which Rust has no equivalent of; the port
/// takes the branch a constant `access` takes (both branches register identically:
/// libibverbs' `ibv_reg_mr` itself calls `ibv_reg_mr_iova2` with `iova = addr`). Returns NULL
/// with `errno` set on failure.
///
/// # Safety
///
/// `pd` must be a live PD; `addr..addr + length` must be memory the caller keeps mapped (and,
/// unless `IBV_ACCESS_ON_DEMAND`, pinned by the registration) until the MR is deregistered.
pub unsafe fn ibv_reg_mr(
    verbs: &Verbs,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    if access & crate::IBV_ACCESS_OPTIONAL_RANGE == 0 {
        // SAFETY: the exported ibv_reg_mr with the caller's arguments (contract above).
        unsafe { (verbs.ibv_reg_mr)(pd, addr, length, access as c_int) }
    } else {
        // SAFETY: the exported ibv_reg_mr_iova2 with the caller's arguments (contract above).
        unsafe { (verbs.ibv_reg_mr_iova2)(pd, addr, length, addr as usize as u64, access) }
    }
}

/// Port of the `ibv_reg_mr_iova` macro and `__ibv_reg_mr_iova`: registers memory that the
/// device addresses as `iova` (instead of its virtual address).
///
/// ```c
/// if (is_access_const && (access & IBV_ACCESS_OPTIONAL_RANGE) == 0)
///         return ibv_reg_mr_iova(pd, addr, length, iova, (int)access);
/// else
///         return ibv_reg_mr_iova2(pd, addr, length, iova, access);
/// ```
///
/// # Safety
///
/// As [`ibv_reg_mr`].
pub unsafe fn ibv_reg_mr_iova(
    verbs: &Verbs,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    if access & crate::IBV_ACCESS_OPTIONAL_RANGE == 0 {
        // SAFETY: the exported ibv_reg_mr_iova with the caller's arguments (contract above).
        unsafe { (verbs.ibv_reg_mr_iova)(pd, addr, length, iova, access as c_int) }
    } else {
        // SAFETY: the exported ibv_reg_mr_iova2 with the caller's arguments (contract above).
        unsafe { (verbs.ibv_reg_mr_iova2)(pd, addr, length, iova, access) }
    }
}

/// Port of `ibv_inc_rkey`: the next rkey with the same index and the low 8 "key" bits
/// incremented (for memory-window rebinding).
///
/// ```c
/// const uint32_t mask = 0x000000ff;
/// uint8_t newtag = (uint8_t)((rkey + 1) & mask);
/// return (rkey & ~mask) | newtag;
/// ```
pub const fn ibv_inc_rkey(rkey: u32) -> u32 {
    let mask: u32 = 0x0000_00ff;
    let newtag = (rkey.wrapping_add(1) & mask) as u8;
    (rkey & !mask) | newtag as u32
}

/// Port of `rdma_get_local_addr` (`rdma/rdma_cma.h`): `return &id->route.addr.src_addr;`
///
/// # Safety
///
/// `id` must point to a live `rdma_cm_id`.
pub unsafe fn rdma_get_local_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: `id` is live (caller); this only computes a field address (no read, no
    // reference), like C's `&id->...`.
    unsafe { (&raw mut (*id).route.addr.__bindgen_anon_1.src_addr).cast() }
}

/// Port of `rdma_get_peer_addr` (`rdma/rdma_cma.h`): `return &id->route.addr.dst_addr;`
///
/// # Safety
///
/// `id` must point to a live `rdma_cm_id`.
pub unsafe fn rdma_get_peer_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: as in `rdma_get_local_addr`.
    unsafe { (&raw mut (*id).route.addr.__bindgen_anon_2.dst_addr).cast() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static COMPAT_CALLS: Cell<u32> = const { Cell::new(0) };
    }

    unsafe extern "C" fn fake_compat_query_port(
        _context: *mut ibv_context,
        port_num: u8,
        attr: *mut _compat_ibv_port_attr,
    ) -> c_int {
        COMPAT_CALLS.with(|c| c.set(c.get() + 1));
        // SAFETY: the port passes the caller's ibv_port_attr, cast as the header casts it.
        unsafe { (*attr.cast::<ibv_port_attr>()).lid = 0x1234 };
        c_int::from(port_num) + 100
    }

    unsafe extern "C" fn fake_query_port(
        _context: *mut ibv_context,
        port_num: u8,
        attr: *mut ibv_port_attr,
        len: usize,
    ) -> c_int {
        assert_eq!(len, size_of::<ibv_port_attr>());
        // SAFETY: the test passes a pointer to a live ibv_port_attr.
        unsafe { (*attr).active_mtu = IBV_MTU_4096 };
        c_int::from(port_num) + 200
    }

    /// A heap verbs_context and a pointer to its embedded context that carries the whole
    /// allocation's provenance (so reading `sz` and the ops before it is in bounds).
    fn fake_vctx(extended: bool, sz: usize) -> (*mut verbs_context, *mut ibv_context) {
        let mut v = Box::<verbs_context>::default();
        v.sz = sz;
        v.context.abi_compat = if extended {
            VERBS_ABI_IS_EXTENDED
        } else {
            ptr::null_mut()
        };
        v.query_port = Some(fake_query_port);
        let vp = Box::into_raw(v);
        // SAFETY: `vp` is a live allocation; only a field address is computed.
        let ctx = unsafe { &raw mut (*vp).context };
        (vp, ctx)
    }

    fn free(vp: *mut verbs_context) {
        // SAFETY: `vp` came from Box::into_raw in fake_vctx and is freed once.
        drop(unsafe { Box::from_raw(vp) });
    }

    #[test]
    fn query_port_uses_the_extended_op_when_sz_covers_it() {
        let (vp, ctx) = fake_vctx(true, size_of::<verbs_context>());
        let mut attr = ibv_port_attr::default();
        // SAFETY: ctx is a live fake context; attr is writable.
        let rc = unsafe { query_port_with(fake_compat_query_port, ctx, 1, &mut attr) };
        assert_eq!(rc, 201);
        assert_eq!(attr.active_mtu, IBV_MTU_4096);
        assert_eq!(COMPAT_CALLS.with(Cell::get), 0);
        free(vp);
    }

    #[test]
    fn query_port_falls_back_to_the_compat_export() {
        // Not extended at all.
        let (vp, ctx) = fake_vctx(false, size_of::<verbs_context>());
        let mut attr = ibv_port_attr {
            active_mtu: IBV_MTU_1024,
            ..Default::default()
        };
        // SAFETY: as above.
        let rc = unsafe { query_port_with(fake_compat_query_port, ctx, 2, &mut attr) };
        assert_eq!(rc, 102);
        assert_eq!(attr.lid, 0x1234);
        assert_eq!(
            attr.active_mtu, 0,
            "the port memsets port_attr first, as C does"
        );
        free(vp);

        // Extended, but the provider's verbs_context predates the query_port field.
        let too_small = size_of::<verbs_context>() - offset_of!(verbs_context, query_port) - 1;
        let (vp, ctx) = fake_vctx(true, too_small);
        let mut attr = ibv_port_attr::default();
        // SAFETY: as above.
        let rc = unsafe { query_port_with(fake_compat_query_port, ctx, 3, &mut attr) };
        assert_eq!(rc, 103);
        assert_eq!(COMPAT_CALLS.with(Cell::get), 2);
        free(vp);
    }

    #[test]
    fn verbs_get_ctx_is_container_of() {
        let (vp, ctx) = fake_vctx(true, size_of::<verbs_context>());
        // SAFETY: ctx is a live fake context.
        assert_eq!(unsafe { verbs_get_ctx(ctx) }, vp);
        free(vp);
        let (vp, ctx) = fake_vctx(false, size_of::<verbs_context>());
        // SAFETY: as above.
        assert!(unsafe { verbs_get_ctx(ctx) }.is_null());
        free(vp);
    }

    #[test]
    fn inc_rkey_wraps_the_key_byte_only() {
        assert_eq!(ibv_inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(ibv_inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(ibv_inc_rkey(0xffff_ffff), 0xffff_ff00);
    }
}
