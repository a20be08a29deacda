//! The librdmacm function table.
//!
//! Symbol choices (from `nm -D /usr/lib/x86_64-linux-gnu/librdmacm.so.1`, rdma-core 44): every
//! function has a single version, `RDMACM_1.0` except `rdma_establish` and `rdma_init_qp_attr`
//! (`RDMACM_1.2`). None is a macro. `rdma_get_local_addr` / `rdma_get_peer_addr` are static
//! inlines in `rdma/rdma_cma.h`, ported in [`crate::inline`].

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::bindings::*;
use crate::loader::{self, fn_table, LibSpec, LoadError};

static LIBRDMACM: LibSpec = LibSpec {
    package: "librdmacm1",
    install: "Debian/Ubuntu: apt-get install librdmacm1 libibverbs1 ibverbs-providers; \
              Fedora/RHEL: dnf install librdmacm",
};

fn_table! {
    /// The exported librdmacm functions, resolved from `librdmacm.so.1` at run time.
    ///
    /// librdmacm itself depends on `libibverbs.so.1`, so loading it also needs libibverbs.
    /// Each field has the exact C prototype (checked at compile time against bindgen's
    /// declaration).
    pub struct Rdmacm {
        /// `struct rdma_event_channel *rdma_create_event_channel(void)`.
        "RDMACM_1.0" fn rdma_create_event_channel() -> *mut rdma_event_channel;
        /// `void rdma_destroy_event_channel(struct rdma_event_channel *channel)`.
        "RDMACM_1.0" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
        /// `int rdma_create_id(struct rdma_event_channel *, struct rdma_cm_id **id, void
        /// *context, enum rdma_port_space ps)`.
        "RDMACM_1.0" fn rdma_create_id(channel: *mut rdma_event_channel, id: *mut *mut rdma_cm_id, context: *mut c_void, ps: rdma_port_space) -> c_int;
        /// `int rdma_destroy_id(struct rdma_cm_id *id)`.
        "RDMACM_1.0" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
        /// `int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct
        /// ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)` (synchronous endpoint).
        "RDMACM_1.0" fn rdma_create_ep(id: *mut *mut rdma_cm_id, res: *mut rdma_addrinfo, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int;
        /// `void rdma_destroy_ep(struct rdma_cm_id *id)`.
        "RDMACM_1.0" fn rdma_destroy_ep(id: *mut rdma_cm_id);
        /// `int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)`.
        "RDMACM_1.0" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
        /// `int rdma_resolve_addr(struct rdma_cm_id *, struct sockaddr *src_addr, struct
        /// sockaddr *dst_addr, int timeout_ms)`.
        "RDMACM_1.0" fn rdma_resolve_addr(id: *mut rdma_cm_id, src_addr: *mut sockaddr, dst_addr: *mut sockaddr, timeout_ms: c_int) -> c_int;
        /// `int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)`.
        "RDMACM_1.0" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
        /// `int rdma_create_qp(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *)`.
        "RDMACM_1.0" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> c_int;
        /// `void rdma_destroy_qp(struct rdma_cm_id *id)`.
        "RDMACM_1.0" fn rdma_destroy_qp(id: *mut rdma_cm_id);
        /// `int rdma_init_qp_attr(struct rdma_cm_id *, struct ibv_qp_attr *, int
        /// *qp_attr_mask)`: the attributes for moving a QP the caller created itself.
        "RDMACM_1.2" fn rdma_init_qp_attr(id: *mut rdma_cm_id, qp_attr: *mut ibv_qp_attr, qp_attr_mask: *mut c_int) -> c_int;
        /// `int rdma_connect(struct rdma_cm_id *, struct rdma_conn_param *)`; the private data
        /// travels in `conn_param`.
        "RDMACM_1.0" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
        /// `int rdma_establish(struct rdma_cm_id *id)`: completes a connection whose QP the
        /// caller manages.
        "RDMACM_1.2" fn rdma_establish(id: *mut rdma_cm_id) -> c_int;
        /// `int rdma_listen(struct rdma_cm_id *id, int backlog)`.
        "RDMACM_1.0" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
        /// `int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)`.
        "RDMACM_1.0" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int;
        /// `int rdma_accept(struct rdma_cm_id *, struct rdma_conn_param *)`.
        "RDMACM_1.0" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
        /// `int rdma_reject(struct rdma_cm_id *, const void *private_data, uint8_t
        /// private_data_len)`.
        "RDMACM_1.0" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int;
        /// `int rdma_disconnect(struct rdma_cm_id *id)`.
        "RDMACM_1.0" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
        /// `int rdma_get_cm_event(struct rdma_event_channel *, struct rdma_cm_event **event)`.
        "RDMACM_1.0" fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
        /// `int rdma_ack_cm_event(struct rdma_cm_event *event)`.
        "RDMACM_1.0" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
        /// `const char *rdma_event_str(enum rdma_cm_event_type event)`.
        "RDMACM_1.0" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char;
        /// `int rdma_set_option(struct rdma_cm_id *, int level, int optname, void *optval,
        /// size_t optlen)`.
        "RDMACM_1.0" fn rdma_set_option(id: *mut rdma_cm_id, level: c_int, optname: c_int, optval: *mut c_void, optlen: usize) -> c_int;
        /// `int rdma_migrate_id(struct rdma_cm_id *, struct rdma_event_channel *)`.
        "RDMACM_1.0" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
        /// `int rdma_getaddrinfo(const char *node, const char *service, const struct
        /// rdma_addrinfo *hints, struct rdma_addrinfo **res)`.
        "RDMACM_1.0" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int;
        /// `void rdma_freeaddrinfo(struct rdma_addrinfo *res)`.
        "RDMACM_1.0" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo);
        /// `struct ibv_context **rdma_get_devices(int *num_devices)`.
        "RDMACM_1.0" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context;
        /// `void rdma_free_devices(struct ibv_context **list)`.
        "RDMACM_1.0" fn rdma_free_devices(list: *mut *mut ibv_context);
        /// `__be16 rdma_get_src_port(struct rdma_cm_id *id)` (big-endian).
        "RDMACM_1.0" fn rdma_get_src_port(id: *mut rdma_cm_id) -> __be16;
        /// `__be16 rdma_get_dst_port(struct rdma_cm_id *id)` (big-endian).
        "RDMACM_1.0" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> __be16;
    }
}

