//! The setup-path ports: port and device queries, registration, memory advice, rkeys, and the
//! RDMA CM address accessors.

use super::*;

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
