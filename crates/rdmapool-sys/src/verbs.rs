//! The libibverbs function table.
//!
//! Symbol choices (from `nm -D /usr/lib/x86_64-linux-gnu/libibverbs.so.1`, rdma-core 44, and
//! `infiniband/verbs.h`):
//!
//! * Most functions are exported twice: `name@IBVERBS_1.0` (the pre-2006 ABI, with old struct
//!   layouts) and the default `name@@IBVERBS_1.1`. Each entry is pinned to the default version
//!   with `dlvsym`, so the table always gets the ABI these bindings describe.
//! * `ibv_reg_mr` and `ibv_reg_mr_iova` are, in C, macros around the static inlines
//!   `__ibv_reg_mr` / `__ibv_reg_mr_iova`, which call the exported `ibv_reg_mr@@IBVERBS_1.1` /
//!   `ibv_reg_mr_iova@@IBVERBS_1.7` or, when optional access flags are used,
//!   `ibv_reg_mr_iova2@@IBVERBS_1.8`. The table holds all three exports; the macro's choice is
//!   ported as [`crate::ibv_reg_mr`] / [`crate::ibv_reg_mr_iova`].
//! * `ibv_query_port` is, in C, a macro around the static inline `___ibv_query_port`, which
//!   calls the context's extended `query_port` op and falls back to the exported
//!   `ibv_query_port@@IBVERBS_1.1` (whose argument is the smaller `struct
//!   _compat_ibv_port_attr`). The table holds that export; the inline is ported as
//!   [`crate::ibv_query_port`].
//! * `ibv_get_device_list` is a macro only when `RDMA_STATIC_PROVIDERS` is defined (static
//!   linking); the dynamic library's export `ibv_get_device_list@@IBVERBS_1.1` is the real one.
//! * `ibv_create_comp_channel` / `ibv_destroy_comp_channel` only exist as `@@IBVERBS_1.0`.
//! * `IBVERBS_1.7` first shipped in rdma-core v25 and `IBVERBS_1.8` in v28 (Debian's
//!   `libibverbs1.symbols`), so the table needs rdma-core v28 or later.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::bindings::*;
use crate::loader::{self, fn_table, LibSpec, LoadError};

static LIBIBVERBS: LibSpec = LibSpec {
    package: "ibverbs-providers/libibverbs1",
    install: "Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers; \
              Fedora/RHEL: dnf install libibverbs",
};

