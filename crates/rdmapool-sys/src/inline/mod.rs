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

// The ports, by what they are for; declared after `verbs_get_ctx_op!` so that they can use it.
mod data_path;
mod setup;

pub use data_path::*;
pub use setup::*;

#[cfg(test)]
mod tests;