impl Rdmacm {
    /// The library [`rdmacm()`] opens.
    pub const SONAME: &'static str = "librdmacm.so.1";

    /// Opens `path` (normally [`Rdmacm::SONAME`]) and resolves every function, without caching.
    /// Dropping the table unloads the library again; most code wants [`rdmacm()`].
    ///
    /// # Safety
    ///
    /// `path` must name rdma-core's librdmacm (or a library exporting the same versioned
    /// symbols with the same prototypes): opening it runs its initialisers, and the table's
    /// function-pointer types are trusted to match what it exports. Nothing created through
    /// the table may be used after the table is dropped.
    pub unsafe fn open(path: &str) -> Result<Rdmacm, LoadError> {
        // SAFETY: forwarded from this function's contract.
        let opened = unsafe { loader::open(path, &LIBRDMACM)? };
        Rdmacm::from_opened(opened)
    }
}

/// The process-wide librdmacm table: opens `librdmacm.so.1` on the first call and caches the
/// outcome for the life of the process; the library is never unloaded.
///
/// Fails with [`LoadError::LibraryNotFound`] when librdmacm (or the libibverbs it needs) is not
/// installed.
pub fn rdmacm() -> Result<&'static Rdmacm, LoadError> {
    static RDMACM: OnceLock<Result<Rdmacm, LoadError>> = OnceLock::new();
    RDMACM
        // SAFETY: `librdmacm.so.1` is rdma-core's librdmacm: its initialisers only set up its
        // own state, and the pinned symbols have the prototypes of the rdma-core 44 headers
        // these bindings were generated from. The table lives in a static and is never dropped.
        .get_or_init(|| unsafe { Rdmacm::open(Rdmacm::SONAME) })
        .as_ref()
        .map_err(Clone::clone)
}