fn_table! {
    /// The exported libibverbs functions, resolved from `libibverbs.so.1` at run time.
    ///
    /// Each field is a function pointer with the exact C prototype (checked at compile time
    /// against bindgen's declaration); call it as `(verbs.ibv_open_device)(dev)`. The library
    /// stays loaded as long as the table lives (for [`verbs()`], for the whole process).
    pub struct Verbs {
        /// `struct ibv_device **ibv_get_device_list(int *num_devices)`: NULL-terminated list
        /// of RDMA devices; NULL with `errno` set on failure (e.g. `ENOSYS` without the kernel
        /// modules).
        "IBVERBS_1.1" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
        /// `void ibv_free_device_list(struct ibv_device **list)`.
        "IBVERBS_1.1" fn ibv_free_device_list(list: *mut *mut ibv_device);
        /// `const char *ibv_get_device_name(struct ibv_device *device)`.
        "IBVERBS_1.1" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
        /// `__be64 ibv_get_device_guid(struct ibv_device *device)` (big-endian).
        "IBVERBS_1.1" fn ibv_get_device_guid(device: *mut ibv_device) -> __be64;
        /// `struct ibv_context *ibv_open_device(struct ibv_device *device)`.
        "IBVERBS_1.1" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
        /// `int ibv_close_device(struct ibv_context *context)`.
        "IBVERBS_1.1" fn ibv_close_device(context: *mut ibv_context) -> c_int;
        /// `int ibv_get_async_event(struct ibv_context *, struct ibv_async_event *)`: blocks
        /// on the context's async fd unless it was made non-blocking.
        "IBVERBS_1.1" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int;
        /// `void ibv_ack_async_event(struct ibv_async_event *event)`.
        "IBVERBS_1.1" fn ibv_ack_async_event(event: *mut ibv_async_event);
        /// `int ibv_query_device(struct ibv_context *, struct ibv_device_attr *)`.
        "IBVERBS_1.1" fn ibv_query_device(context: *mut ibv_context, device_attr: *mut ibv_device_attr) -> c_int;
        /// The exported compat `int ibv_query_port(struct ibv_context *, uint8_t, struct
        /// _compat_ibv_port_attr *)`. C code never calls it directly (the header's macro goes
        /// through `___ibv_query_port`): use [`crate::ibv_query_port`], the port of that inline.
        "IBVERBS_1.1" fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut _compat_ibv_port_attr) -> c_int;
        /// `int ibv_query_gid(struct ibv_context *, uint8_t port_num, int index, union ibv_gid *)`.
        "IBVERBS_1.1" fn ibv_query_gid(context: *mut ibv_context, port_num: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
        /// `int ibv_query_pkey(struct ibv_context *, uint8_t port_num, int index, __be16 *pkey)`.
        "IBVERBS_1.1" fn ibv_query_pkey(context: *mut ibv_context, port_num: u8, index: c_int, pkey: *mut __be16) -> c_int;
        /// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)`.
        "IBVERBS_1.1" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
        /// `int ibv_dealloc_pd(struct ibv_pd *pd)`.
        "IBVERBS_1.1" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
        /// The exported `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr, size_t length,
        /// int access)`. C callers reach it through the `ibv_reg_mr` macro; use
        /// [`crate::ibv_reg_mr`], which makes the macro's choice between this and
        /// `ibv_reg_mr_iova2`.
        "IBVERBS_1.1" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
        /// The exported `struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *, void *addr, size_t
        /// length, uint64_t iova, int access)`; see [`crate::ibv_reg_mr_iova`].
        "IBVERBS_1.7" fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr;
        /// `struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *, void *addr, size_t length,
        /// uint64_t iova, unsigned int access)`: the registration call that accepts the
        /// optional access flags (`IBV_ACCESS_RELAXED_ORDERING`).
        "IBVERBS_1.8" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_uint) -> *mut ibv_mr;
        /// `int ibv_dereg_mr(struct ibv_mr *mr)`.
        "IBVERBS_1.1" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
        /// `struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)`.
        "IBVERBS_1.0" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
        /// `int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)`.
        "IBVERBS_1.0" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
        /// `struct ibv_cq *ibv_create_cq(struct ibv_context *, int cqe, void *cq_context,
        /// struct ibv_comp_channel *channel, int comp_vector)`.
        "IBVERBS_1.1" fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq;
        /// `int ibv_resize_cq(struct ibv_cq *cq, int cqe)`.
        "IBVERBS_1.1" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int;
        /// `int ibv_destroy_cq(struct ibv_cq *cq)`.
        "IBVERBS_1.1" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
        /// `int ibv_get_cq_event(struct ibv_comp_channel *, struct ibv_cq **cq, void
        /// **cq_context)`.
        "IBVERBS_1.1" fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int;
        /// `void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)`.
        "IBVERBS_1.1" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);
        /// `struct ibv_qp *ibv_create_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`.
        "IBVERBS_1.1" fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
        /// `int ibv_modify_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask)`;
        /// `attr_mask` is an OR of `IBV_QP_*` ([`crate::ibv_qp_attr_mask`]).
        "IBVERBS_1.1" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
        /// `int ibv_query_qp(struct ibv_qp *, struct ibv_qp_attr *, int attr_mask, struct
        /// ibv_qp_init_attr *)`.
        "IBVERBS_1.1" fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int;
        /// `int ibv_destroy_qp(struct ibv_qp *qp)`.
        "IBVERBS_1.1" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
        /// `struct ibv_srq *ibv_create_srq(struct ibv_pd *, struct ibv_srq_init_attr *)`.
        "IBVERBS_1.1" fn ibv_create_srq(pd: *mut ibv_pd, srq_init_attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
        /// `int ibv_modify_srq(struct ibv_srq *, struct ibv_srq_attr *, int srq_attr_mask)`.
        "IBVERBS_1.1" fn ibv_modify_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr, srq_attr_mask: c_int) -> c_int;
        /// `int ibv_query_srq(struct ibv_srq *, struct ibv_srq_attr *)`.
        "IBVERBS_1.1" fn ibv_query_srq(srq: *mut ibv_srq, srq_attr: *mut ibv_srq_attr) -> c_int;
        /// `int ibv_destroy_srq(struct ibv_srq *srq)`.
        "IBVERBS_1.1" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
        /// `struct ibv_ah *ibv_create_ah(struct ibv_pd *, struct ibv_ah_attr *)`.
        "IBVERBS_1.1" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
        /// `int ibv_destroy_ah(struct ibv_ah *ah)`.
        "IBVERBS_1.1" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int;
        /// `int ibv_fork_init(void)`: call before registering memory in a process that forks.
        "IBVERBS_1.1" fn ibv_fork_init() -> c_int;
        /// `const char *ibv_wc_status_str(enum ibv_wc_status status)`.
        "IBVERBS_1.1" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char;
        /// `const char *ibv_event_type_str(enum ibv_event_type event)`.
        "IBVERBS_1.1" fn ibv_event_type_str(event: ibv_event_type) -> *const c_char;
        /// `const char *ibv_port_state_str(enum ibv_port_state port_state)`.
        "IBVERBS_1.1" fn ibv_port_state_str(port_state: ibv_port_state) -> *const c_char;
        /// `const char *ibv_node_type_str(enum ibv_node_type node_type)`.
        "IBVERBS_1.1" fn ibv_node_type_str(node_type: ibv_node_type) -> *const c_char;
    }
}

impl Verbs {
    /// The library [`verbs()`] opens.
    pub const SONAME: &'static str = "libibverbs.so.1";

    /// Opens `path` (normally [`Verbs::SONAME`]) and resolves every function, without caching.
    /// Dropping the table unloads the library again; most code wants [`verbs()`].
    ///
    /// # Safety
    ///
    /// `path` must name rdma-core's libibverbs (or a library exporting the same versioned
    /// symbols with the same prototypes): opening it runs its initialisers, and the table's
    /// function-pointer types are trusted to match what it exports. Nothing created through
    /// the table (contexts, PDs, ...) may be used after the table is dropped.
    pub unsafe fn open(path: &str) -> Result<Verbs, LoadError> {
        // SAFETY: forwarded from this function's contract.
        let opened = unsafe { loader::open(path, &LIBIBVERBS)? };
        Verbs::from_opened(opened)
    }
}

/// The process-wide libibverbs table: opens `libibverbs.so.1` on the first call and caches the
/// outcome (success or error) for the life of the process; the library is never unloaded.
///
/// Fails with [`LoadError::LibraryNotFound`] when rdma-core is not installed, e.g.
/// `libibverbs.so.1 not found: install rdma-core's ibverbs-providers/libibverbs1 package ...`.
pub fn verbs() -> Result<&'static Verbs, LoadError> {
    static VERBS: OnceLock<Result<Verbs, LoadError>> = OnceLock::new();
    VERBS
        // SAFETY: `libibverbs.so.1` is rdma-core's libibverbs: its initialisers only set up its
        // own state, and the pinned symbols have the prototypes of the rdma-core 44 headers
        // these bindings were generated from (stable under symbol versioning). The table is
        // stored in a static and never dropped, so objects it creates never outlive it.
        .get_or_init(|| unsafe { Verbs::open(Verbs::SONAME) })
        .as_ref()
        .map_err(Clone::clone)
}
